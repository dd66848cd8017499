"""Every registered scheduler honours the Scheduler contract, and the registry behaves."""

from __future__ import annotations

import random

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import (
    FinishedTrajectory,
    Move,
    SchedRequest,
    Scheduler,
    ToolReturn,
    Turn,
    bucket_of,
)
from libra_core.scheduling.registry import build_scheduler, register_scheduler, scheduler_names
from libra_core.traces.evaluate import quantile_buckets, replay
from libra_core.traces.schema import TraceTrajectory
from libra_core.traces.synthetic import SyntheticTraceConfig, synthetic_trajectories


class RecordingScheduler:
    """Wraps a scheduler and checks each answer against the contract as it is given."""

    def __init__(self, inner: Scheduler, num_buckets: int) -> None:
        self.inner, self.num_buckets = inner, num_buckets
        self.bucket: dict[str, int] = {}
        self.finished: set[str] = set()
        self.moves = 0

    def admit(self, request: SchedRequest) -> int:
        assert request.request_id not in self.bucket, "admitted twice"
        bucket = self.inner.admit(request)
        assert isinstance(bucket, int) and 0 <= bucket < self.num_buckets
        self.bucket[request.request_id] = bucket
        return bucket

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        assert request.request_id in self.bucket and request.request_id not in self.finished
        move = self.inner.on_tool_return(request, ret)
        if move is not None:
            assert 0 <= move.bucket < self.num_buckets, f"moved to missing bucket {move.bucket}"
            assert move.bucket != self.bucket[request.request_id], "moved to its own bucket"
            self.bucket[request.request_id] = move.bucket
            self.moves += 1
        return move

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.finished.add(trajectory.request_id)
        self.inner.on_finish(trajectory)

    def on_policy_version(self, version: int) -> None:
        self.inner.on_policy_version(version)


@pytest.fixture(scope="module")
def small_trace() -> list:
    cfg = SyntheticTraceConfig(num_iterations=6, prompts_per_iteration=8, group_size=4, prompt_pool=12)
    return synthetic_trajectories(random.Random(7), cfg)


@pytest.mark.parametrize("name", scheduler_names())
def test_scheduler_places_every_request_and_loses_none(name: str, small_trace: list) -> None:
    bounds = quantile_buckets(small_trace, (0.5, 0.9))
    cfg = SchedulerConfig(type=name, buckets=bounds, min_support=1)
    inner = build_scheduler(cfg, allow_oracle=True)
    rec = RecordingScheduler(inner, cfg.num_buckets)
    metrics = replay(small_trace, rec, bounds, name=name)
    ids = {t.trajectory_id for t in small_trace}
    assert set(rec.bucket) == ids, "every request is placed"
    assert rec.finished == ids, "every request finishes"
    assert inner.in_flight() == 0, "on_finish frees per-request state"  # type: ignore[attr-defined]
    assert metrics.trajectories == len(ids) and metrics.moves == rec.moves
    assert 0.0 <= metrics.class_accuracy <= 1.0 and 0.0 <= metrics.routing_accuracy <= 1.0


@pytest.mark.parametrize("name", scheduler_names())
def test_tool_return_for_unknown_request_fails_loudly(name: str) -> None:
    sched = build_scheduler(SchedulerConfig(type=name), allow_oracle=True)
    req = SchedRequest("never-admitted", "p", 10, 0)
    with pytest.raises(KeyError, match="never-admitted"):
        sched.on_tool_return(req, ToolReturn(0, 5, "calculator", 3, "success", 18))


def test_unknown_type_lists_valid_names() -> None:
    cfg = SchedulerConfig.model_construct(type="nope", buckets=(10,))  # bypasses the Literal check
    with pytest.raises(ValueError, match="unknown scheduler type 'nope'.*cmlfq"):
        build_scheduler(cfg)


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_scheduler("static", lambda cfg: build_scheduler(cfg))


def test_oracle_needs_explicit_permission() -> None:
    with pytest.raises(ValueError, match="trace evaluation only"):
        build_scheduler(SchedulerConfig(type="oracle"))
    assert "oracle" not in scheduler_names(include_oracle=False)


def test_all_config_types_are_registered() -> None:
    from typing import get_args

    from libra_core.config.scheduler import SchedulerType

    assert set(get_args(SchedulerType)) == set(scheduler_names())


def test_bucket_of_uses_upper_bounds_and_an_open_last_bucket() -> None:
    bounds = (2000, 8000)  # three buckets: <=2000, <=8000, >8000
    assert [bucket_of(x, bounds) for x in (1, 2000, 2001, 8000, 8001, 10**9)] == [0, 0, 1, 1, 2, 2]


def test_mlfq_moves_once_tokens_pass_the_bound() -> None:
    sched = build_scheduler(SchedulerConfig(type="mlfq", buckets=(20, 40)))
    req = SchedRequest("r", "p", 10, 0)
    assert sched.admit(req) == 0
    assert sched.on_tool_return(req, ToolReturn(0, 5, "t", 5, "success", 20)) is None  # 20 <= 20
    assert sched.on_tool_return(req, ToolReturn(1, 30, "t", 5, "success", 55)) == Move(2)
    assert sched.on_tool_return(req, ToolReturn(2, 30, "t", 5, "success", 90)) is None  # open bucket


def test_quantile_buckets_cover_both_ends() -> None:
    sizes = [20, 60, 100, 110, 40]
    trace = [
        TraceTrajectory(f"t{k}", "p", 0, 10, (Turn(s - 10, None, 0, None),)) for k, s in enumerate(sizes)
    ]
    assert quantile_buckets(trace, (0.0, 0.5, 1.0)) == (20, 60, 110)  # q=0 is the smallest, not the largest
    with pytest.raises(ValueError, match=r"quantiles must lie in \[0, 1\], got \[1.5\]"):
        quantile_buckets(trace, (0.5, 1.5))


def test_a_name_no_config_can_select_is_refused_at_registration() -> None:
    # A registered name outside SchedulerConfig.type could never be built from a config, and made
    # `trace-eval --scheduler all` fail after replaying the schedulers before it.
    with pytest.raises(ValueError, match=r"'my_plugin' is not a SchedulerConfig.type .*SchedulerType"):
        register_scheduler("my_plugin", lambda cfg: build_scheduler(cfg))
    assert "my_plugin" not in scheduler_names()
