"""Prefect artifacts of a run: what the UI shows on the iteration and experiment flow-run pages.

Per iteration (on the `iteration-N` flow run): a stage-timing table and a markdown card with the
iteration's Gantt timeline (stages and rollout instances), scheduler metrics and the planner's
decision. Per run (on the experiment flow run): curves, the timing table of every iteration, the
scheduler and planner tables, `report.html` and a link to the run folder. The content comes from
libra_core.observability; this module only publishes it. Publishing never fails a run: an error
here is logged and the run goes on.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from libra_core.data.history import STAGES, read_history
from libra_core.observability.plots import curves_png, gantt_png
from libra_core.observability.report import (
    SCHEDULER_COLUMNS,
    STAGE_TIMING_COLUMNS,
    build_report,
    markdown_table,
    planner_rows,
    scheduler_rows,
    stage_timing_rows,
    stage_timing_summary,
)
from libra_core.observability.timeline import read_timeline
from libra_core.pipeline.run_dir import load_run_config
from tasks.common import TASK_OPTIONS

log = logging.getLogger(__name__)


def _png_markdown(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"![{alt}](data:image/png;base64,{data})"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def artifact_key(name: str, suffix: str) -> str:
    """The key under which runs of experiment `name` version one artifact: `libra-<name>-<suffix>`.

    Prefect keys allow lowercase letters, digits and dashes only. A name that is not already such
    a slug (`arith_grpo`, `Arith.GRPO`) keeps a readable slug plus 8 hex digits of its SHA-256, so
    names that slug alike (`arith-grpo`, `arith_grpo`, `Arith.GRPO`) never share a key, while a name
    that is a slug keeps its plain key."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "run"
    if slug != name:
        slug = f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return f"libra-{slug}-{suffix}"


def _iteration_artifacts(run_dir: str, iteration: int) -> None:
    row = next(r for r in read_history(run_dir) if r["iteration"] == iteration)
    total = row["iteration_s"] or 1.0
    stages = [*STAGES, *(["eval"] if row["eval_s"] is not None else [])]  # no eval ran: no row
    create_table_artifact(
        table=[
            {
                "stage": s,
                "seconds": round(row[f"{s}_s"] or 0.0, 3),
                "share": f"{(row[f'{s}_s'] or 0.0) / total:.0%}",
            }
            for s in stages
        ]
        + [{"stage": "iteration", "seconds": round(row["iteration_s"], 3), "share": "100%"}],
        # async: the rollout ran during the previous iteration's update, so shares can sum past 100%
        description=f"Iteration {iteration}: wall seconds per stage (share of the iteration's wall time; "
        "in the async pipeline the rollout overlapped the previous update, so shares may sum past 100%)",
    )
    parts = [f"### Iteration {iteration}"]
    # another iteration's damaged span file costs that file alone (the timeline is a view)
    spans = [s for s in read_timeline(run_dir, damaged=[]) if s.iteration == iteration]
    if spans:
        png = gantt_png(
            spans, Path(run_dir) / "report" / f"timeline-{iteration:05d}.png", title=f"iteration {iteration}"
        )
        parts.append(_png_markdown(png, f"timeline of iteration {iteration}"))
    parts.append(
        f"reward {row['reward_mean']:.3f} · accuracy {row['accuracy']:.3f} · "
        f"{row['tokens_generated']} tokens generated at {row['rollout_tokens_per_s']:.0f} tok/s · "
        f"policy version {row['policy_version']}"
    )
    parts.append(
        f"**Scheduler**: {row['routing_moves']} moves, {row['routing_migrations']} migrations "
        f"({row['migrated_tokens']} tokens re-prefilled, migration token ratio "
        f"{_fmt(row['migration_token_ratio'])}), {row['rollout_instances']} rollout instance(s), "
        f"class accuracy {_fmt(row['routing_class_accuracy'])}"
    )
    decisions = [d for d in planner_rows(run_dir) if d.get("iteration") == iteration]
    if decisions:
        parts.append("**Planner**\n\n" + markdown_table(decisions, list(decisions[0])))
    create_markdown_artifact(markdown="\n\n".join(parts), description=f"Iteration {iteration} timeline")


def _run_artifacts(run_dir: str) -> None:
    history = read_history(run_dir)
    if not history:
        return
    cfg = load_run_config(run_dir)
    root = Path(run_dir)
    report = build_report(run_dir)
    curves = curves_png(history, root / "report" / "curves.png")
    timing = [*stage_timing_rows(history), {**stage_timing_summary(history), "iteration": "median"}]
    planner = planner_rows(run_dir)
    parts = [
        f"## {cfg.experiment.name}: {len(history)} iteration(s)",
        f"Run folder: `{root}` · report: `{report}` · Perfetto trace: `{root / 'timeline' / 'trace.json'}`",
        _png_markdown(curves, "reward, throughput and stage-time curves"),
        "### Stage timings (s)\n\n" + markdown_table(timing, STAGE_TIMING_COLUMNS),
        "### Scheduler\n\n" + markdown_table(scheduler_rows(history), SCHEDULER_COLUMNS),
        "### Planner decisions\n\n"
        + (
            markdown_table(planner, list(planner[0]))
            if planner
            else "Static plan (planner.type is not libra)."
        ),
    ]
    create_markdown_artifact(
        markdown="\n\n".join(parts),
        key=artifact_key(cfg.experiment.name, "summary"),
        description=f"Run summary of {root.name}",
    )
    create_link_artifact(link=root.as_uri(), link_text=str(root), description="Run folder")


@task(name="iteration-artifacts", **TASK_OPTIONS)
def iteration_artifacts_task(run_dir: str, iteration: int) -> None:
    _publish(_iteration_artifacts, run_dir, iteration)


@task(name="run-artifacts", **TASK_OPTIONS)
def run_artifacts_task(run_dir: str) -> None:
    _publish(_run_artifacts, run_dir)


def _publish(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - artifacts are a view; a broken view must not stop training
        log.exception("could not publish artifacts for %s", args)
