"""The agent loop's report to the scheduler when the weights change during a trajectory: the finished
trajectory carries the policy version of its first generated token (`traces/schema.py`), the one the
trace export writes (`min_version`), not the version of its last turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libra_core.config.models import RolloutConfig
from libra_core.envs.base import Problem
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest
from libra_core.rollout.client import Completion
from libra_core.rollout.router import InstanceRouter
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn
from tests.rollout.builders import CharTokenizer, OneToolEnv


class SyncingEngine:
    """Serves `turns` in order and advances the served version after each call (a weight sync
    between every two turns)."""

    def __init__(self, turns: Sequence[str], first_version: int) -> None:
        self.turns, self.calls, self.version = list(turns), 0, first_version

    async def complete(
        self, http: Any, prompt_ids: Sequence[int], *, max_tokens: int, **_: Any
    ) -> Completion:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        self.version += 1
        ids = [ord(c) for c in text][:max_tokens]
        return Completion(ids, [-0.5] * len(ids), "stop")


class FinishRecorder:
    """A one-bucket scheduler that keeps every finished trajectory (test double)."""

    def __init__(self) -> None:
        self.finished: list[FinishedTrajectory] = []

    def admit(self, request: SchedRequest) -> int:
        return 0

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        return None

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.finished.append(trajectory)

    def on_policy_version(self, version: int) -> None:
        pass


def test_a_trajectory_spanning_weight_syncs_is_finished_with_its_first_version() -> None:
    # Three turns (call, call, answer) served under versions 7, 8 and 9.
    engine = SyncingEngine(["CALL|", "CALL|", "ANS|"], first_version=7)
    sched = FinishRecorder()
    loop = AgentLoop(
        OneToolEnv(max_turns=4),
        CharTokenizer(),
        [engine],
        RolloutConfig(),
        policy_version=lambda: engine.version,
        iteration=3,
    )
    (row,) = loop.run([RolloutRequest(Problem("p0", "PROMPT", "2", 1), "g0", 0)], InstanceRouter(sched, 1, 1))
    assert row["finish_reason"] == "answer" and engine.calls == 3
    assert [s["version"] for s in row["version_spans"]] == [7, 8, 9]
    assert (row["min_version"], row["max_version"]) == (7, 9)
    (done,) = sched.finished
    assert done.policy_version == 7  # the first token's version; the last turn's is 9
    assert done.policy_version == row["min_version"]  # what the trace export records for it
    assert (done.prompt_id, done.iteration, done.prompt_tokens) == ("p0", 3, len("PROMPT"))


def test_a_trajectory_without_generated_tokens_is_finished_with_the_version_served_now() -> None:
    # No span at all (every turn empty): the version the engines serve when it ends.
    engine = SyncingEngine([""], first_version=4)
    sched = FinishRecorder()
    loop = AgentLoop(
        OneToolEnv(max_turns=2),
        CharTokenizer(),
        [engine],
        RolloutConfig(),
        policy_version=lambda: engine.version,
        iteration=0,
    )
    (row,) = loop.run([RolloutRequest(Problem("p0", "PROMPT", "2", 1), "g0", 0)], InstanceRouter(sched, 1, 1))
    assert row["version_spans"] == [] and engine.calls == 1
    (done,) = sched.finished
    assert done.policy_version == 5  # served after the one (empty) call
