"""Bookkeeping after each iteration: the history row, the run state, the timeline and, on a
checkpoint iteration, the checkpoint (and its span on the timeline).

Called once per finished iteration by the iteration flow's record task (tasks/record.py), in the
flow's process, after the iteration's stages; a resume relies on the order (the row and the state
are written before the checkpoint that a resume continues from).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libra_core.data.history import append_history
from libra_core.observability.progress import report
from libra_core.observability.timeline import Span, write_perfetto, write_timeline
from libra_core.pipeline.run_dir import RunState, load_run_config, save_checkpoint, write_state

log = logging.getLogger(__name__)


def record_iteration(run_dir: str | Path, row: dict[str, Any], spans: Sequence[Span] = ()) -> None:
    """Record iteration `row["iteration"]`: history row, state, timeline spans, checkpoint."""
    cfg = load_run_config(run_dir)
    append_history(run_dir, row)
    iteration = int(row["iteration"])
    state = RunState(iteration, int(row["policy_version"]), "running")
    write_state(run_dir, state)
    _write_views(run_dir, iteration, spans)
    last = iteration == cfg.experiment.iterations
    if last or iteration % cfg.experiment.checkpoint_every == 0:
        started, t0 = time.time(), time.perf_counter()
        save_checkpoint(run_dir, iteration, state, cfg.experiment.keep_checkpoints)
        if spans:
            # The checkpoint comes after the history row (a resume needs the row), so its time is
            # in no column: it gets a lane of the timeline, written again now that it is known.
            end = started + time.perf_counter() - t0
            _write_views(run_dir, iteration, [*spans, Span(iteration, "checkpoint", started, end)])
    report("iterations", 1, cfg.experiment.iterations)


def _write_views(run_dir: str | Path, iteration: int, spans: Sequence[Span]) -> None:
    """The iteration's span file and the run's trace.json. They are views of the run: a damaged
    span file of an earlier iteration (trace.json re-reads them all) is logged, and the run goes
    on; until 2026-12-06 it failed the iteration after its history row, before its state."""
    if not spans:
        return
    try:
        write_timeline(run_dir, iteration, spans)
        write_perfetto(run_dir)
    except (ValueError, OSError) as err:
        log.warning("timeline of iteration %d not written in full: %s", iteration, err)
