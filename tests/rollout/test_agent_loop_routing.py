"""The agent loop's routing bookkeeping: which tool returns the scheduler is asked about.

A scripted engine (one turn text per call) and a one-tool environment stand in for vLLM and a real
tool, so the number of generation requests each instance serves is known exactly; the agent loop,
router and MLFQ scheduler are the real ones (the vLLM-backed loop is tested in test_vllm_agent_loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from libra_core.config.models import RolloutConfig, SchedulerConfig
from libra_core.envs.base import Problem
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest
from libra_core.rollout.client import Completion
from libra_core.rollout.router import InstanceRouter
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.registry import build_scheduler
from tests.rollout.builders import CharTokenizer, OneToolEnv


class ScriptedEngine:
    """Answers the n-th call with turns[n] (the last one repeats); records each call's prompt length."""

    def __init__(self, turns: Sequence[str]) -> None:
        self.turns, self.calls = list(turns), 0

    async def complete(
        self, http: Any, prompt_ids: Sequence[int], *, max_tokens: int, **_: Any
    ) -> Completion:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = [ord(c) for c in text][:max_tokens]
        return Completion(ids, [-0.5] * len(ids), "stop" if len(ids) == len(text) else "length")


def _run(
    env: OneToolEnv, second_turns: Sequence[str], cfg: RolloutConfig
) -> tuple[dict, list[ScriptedEngine], Any]:
    # MLFQ with one bound at 8 tokens demotes every request whose context passes 8 at a tool return.
    sched_cfg = SchedulerConfig(type="mlfq", buckets=(8,))
    router = InstanceRouter(build_scheduler(sched_cfg), sched_cfg.num_buckets, 2, sched_cfg.buckets)
    # The short bucket's instance always calls the tool; the long bucket's serves `second_turns`.
    engines = [ScriptedEngine(["CALL|"]), ScriptedEngine(second_turns)]
    loop = AgentLoop(env, CharTokenizer(), engines, cfg, policy_version=0, iteration=0)
    (row,) = loop.run([RolloutRequest(Problem("p0", "PROMPT", "2", 1), "g0", 0)], router)
    return row, engines, router.stats()


@pytest.mark.parametrize(
    ("env", "cfg", "finish"),
    [
        (OneToolEnv(max_turns=1), RolloutConfig(), "max_turns"),  # the return at the last turn
        (OneToolEnv(max_turns=8, payload=100), RolloutConfig(max_total_tokens=16), "max_tokens"),  # no budget
    ],
)
def test_a_return_that_ends_the_trajectory_is_no_migration(
    env: OneToolEnv, cfg: RolloutConfig, finish: str
) -> None:
    row, engines, stats = _run(env, ["CALL|"], cfg)
    assert row["finish_reason"] == finish
    assert [e.calls for e in engines] == [1, 0]  # nothing ever ran on the second instance
    assert (stats.moves, stats.migrations, stats.migrated_tokens) == (0, 0, 0)
    assert stats.decisions == 1  # the admission only
    assert stats.tokens_by_instance == (5, 0)  # the turn's tokens are still counted


def test_a_return_with_a_turn_after_it_still_migrates() -> None:
    row, engines, stats = _run(OneToolEnv(max_turns=3), ["ANS|"], RolloutConfig())
    assert row["finish_reason"] == "answer"
    assert [e.calls for e in engines] == [1, 1]  # the answer turn ran on the long bucket's instance
    assert (stats.moves, stats.migrations) == (1, 1)
    assert stats.migrated_tokens == len("PROMPT") + len("CALL|")  # the context before the payload


class RecordingScheduler:
    """Keeps every finished trajectory's turns; never moves anything (test double)."""

    def __init__(self) -> None:
        self.finished: list[tuple[Turn, ...]] = []

    def admit(self, request: SchedRequest) -> int:
        return 0

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        return None

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.finished.append(tuple(trajectory.turns))

    def on_policy_version(self, version: int) -> None:
        pass


def test_a_trajectory_ending_on_a_tool_return_is_learnt_as_the_export_writes_it() -> None:
    # The prefix tree records a sample after every tool return but the last turn's; a trajectory
    # that hit max_turns right after a return is closed with a 0-token turn (as the trace export
    # writes it), so the live tree learns that nothing remained there, as a replayed one does.
    sched = RecordingScheduler()
    router = InstanceRouter(sched, 1, 1)
    loop = AgentLoop(
        OneToolEnv(max_turns=2),
        CharTokenizer(),
        [ScriptedEngine(["CALL|"])],
        RolloutConfig(),
        policy_version=0,
        iteration=0,
    )
    (row,) = loop.run([RolloutRequest(Problem("p0", "PROMPT", "2", 1), "g0", 0)], router)
    assert row["finish_reason"] == "max_turns" and row["num_turns"] == 2
    call = Turn(5, "calc", 5, "success")
    assert sched.finished == [(call, call, Turn(0, None, 0, None))]
