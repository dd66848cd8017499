"""Bookkeeping after each iteration: history row, timeline, run state, checkpoint (and its span)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from prefect import task

from libra_core.data.history import append_history
from libra_core.observability.progress import report
from libra_core.observability.timeline import Span, write_perfetto, write_timeline
from libra_core.pipeline.run_dir import RunState, load_run_config, save_checkpoint, write_state
from tasks.common import TASK_OPTIONS


@task(name="record-iteration", **TASK_OPTIONS)
def record_iteration_task(run_dir: str, row: dict[str, Any], spans: Sequence[Span] = ()) -> None:
    cfg = load_run_config(run_dir)
    append_history(run_dir, row)
    iteration = int(row["iteration"])
    if spans:
        write_timeline(run_dir, iteration, spans)
        write_perfetto(run_dir)
    state = RunState(iteration, int(row["policy_version"]), "running")
    write_state(run_dir, state)
    last = iteration == cfg.experiment.iterations
    if last or iteration % cfg.experiment.checkpoint_every == 0:
        started, t0 = time.time(), time.perf_counter()
        save_checkpoint(run_dir, iteration, state, cfg.experiment.keep_checkpoints)
        if spans:
            # The checkpoint comes after the history row (a resume needs the row), so its time is
            # in no column: it gets a lane of the timeline, written again now that it is known.
            end = started + time.perf_counter() - t0
            write_timeline(run_dir, iteration, [*spans, Span(iteration, "checkpoint", started, end)])
            write_perfetto(run_dir)
    report("iterations", 1, cfg.experiment.iterations)
