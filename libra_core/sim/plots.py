"""PNG plots of a `SimReport` (matplotlib's object API only: no pyplot, no global state).

- `throughput.png`: tokens/s per policy (bars) with the scenario's lower bound as a line;
- `iterations.png`: seconds between consecutive weight versions, per iteration and policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from libra_core.data.atomic import atomic_path
from libra_core.sim.report import PLOT_FILES

if TYPE_CHECKING:
    from libra_core.sim.report import SimReport


def _title(report: SimReport) -> str:
    return f"{report.scenario} on {report.hardware} ({report.model}), {report.iterations} iterations"


def save_png(fig: Figure, path: Path) -> None:
    """Render `fig` as a PNG at `path` (the caller makes the write atomic: `SimReport.write`)."""
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, format="png")


def write_plots(report: SimReport, out_dir: Path) -> list[Path]:
    """Write `throughput.png` and `iterations.png` (`report.PLOT_FILES`) into `out_dir`, each whole
    or not at all; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures(report).items():
        with atomic_path(out_dir / name) as tmp:
            save_png(fig, tmp)
        paths.append(out_dir / name)
    return paths


def figures(report: SimReport) -> dict[str, Figure]:
    """The plots by file name (`report.PLOT_FILES`), drawn, not yet saved."""
    names = [r.policy for r in report.results]

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(names, [r.tokens_per_s for r in report.results], color="tab:blue")
    ax.bar_label(bars, fmt="{:,.0f}", fontsize=8)
    # The makespan's lower bound is a ceiling in tokens/s: no policy's bar passes the line.
    ceiling = "ceiling: tokens / makespan lower bound"
    ax.axhline(report.lower_bound_tokens_per_s, color="tab:red", linestyle="--", label=ceiling)
    ax.set_ylabel("tokens/s")
    ax.set_title(_title(report), fontsize=10)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.legend(loc="upper left", fontsize=8)
    throughput = fig

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for r in report.results:
        # one iteration is one point: a line without a marker drew nothing (until 2026-12-07)
        marker = "o" if len(r.iteration_s) < 2 else None
        ax.plot(range(len(r.iteration_s)), r.iteration_s, label=r.policy, linewidth=1.2, marker=marker)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration makespan (s)")
    ax.set_title(_title(report), fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    return {PLOT_FILES[0]: throughput, PLOT_FILES[1]: fig}
