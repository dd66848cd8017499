"""record_iteration: the history row, the timeline and, on checkpoint iterations, a
`checkpoint` span (the checkpoint is saved after the row, so no history column holds its time)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from libra_core.config import load_config, write_resolved_config
from libra_core.data.history import HISTORY_SCHEMA, read_history
from libra_core.observability.timeline import Span, read_timeline
from libra_core.pipeline.record import record_iteration
from libra_core.pipeline.run_dir import RunLayout, new_run_dir, read_state


def _run(tmp_path: Path) -> RunLayout:
    overrides = [
        f"experiment.output_dir={tmp_path}",
        "experiment.iterations=3",
        "experiment.checkpoint_every=2",
    ]
    cfg = load_config(None, overrides)
    root = new_run_dir(cfg)
    write_resolved_config(cfg, root)
    layout = RunLayout(root)
    layout.policy.mkdir()
    (layout.policy / "model.safetensors").write_bytes(b"\0" * 1024)
    return layout


def _row(iteration: int) -> dict:
    # zeros where a value is required (nullable columns stay null)
    row = {f.name: None if f.nullable else 0 for f in HISTORY_SCHEMA}
    return row | {"iteration": iteration, "policy_version": iteration, "rollout_instances": 1}


def test_a_checkpoint_iteration_gets_a_checkpoint_span_after_its_stages(tmp_path: Path) -> None:
    layout = _run(tmp_path)
    for iteration in (1, 2, 3):  # a checkpoint at 2 (every 2) and at 3 (the last), none at 1
        now = time.time()
        stages = [Span(iteration, "rollout", now - 2.0, now - 1.0), Span(iteration, "update", now - 1.0, now)]
        record_iteration(str(layout.root), _row(iteration), stages)
    assert [r["iteration"] for r in read_history(layout.root)] == [1, 2, 3]
    by_iteration: dict[int, list[Span]] = {}
    for span in read_timeline(layout.root):
        by_iteration.setdefault(span.iteration, []).append(span)
    assert [s.lane for s in by_iteration[1]] == ["rollout", "update"]
    for iteration in (2, 3):
        (checkpoint,) = [s for s in by_iteration[iteration] if s.lane == "checkpoint"]
        update = next(s for s in by_iteration[iteration] if s.lane == "update")
        assert update.end <= checkpoint.start < checkpoint.end  # it ran after the stages, and took time
        assert layout.checkpoint(iteration).exists()
    assert '"name": "checkpoint"' in (layout.root / "timeline" / "trace.json").read_text()


def test_a_damaged_earlier_span_file_costs_the_trace_not_the_iteration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # trace.json re-reads every span file: a damaged one failed the iteration after its history
    # row, before its state and checkpoint (history said 2 iterations, state.json 1)
    layout = _run(tmp_path)
    now = time.time()
    record_iteration(str(layout.root), _row(1), [Span(1, "rollout", now - 1.0, now)])
    (layout.root / "timeline" / "iteration=1.json").write_text("[{")
    with caplog.at_level(logging.WARNING):
        record_iteration(str(layout.root), _row(2), [Span(2, "rollout", now, now + 1.0)])
    assert [r["iteration"] for r in read_history(layout.root)] == [1, 2]
    assert read_state(layout.root).completed_iterations == 2
    assert layout.checkpoint(2).exists()  # checkpoint_every=2
    assert "iteration=1.json: not a timeline file" in caplog.text
