"""The agent loop's token budget and row invariants.

Guards what `AgentLoop.run_one` writes into a trajectory row when the budget binds: a turn is
asked for no more tokens than the trajectory has left, a tool observation is cut to the room left,
a turn cut by the budget ends as "max_tokens" (not "error"), observation tokens carry loss_mask 0,
and behaviour log-probs are clamped to <= 0 so the row validates. A scripted engine (one turn text
per call) and a one-tool environment with a character tokenizer stand in for vLLM and a real tool,
so every token count is known exactly; the agent loop and router are the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libra_core.config.models import RolloutConfig
from libra_core.data.schema import table_from_rows
from libra_core.envs.base import Problem
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest
from libra_core.rollout.client import Completion
from libra_core.rollout.router import static_router
from tests.rollout.builders import STOP, CharTokenizer, OneToolEnv

PROMPT = "PROMPT"  # 6 tokens with the character tokenizer


class ScriptedEngine:
    """Answers the n-th call with turns[n] (the last one repeats), cut at `max_tokens`; every token's
    log-prob is `logprob`, and the finish reason is "length" when the cut bit."""

    def __init__(self, turns: Sequence[str], logprob: float = -0.5) -> None:
        self.turns, self.logprob, self.calls = list(turns), logprob, 0
        self.max_tokens: list[int] = []

    async def complete(
        self, http: Any, prompt_ids: Sequence[int], *, max_tokens: int, **_: Any
    ) -> Completion:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        self.max_tokens.append(max_tokens)
        ids = [ord(c) for c in text][:max_tokens]
        return Completion(ids, [self.logprob] * len(ids), "stop" if len(ids) == len(text) else "length")


def _run(env: OneToolEnv, engine: ScriptedEngine, cfg: RolloutConfig) -> dict[str, Any]:
    loop = AgentLoop(env, CharTokenizer(), [engine], cfg, policy_version=0, iteration=0)
    (row,) = loop.run([RolloutRequest(Problem("p0", PROMPT, "2", 1), "g0", 0)], static_router())
    return row


def _total(row: dict[str, Any]) -> int:
    return len(row["prompt_ids"]) + len(row["response_ids"])


def test_a_turn_is_capped_at_the_tokens_left_and_ends_as_max_tokens() -> None:
    # Regression: max_tokens=max_tokens_per_turn (not min with the budget) overruns max_total_tokens;
    # and a budget-cut ("length") invalid turn labelled "error" instead of "max_tokens".
    engine = ScriptedEngine(["CALL|", "x" * 37 + STOP])
    row = _run(OneToolEnv(8, payload=2), engine, RolloutConfig(max_total_tokens=20))
    # 6 prompt + 5 call + 2 observation = 13: the second turn may use only the 7 tokens left
    assert engine.max_tokens == [20 - 6, 20 - 13]
    assert _total(row) == 20
    assert row["finish_reason"] == "max_tokens"
    table_from_rows([row])


def test_a_turn_cut_by_the_budget_is_max_tokens_not_error() -> None:
    # Regression: finish reason checked against "max_tokens" instead of vLLM's "length" -> "error".
    engine = ScriptedEngine(["x" * 30 + STOP])
    row = _run(OneToolEnv(8), engine, RolloutConfig(max_total_tokens=16))
    assert _total(row) == 16 and row["num_turns"] == 1
    assert row["finish_reason"] == "max_tokens"


def test_an_observation_is_cut_to_the_room_left() -> None:
    # Regression: dropping `obs = obs[:max(room, 0)]` lets a long tool payload overrun max_total_tokens.
    engine = ScriptedEngine(["CALL|", "ANS|"])
    row = _run(OneToolEnv(8, payload=100), engine, RolloutConfig(max_total_tokens=20))
    assert _total(row) == 20
    assert row["tool_events"][0]["payload_tokens"] == 20 - 6 - 5
    assert row["finish_reason"] == "max_tokens"
    assert engine.calls == 1  # no turn is asked for once the budget is spent
    table_from_rows([row])


def test_observation_tokens_are_masked_out_of_the_loss() -> None:
    # Regression: observation tokens given loss_mask 1 would train the policy on tool output.
    row = _run(OneToolEnv(8, payload=3), ScriptedEngine(["CALL|", "ANS|"]), RolloutConfig())
    assert row["finish_reason"] == "answer"
    assert row["loss_mask"] == [1] * 5 + [0] * 3 + [1] * 4
    assert row["behavior_logprobs"] == [-0.5] * 5 + [0.0] * 3 + [-0.5] * 4
    table_from_rows([row])


def test_positive_engine_logprobs_are_clamped_to_zero() -> None:
    # Regression: without the min(lp, 0.0) clamp a slightly positive engine log-prob reaches the row.
    engine = ScriptedEngine(["CALL|", "ANS|"], logprob=1e-3)
    row = _run(OneToolEnv(8, payload=3), engine, RolloutConfig())
    assert max(row["behavior_logprobs"]) == 0.0
    assert all(lp == 0.0 for lp in row["behavior_logprobs"])
    table_from_rows([row])
