"""Static pictures of a run: the stage/instance timeline (Gantt) and the training curves.

Read by the run report (libra_core.observability.report) from the spans in `<run>/timeline/` and
the rows of `history.parquet`. Figures are built on `matplotlib.figure.Figure` and rendered by the
Agg canvas directly, without pyplot: no global backend switch, no figure registry that leaks
memory in a long-lived process, and no display needed. PNGs are kept small (100 dpi).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from libra_core.data.atomic import atomic_path
from libra_core.data.history import STAGES
from libra_core.observability.timeline import INSTANCE_LANE_PREFIX, Span, lane_label, lane_order

DPI = 100
STAGE_COLORS = {
    "plan": "#8c8c8c",
    "pool": "#c7c7c7",
    "rollout": "#1f77b4",
    "reward": "#ff7f0e",
    "update": "#2ca02c",
    "sync": "#9467bd",
    "eval": "#d62728",
    "checkpoint": "#17becf",
}
INSTANCE_COLOR = "#6baed6"  # a lighter rollout blue: instances are the rollout stage's workers
OTHER_COLOR = "#bcbd22"


def lane_color(lane: str) -> str:
    if lane.startswith(INSTANCE_LANE_PREFIX):
        return INSTANCE_COLOR
    return STAGE_COLORS.get(lane, OTHER_COLOR)


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _write(fig: Figure, path: str | Path) -> Path:
    path, png = Path(path), figure_png(fig)
    with atomic_path(path) as tmp:
        tmp.write_bytes(png)
    return path


def gantt_figure(spans: Sequence[Span], *, title: str = "") -> Figure:
    """One row per lane (pipeline order, instances under `rollout`); x is seconds since the first
    span. With several iterations, a dashed line and an `it N` label mark where each one starts."""
    if not spans:
        raise ValueError("gantt: no spans to draw (the run recorded no timeline for these iterations)")
    origin = min(s.start for s in spans)
    lanes = lane_order(s.lane for s in spans)
    row = {lane: i for i, lane in enumerate(lanes)}
    fig = Figure(figsize=(10, 0.45 * len(lanes) + 1.5), layout="constrained")
    ax = fig.subplots()
    for s in spans:
        # Alternate shades per iteration, so back-to-back iterations in one lane stay apart.
        ax.broken_barh(
            [(s.start - origin, s.duration_s)],
            (row[s.lane] - 0.4, 0.8),
            facecolors=lane_color(s.lane),
            edgecolors="white",
            linewidth=0.5,
            alpha=1.0 if s.iteration % 2 == 0 else 0.75,
        )
    starts: dict[int, float] = {}
    for s in spans:
        starts[s.iteration] = min(starts.get(s.iteration, s.start), s.start)
    if len(starts) > 1:
        label_at = ax.get_xaxis_transform()  # x in data units, y in axes units
        for iteration, start in sorted(starts.items()):
            x = start - origin
            if x > 0:
                ax.axvline(x, color="#555555", linewidth=0.6, linestyle="--")
            ax.text(x, 1.0, f" it {iteration}", transform=label_at, fontsize=7, va="bottom", ha="left")
    ax.set_yticks(range(len(lanes)), [lane_label(lane) for lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # first lane on top
    ax.set_xlim(0, max(s.end for s in spans) - origin or 1.0)
    ax.set_xlabel("seconds since the first span")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    if title:
        ax.set_title(title, fontsize=10, loc="left", pad=14 if len(starts) > 1 else 6)
    return fig


def gantt_png(spans: Sequence[Span], path: str | Path, *, title: str = "") -> Path:
    return _write(gantt_figure(spans, title=title), path)


def curves_figure(history: Sequence[dict[str, Any]]) -> Figure:
    """2x2 panels against the iteration: reward and accuracy, eval accuracy, rollout throughput,
    and the stage seconds (eval's too, where it ran) stacked under the iteration's wall time (in the
    async pipeline stages overlap, so the stack can rise above the wall time)."""
    if not history:
        raise ValueError("curves: the history is empty (no iteration recorded yet)")
    its = [int(h["iteration"]) for h in history]
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    (reward_ax, eval_ax), (tps_ax, time_ax) = fig.subplots(2, 2, sharex=True)

    reward_ax.plot(its, [h["reward_mean"] for h in history], marker="o", ms=3, label="reward_mean")
    reward_ax.plot(its, [h["accuracy"] for h in history], marker="o", ms=3, label="accuracy")
    reward_ax.set_title("reward and accuracy (rollouts)", fontsize=10)
    reward_ax.legend(fontsize=7)

    evals = [
        (it, h["eval_accuracy"]) for it, h in zip(its, history, strict=True) if h["eval_accuracy"] is not None
    ]
    if evals:
        eval_ax.plot([e[0] for e in evals], [e[1] for e in evals], marker="o", ms=3, color="#d62728")
    else:
        eval_ax.text(0.5, 0.5, "no evaluation yet", transform=eval_ax.transAxes, ha="center", va="center")
    eval_ax.set_title("eval accuracy (greedy)", fontsize=10)

    tps_ax.plot(its, [h["rollout_tokens_per_s"] for h in history], marker="o", ms=3, color="#1f77b4")
    tps_ax.set_title("rollout tokens/s", fontsize=10)

    bottom = [0.0] * len(history)
    # eval is in iteration_s on the iterations that ran it (and 0 on the others, as its None means)
    evaluated = any(h.get("eval_s") is not None for h in history)
    for stage in (*STAGES, "eval") if evaluated else STAGES:
        values = [float(h[f"{stage}_s"] or 0.0) for h in history]
        time_ax.bar(its, values, bottom=bottom, width=0.8, color=STAGE_COLORS[stage], label=f"{stage}_s")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    time_ax.plot(
        its, [h["iteration_s"] for h in history], marker="o", ms=3, color="black", label="iteration_s"
    )
    time_ax.set_title("seconds per iteration", fontsize=10)
    time_ax.legend(fontsize=7, ncols=2)

    for ax in (reward_ax, eval_ax, tps_ax, time_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(linewidth=0.3, alpha=0.5)
    for ax in (tps_ax, time_ax):
        ax.set_xlabel("iteration")
    return fig


def curves_png(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    return _write(curves_figure(history), path)
