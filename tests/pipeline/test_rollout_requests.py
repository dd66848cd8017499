"""The rollout stage's per-request spans go to a file in the run folder, not into its result: the
result is a flow-run parameter of the next iteration in the async pipeline, which Prefect stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder

import libra_core.pipeline.rollout_stage as rollout_stage
from libra_core.config import load_config, write_resolved_config
from libra_core.observability.request_spans import read_request_spans
from libra_core.pipeline.rollout_stage import RolloutResult, run_rollout
from libra_core.pipeline.run_dir import RunLayout
from libra_core.rollout.router import RoutingStats
from tests.observability.test_request_spans import served_requests
from tests.support import TEST_OVERRIDES

NUM_REQUESTS = 5000


def rollout_with_served(
    monkeypatch: pytest.MonkeyPatch, run_dir: Path, iteration: int, served: list[tuple[str, float, float]]
) -> RolloutResult:
    """`run_rollout` of a run folder, with the agent loop replaced by one that generated nothing
    and served `served` (the engines are not what is under test)."""
    if not RunLayout(run_dir).config.exists():
        write_resolved_config(load_config(None, TEST_OVERRIDES), run_dir)

    def loop(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], RoutingStats, list[Any], object]:
        return [], RoutingStats(0, 0, 0, 0, (0, 0, 0)), list(served), object()

    monkeypatch.setattr(rollout_stage, "_run_loop", loop)
    return run_rollout(str(run_dir), ("u0", "u1", "u2"), ("i0", "i1", "i2"), iteration=iteration, version=0)


def test_the_rollout_result_stays_small_and_the_spans_go_to_the_run_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served = served_requests(NUM_REQUESTS)
    result = rollout_with_served(monkeypatch, tmp_path, 7, served)
    # What Prefect stores of a flow-run parameter (Flow.serialize_parameters): before, ~0.3 MB here
    stored = json.dumps(jsonable_encoder(result))
    assert len(stored) < 1000, f"the rollout result serialises to {len(stored)} bytes"
    assert result.requests_path == str(RunLayout(tmp_path).rollout_requests(7))
    assert read_request_spans(result.requests_path) == served


def test_a_rerun_rollout_replaces_the_spans_of_its_attempt_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a retried rollout task, or a resumed run redoing the iteration
    rollout_with_served(monkeypatch, tmp_path, 2, served_requests(30, seed=1))
    again = served_requests(10, seed=2)
    result = rollout_with_served(monkeypatch, tmp_path, 2, again)
    assert read_request_spans(result.requests_path) == again


def test_the_greedy_evaluation_records_its_requests_for_the_instance_lanes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The evaluation's spans were dropped: during every `eval` span the instance lanes showed a
    gap, read as idle engine time, though the engines were serving it."""
    from libra_core.observability.timeline import rollout_instance_spans
    from libra_core.pipeline.rollout_stage import run_greedy_eval

    write_resolved_config(load_config(None, TEST_OVERRIDES), tmp_path)
    served = [("i0", 100.0, 103.0), ("i1", 100.5, 101.0)]

    def loop(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], RoutingStats, list[Any], object]:
        assert kwargs["greedy"] and kwargs["stage"] == "eval"
        return [], RoutingStats(0, 0, 0, 0, (0, 0, 0)), list(served), object()

    monkeypatch.setattr(rollout_stage, "_run_loop", loop)
    run_greedy_eval(str(tmp_path), ("u0", "u1"), ("i0", "i1"), iteration=4, version=3)
    path = RunLayout(tmp_path).eval_requests(4)
    assert read_request_spans(path) == served
    lanes = {(s.lane, s.start, s.end) for s in rollout_instance_spans(4, path)}
    assert lanes == {("instance/i0", 100.0, 103.0), ("instance/i1", 100.5, 101.0)}
    assert not RunLayout(tmp_path).rollout_requests(4).exists()  # the rollout's own file is apart
