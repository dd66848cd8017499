"""A wall-clock step back during a generation request (an NTP step, a VM resumed) must not give the
request an end before its start: the instance lanes of the timeline refuse such a span, which
failed the whole iteration after its rollout. A request's span is its start on the wall clock plus
its duration on the monotonic one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import libra_core.rollout.agent_loop as agent_loop
from libra_core.config.models import RolloutConfig
from libra_core.envs.base import Problem
from libra_core.observability.timeline import instance_spans
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest
from libra_core.rollout.client import Completion
from libra_core.rollout.router import InstanceRouter
from tests.rollout.test_agent_loop_routing import CharTokenizer, OneToolEnv, RecordingScheduler

WALL0 = 1_767_000_000.0
REQUEST_S = 2.0
STEP_BACK_S = 0.5


class SteppingClock:
    """`time` for the agent loop: each request takes REQUEST_S on the monotonic clock while the wall
    clock is stepped back by STEP_BACK_S."""

    def __init__(self) -> None:
        self.wall, self.mono = WALL0, 100.0

    def time(self) -> float:
        return self.wall

    def perf_counter(self) -> float:
        return self.mono

    def request(self) -> None:
        self.mono += REQUEST_S
        self.wall -= STEP_BACK_S  # REQUEST_S passed, and the clock was set back by more than that


class ClockedEngine:
    """Calls the tool once, then answers; every call moves the clock as `SteppingClock.request`."""

    def __init__(self, clock: SteppingClock) -> None:
        self.clock, self.calls = clock, 0

    async def complete(self, http: Any, prompt_ids: Any, *, max_tokens: int, **_: Any) -> Completion:
        self.clock.request()
        text = "CALL|" if self.calls == 0 else "ANS|"
        self.calls += 1
        ids = [ord(c) for c in text]
        return Completion(ids, [-0.5] * len(ids), "stop")


def test_a_clock_step_back_during_a_request_keeps_its_span_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppingClock()
    monkeypatch.setattr(agent_loop, "time", SimpleNamespace(time=clock.time, perf_counter=clock.perf_counter))
    engine = ClockedEngine(clock)
    loop = AgentLoop(
        OneToolEnv(max_turns=3), CharTokenizer(), [engine], RolloutConfig(), policy_version=0, iteration=0
    )
    (row,) = loop.run(
        [RolloutRequest(Problem("p0", "PROMPT", "2", 1), "g0", 0)], InstanceRouter(RecordingScheduler(), 1, 1)
    )
    assert row["finish_reason"] == "answer" and engine.calls == 2
    assert [end - start for _, start, end in loop.requests_served] == pytest.approx([REQUEST_S, REQUEST_S])
    assert loop.requests_served[0][1] == WALL0
    spans = instance_spans(1, loop.requests_served)  # raised "ends before it starts"
    assert all(s.end > s.start for s in spans)
