"""The async iteration's bookkeeping, with the stage tasks replaced by fakes (the flow logic under
test is which pool a rollout ran on and what happens when the update fails while the next rollout
runs; the real stages have their own tests and the slow vLLM flow tests)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from prefect import get_client

import flows.rl_iteration as ri
from libra_core.observability.timeline import INSTANCE_LANE_PREFIX, Span, instance_spans
from libra_core.pipeline.plan_stage import Plan
from libra_core.pipeline.reward_stage import RewardResult
from libra_core.pipeline.rollout_stage import RolloutResult
from libra_core.pipeline.update_stage import UpdateStageResult
from libra_core.pools.rollout import PoolInfo
from libra_core.rollout.router import RoutingStats
from libra_core.training.selection import SelectionStats
from libra_core.training.update import UpdateResult
from tests.observability.test_request_spans import served_requests
from tests.pipeline.test_rollout_requests import NUM_REQUESTS, rollout_with_served

PLANNED = {1: 1, 2: 2, 3: 2}  # the planner grows the pool at iteration 2


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def _fake_stages(
    monkeypatch: pytest.MonkeyPatch,
    *,
    update_fails_at: int | None = None,
    update_raises: type[BaseException] = RuntimeError,
) -> dict[str, Any]:
    seen: dict[str, Any] = {"ran_on": {}, "rows": [], "spans": [], "stopped": 0, "order": []}
    cfg = types.SimpleNamespace(
        experiment=types.SimpleNamespace(iterations=3, artifacts_every=0),
        pipeline=types.SimpleNamespace(mode="async"),
        eval=types.SimpleNamespace(every=0),
    )

    def rollout(run_dir: str, pool: PoolInfo, iteration: int) -> RolloutResult:
        seen["ran_on"][iteration] = len(pool.urls)
        return RolloutResult("r", 8, 100, 10.0, 0.0, 10.0, 1.0, RoutingStats(0, 0, 0, 0, ()), len(pool.urls))

    rollout_task: Any = rollout
    rollout_task.submit = lambda *a: _Done(rollout(*a))

    def update(run_dir: str, path: str, iteration: int, version: int) -> UpdateStageResult:
        if iteration == update_fails_at:
            raise update_raises("the trainer died")
        result = UpdateResult(
            0.0, 0.0, 1, 1, 1, 0.0, 1.0, 0.0, None, 0.0, 0.5, 0.1, 0.5, version + 1, 1.0, 0.1
        )
        return UpdateStageResult(result, SelectionStats(0, 0, 0, 0, 0, 0.5, 0.5, 10.0, 10.0, 10.0, 10.0))

    def pool(run_dir: str, size: int, version: int) -> PoolInfo:
        return PoolInfo("p", tuple(f"u{i}" for i in range(size)), tuple(f"i{i}" for i in range(size)), 0.0)

    def stop(run_dir: str) -> None:
        seen["stopped"] += 1
        seen["order"].append("stop engines")

    def finish(run_dir: str, status: str) -> None:
        seen["order"].append(f"state {status}")

    monkeypatch.setattr(ri, "load_run_config", lambda run_dir: cfg)
    monkeypatch.setattr(ri, "plan_task", lambda run_dir, it: Plan(it, PLANNED[it], 1, "libra"))
    monkeypatch.setattr(ri, "rollout_pool_task", pool)
    monkeypatch.setattr(ri, "rollout_task", rollout_task)
    monkeypatch.setattr(ri, "reward_task", lambda run_dir, path, it: RewardResult("r", "l", 0.5, 0.5, 0.5))
    monkeypatch.setattr(ri, "update_task", update)
    monkeypatch.setattr(ri, "sync_task", lambda *a: None)
    monkeypatch.setattr(ri, "stop_pool_task", types.SimpleNamespace(fn=stop))
    monkeypatch.setattr(ri, "finish_run_task", types.SimpleNamespace(fn=finish))

    def record(run_dir: str, row: dict[str, Any], spans: list[Span]) -> None:
        seen["rows"].append(row)
        seen["spans"].append(spans)

    monkeypatch.setattr(ri, "record_iteration_task", record)
    return seen


def test_the_history_records_the_pool_each_rollout_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_stages(monkeypatch)
    version, next_rollout = 0, None
    for it in (1, 2, 3):
        out = ri.rl_iteration.fn("run", it, version, next_rollout)
        version, next_rollout = out["row"]["policy_version"], out["next_rollout"]
    # rollout 2 was submitted during iteration 1, on iteration 1's one-instance pool
    assert seen["ran_on"] == {1: 1, 2: 1, 3: 2}
    assert [r["rollout_instances"] for r in seen["rows"]] == [1, 1, 2]


def test_a_failed_update_stops_the_engines_of_the_overlapped_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_stages(monkeypatch, update_fails_at=1)
    with pytest.raises(RuntimeError, match="the trainer died"):
        ri.rl_iteration.fn("run", 1, 0, None)
    assert seen["stopped"] == 1 and 2 in seen["ran_on"]  # rollout 2 had been submitted


def test_a_cancel_during_the_update_writes_the_state_before_stopping_the_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prefect's runner kills the process 30 s after its SIGTERM, and stopping engines can take much
    of that: the state goes first, as in the experiment flow's clean-up (before 2026-12-06 the
    async iteration stopped the engines first and the experiment wrote the state afterwards)."""
    seen = _fake_stages(monkeypatch, update_fails_at=1, update_raises=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        ri.rl_iteration.fn("run", 1, 0, None)
    assert seen["order"] == ["state cancelled", "stop engines"]
    # a failure (not a cancel) leaves the state to the experiment flow, which records `failed`
    seen = _fake_stages(monkeypatch, update_fails_at=1)
    with pytest.raises(RuntimeError):
        ri.rl_iteration.fn("run", 1, 0, None)
    assert seen["order"] == ["stop engines"]


def _instance_spans(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.lane.startswith(INSTANCE_LANE_PREFIX)]


def test_the_flow_run_stores_no_per_request_entries_and_its_timeline_reads_them_back(
    prefect_quiet: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The overlapped rollout is a parameter of the next iteration's flow run, which Prefect stores
    in its database: before 2026-12 it carried one (instance, start, end) entry per generation
    request (~0.5 MB at 20k requests, every iteration)."""
    seen = _fake_stages(monkeypatch)
    served = served_requests(NUM_REQUESTS)
    rollout = rollout_with_served(monkeypatch, tmp_path, 3, served)
    state = ri.rl_iteration(str(tmp_path), 3, 2, rollout, return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).parameters
    assert stored["iteration"] == 3 and stored["rollout"]["num_trajectories"] == 0
    size = len(json.dumps(stored))
    assert size < 2000, f"the flow run's parameters take {size} bytes"
    # the timeline has the spans the rollout recorded, as when they travelled in the result
    (spans,) = seen["spans"]
    assert _instance_spans(spans) == instance_spans(3, served) != []
    assert [s.lane for s in spans[:3]] == ["plan", "pool", "rollout"]  # instance lanes right after rollout


def test_a_rollout_whose_spans_file_is_missing_gives_no_instance_spans(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run folder from before rollouts wrote the file (or a result that recorded none): the
    iteration runs and records its stage spans, without instance lanes."""
    seen = _fake_stages(monkeypatch)
    for requests_path in (str(tmp_path / "stages" / "iteration=00002" / "requests.arrow"), None):
        rollout = RolloutResult(
            "r", 8, 100, 10.0, 0.0, 10.0, 1.0, RoutingStats(0, 0, 0, 0, ()), 1, 5.0, requests_path
        )
        ri.rl_iteration.fn(str(tmp_path), 2, 1, rollout)
    assert [_instance_spans(spans) for spans in seen["spans"]] == [[], []]
    assert [[s.lane for s in spans] for spans in seen["spans"]] == [
        ["plan", "pool", "rollout", "reward", "update", "sync"]
    ] * 2
