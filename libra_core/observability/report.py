"""Run report: one self-contained HTML (or Markdown) page that says how a run went and where its
time went, built from a run folder after (or during) the run; `libra report RUN_DIR` calls it.

Sources: `config.resolved.yaml` (name, planner), `state.json` (status, policy version),
`history.parquet` (timings, rewards, routing), `timeline/iteration=N.json` (Gantt charts),
`planner/decisions.jsonl` (replanning decisions, planner.type libra only). Sections: summary,
timeline (last iteration, and the whole run up to 20 iterations else its last 5), curves, stage
timings (every iteration plus a median row), scheduler, planner decisions, Perfetto trace path.

Machine-readable values in the HTML, for tests and scrapers:
  - every table is `<table data-table="NAME">` with NAME in `summary`, `stage_timing`,
    `scheduler`, `planner`;
  - every value cell is `<td data-col="COLUMN" data-iteration="N" data-value="V">TEXT</td>`: COLUMN
    is the history / decision field, N the row's iteration (`median` in the stage-timing median
    row), V the exact value (`repr` of a float, `str` otherwise; empty for None) and TEXT the
    displayed value (floats with 3 decimals, None as `-`);
  - summary cells are `<td data-key="KEY" data-value="V">TEXT</td>` with the same V and TEXT rules;
  - figures are `<img data-figure="timeline_last|timeline_run|curves" src="data:image/png;base64,...">`.
The Markdown report holds the same sections and writes its PNGs next to it (`<stem>_<figure>.png`).
"""

from __future__ import annotations

import base64
import html
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libra_core.data.atomic import atomic_path
from libra_core.data.history import STAGES, read_history
from libra_core.observability.timeline import Span, read_timeline, timeline_dir
from libra_core.pipeline.plan_stage import read_decisions
from libra_core.pipeline.run_dir import load_run_config, read_state

FORMATS = ("html", "md")
STAGE_TIMING_COLUMNS = ("iteration", *(f"{s}_s" for s in STAGES), "eval_s", "iteration_s")
SCHEDULER_COLUMNS = (
    "iteration",
    "routing_moves",
    "routing_migrations",
    "migrated_tokens",
    "migration_token_ratio",
    "routing_class_accuracy",
    "rollout_instances",
)
PLANNER_COLUMNS = (
    "iteration",
    "action",
    "current_t_iter_s",
    "proposed_t_iter_s",
    "saving_per_iter_s",
    "move_cost_s",
    "amortised_gain_s",
    "current_split",
    "proposed_split",
    "reason",
)
FIGURES = ("timeline_last", "timeline_run", "curves")  # keys of a report's figures, in order
FULL_RUN_TIMELINE_MAX_ITERATIONS = 20  # above this the run's Gantt shows only the last few
RECENT_ITERATIONS = 5
FLOAT_FORMAT = "{:.3f}"


def stage_timing_rows(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per iteration: the stage seconds, eval seconds (None when no eval ran) and wall time."""
    return [{col: h[col] for col in STAGE_TIMING_COLUMNS} for h in history]


def stage_timing_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median of each timing column over the iterations that have a value (`iteration`: "median";
    a column with no value at all, e.g. eval_s in a run without eval, is None). NaN is no value:
    `statistics.median` does not order it, so the median shown depended on where a NaN stood."""
    summary: dict[str, Any] = {"iteration": "median"}
    for col in STAGE_TIMING_COLUMNS[1:]:
        summary[col] = _median([h[col] for h in history])
    return summary


def _median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are numbers (not None, not NaN); None when there are none."""
    known = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(known) if known else None


def scheduler_rows(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per iteration: what the rollout router moved and how many instances served the rollout."""
    return [{col: h[col] for col in SCHEDULER_COLUMNS} for h in history]


def planner_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The planner's decisions in file order; empty when the run has none (static plan). A torn
    last line (a run killed while logging) is skipped, as the plan stage does: a killed run is
    when a report is wanted most."""
    return read_decisions(run_dir)


def _cell_text(value: Any, floats: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return floats.format(value)
    return str(value)


def _cell_value(value: Any) -> str:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], *, floats: str = FLOAT_FORMAT
) -> str:
    """GitHub-flavoured Markdown table; None (or a missing column) renders as `-`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        # one line per row: a line break (a planner reason, a name) would end the table there
        cells = (" ".join(_cell_text(row.get(col), floats).split()).replace("|", "\\|") for col in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass
class _Report:
    """Everything both renderers show, gathered once."""

    title: str
    summary: list[tuple[str, str, Any]]  # (key, label, value)
    timing: list[dict[str, Any]]
    timing_median: dict[str, Any]
    scheduler: list[dict[str, Any]]
    planner: list[dict[str, Any]]
    planner_type: str
    figures: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> (caption, PNG)
    timeline_note: str = ""
    trace: Path | None = None


def _summary(run_dir: Path, history: Sequence[dict[str, Any]]) -> tuple[str, str, list[tuple[str, str, Any]]]:
    cfg = load_run_config(run_dir)
    state = read_state(run_dir)
    walls = [h["iteration_s"] for h in history]
    evals = [h for h in history if h["eval_accuracy"] is not None]
    items: list[tuple[str, str, Any]] = [
        ("name", "experiment", cfg.experiment.name),
        ("status", "status", state.status),
        ("iterations_done", "iterations done", state.completed_iterations),
        ("iterations_planned", "iterations planned", cfg.experiment.iterations),
        ("policy_version", "policy version", state.policy_version),
        ("planner", "planner", cfg.planner.type),
        # over the same values as the median: a NaN (a foreign or hand-edited history) read "nan"
        ("total_iteration_s", "total iteration time (s)", sum(w for w in walls if not math.isnan(w))),
        ("median_iteration_s", "median iteration time (s)", _median(walls)),
        ("first_reward_mean", f"reward_mean, iteration {history[0]['iteration']}", history[0]["reward_mean"]),
        (
            "last_reward_mean",
            f"reward_mean, iteration {history[-1]['iteration']}",
            history[-1]["reward_mean"],
        ),
        (
            "last_eval_accuracy",
            f"eval accuracy, iteration {evals[-1]['iteration']}" if evals else "eval accuracy",
            evals[-1]["eval_accuracy"] if evals else None,
        ),
    ]
    if len(history) == 1:  # the first iteration is the last: one row (it printed two, until 2026-12-07)
        items = [item for item in items if item[0] != "last_reward_mean"]
    return cfg.experiment.name, cfg.planner.type, items


def _timeline_figures(run_dir: Path) -> tuple[dict[str, tuple[str, bytes]], str]:
    from libra_core.observability.plots import figure_png, gantt_figure

    damaged: list[str] = []
    spans = read_timeline(run_dir, damaged)
    skipped = f" Left out, damaged: {'; '.join(damaged)}." if damaged else ""
    if not spans:
        return {}, f"No timeline was recorded for this run ({timeline_dir(run_dir)} has no spans).{skipped}"
    iterations = sorted({s.iteration for s in spans})
    last = iterations[-1]
    figures = {
        "timeline_last": (
            f"Timeline of iteration {last}",
            figure_png(gantt_figure([s for s in spans if s.iteration == last], title=f"iteration {last}")),
        )
    }
    if len(iterations) > 1:
        shown = (
            iterations
            if len(iterations) <= FULL_RUN_TIMELINE_MAX_ITERATIONS
            else iterations[-RECENT_ITERATIONS:]
        )
        chosen: list[Span] = [s for s in spans if s.iteration in set(shown)]
        what = "the whole run" if shown == iterations else f"the last {len(shown)} iterations"
        label = f"Timeline of {what} (iterations {shown[0]}-{shown[-1]})"
        figures["timeline_run"] = (label, figure_png(gantt_figure(chosen, title=label)))
    return figures, skipped.strip()


def _gather(run_dir: Path) -> _Report:
    from libra_core.observability.plots import curves_figure, figure_png

    history = read_history(run_dir)
    if not history:
        raise ValueError(f"{run_dir} has no iterations recorded yet (no rows in history.parquet)")
    name, planner_type, summary = _summary(run_dir, history)
    figures, timeline_note = _timeline_figures(run_dir)
    figures["curves"] = ("Training curves", figure_png(curves_figure(history)))
    trace = timeline_dir(run_dir) / "trace.json"
    return _Report(
        title=f"Libra run report: {name}",
        summary=summary,
        timing=stage_timing_rows(history),
        timing_median=stage_timing_summary(history),
        scheduler=scheduler_rows(history),
        planner=planner_rows(run_dir),
        planner_type=planner_type,
        figures=figures,
        timeline_note=timeline_note,
        trace=trace if trace.is_file() else None,
    )


def _static_plan_note(report: _Report) -> str:
    if report.planner_type == "static":
        return "The run used a static plan (planner.type: static): pool sizes came from `stages`."
    return f"The planner ({report.planner_type}) recorded no decisions."


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text, th.key { text-align: left; }
tr.median td { font-weight: bold; background: #fafafa; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
figcaption { color: #666; font-size: 0.9em; } code { background: #f4f4f4; padding: 1px 4px; }
"""


def _td(value: Any, attrs: dict[str, str]) -> str:
    cls = "" if value is None or isinstance(value, int | float) else ' class="text"'
    data = "".join(f' data-{k}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
    value_attr = html.escape(_cell_value(value), quote=True)
    return f'<td{cls}{data} data-value="{value_attr}">{html.escape(_cell_text(value, FLOAT_FORMAT))}</td>'


def _html_row(row: dict[str, Any], columns: Sequence[str], cls: str = "") -> str:
    it = str(row.get("iteration"))
    cells = "".join(_td(row.get(col), {"col": col, "iteration": it}) for col in columns)
    return f'<tr{cls} data-iteration="{html.escape(it, quote=True)}">{cells}</tr>'


def _html_table(
    name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], median: dict[str, Any] | None = None
) -> str:
    head = "".join(f"<th>{html.escape(col)}</th>" for col in columns)
    body = [_html_row(row, columns) for row in rows]
    if median is not None:
        body.append(_html_row(median, columns, ' class="median"'))
    return f'<table data-table="{name}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _html_figure(key: str, caption: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img data-figure="{key}" alt="{html.escape(caption, quote=True)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def _render_html(report: _Report) -> str:
    esc = html.escape
    summary_rows = "".join(
        f'<tr><th class="key">{esc(label)}</th>{_td(value, {"key": key})}</tr>'
        for key, label, value in report.summary
    )
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(report.title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>{esc(report.title)}</h1>",
        f'<h2>Summary</h2><table data-table="summary"><tbody>{summary_rows}</tbody></table>',
        "<h2>Timeline</h2>",
    ]
    timelines = [k for k in ("timeline_last", "timeline_run") if k in report.figures]
    parts += [_html_figure(k, *report.figures[k]) for k in timelines]
    if report.timeline_note:  # no spans, or span files left out as damaged
        parts.append(f'<p data-note="timeline">{esc(report.timeline_note)}</p>')
    if report.trace is not None:
        parts.append(
            f"<p>Perfetto trace: <code>{esc(str(report.trace))}</code> (open in ui.perfetto.dev)</p>"
        )
    parts += [
        "<h2>Curves</h2>",
        _html_figure("curves", *report.figures["curves"]),
        "<h2>Stage timings (seconds)</h2>",
        _html_table("stage_timing", report.timing, STAGE_TIMING_COLUMNS, report.timing_median),
        "<h2>Scheduler</h2>",
        _html_table("scheduler", report.scheduler, SCHEDULER_COLUMNS),
        "<h2>Planner decisions</h2>",
        _html_table("planner", report.planner, PLANNER_COLUMNS)
        if report.planner
        else f"<p>{esc(_static_plan_note(report))}</p>",
        "</body></html>\n",
    ]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _render_md(report: _Report, images: dict[str, str]) -> str:
    summary = [{"item": label, "value": value} for _, label, value in report.summary]
    parts = [f"# {report.title}", "## Summary", markdown_table(summary, ("item", "value")), "## Timeline"]
    timelines = [k for k in ("timeline_last", "timeline_run") if k in report.figures]
    links = [f"![{report.figures[k][0]}]({_md_link(images[k])})" for k in timelines]
    parts += links + ([report.timeline_note] if report.timeline_note else [])
    if report.trace is not None:
        parts.append(f"Perfetto trace: {_md_code(str(report.trace))} (open in ui.perfetto.dev)")
    parts += [
        "## Curves",
        f"![{report.figures['curves'][0]}]({_md_link(images['curves'])})",
        "## Stage timings (seconds)",
        markdown_table([*report.timing, report.timing_median], STAGE_TIMING_COLUMNS),
        "## Scheduler",
        markdown_table(report.scheduler, SCHEDULER_COLUMNS),
        "## Planner decisions",
        markdown_table(report.planner, PLANNER_COLUMNS) if report.planner else _static_plan_note(report),
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def _md_link(target: str) -> str:
    """A link destination that is `target` exactly (CommonMark): in `<...>` a space does not end it,
    and `<`, `>` and `\\` in it are backslash-escaped (a `>` would end it early)."""
    return "<" + re.sub(r"([<>\\])", r"\\\1", target) + ">"


def _md_code(text: str) -> str:
    """A code span showing `text` exactly (CommonMark): fenced by one more backtick than the longest
    run of them in it, padded with a space where it starts or ends with one."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _write_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def build_report(run_dir: str | Path, out: str | Path | None = None, fmt: str = "html") -> Path:
    """Write the report of `run_dir` (default `<run_dir>/report.<fmt>`) and return its path.

    Raises FileNotFoundError when `run_dir` is not a run folder, ValueError on an unknown format,
    a run with no history rows, or a malformed planner decisions file.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; valid: {list(FORMATS)}")
    run_dir = Path(run_dir)
    report = _gather(run_dir)
    path = Path(out) if out is not None else run_dir / f"report.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        _write_atomic(path, _render_html(report).encode("utf-8"))
        return path
    images: dict[str, str] = {}
    for key, (_, png) in report.figures.items():
        images[key] = markdown_figure_path(path, key).name
        _write_atomic(path.with_name(images[key]), png)
    _write_atomic(path, _render_md(report, images).encode("utf-8"))
    return path


def markdown_figure_path(report_path: Path, key: str) -> Path:
    """Where the Markdown report at `report_path` writes figure `key` (one of FIGURES)."""
    assert key in FIGURES, f"unknown report figure {key!r}"
    return report_path.with_name(f"{report_path.stem}_{key}.png")
