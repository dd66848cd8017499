"""Stand-ins shared by the agent-loop tests: a character tokenizer and a one-tool environment, so
every token count a test asserts is known exactly (imported as `tests.rollout.builders`)."""

from __future__ import annotations

from collections.abc import Sequence

from libra_core.envs.base import Problem, ToolResult, TurnAction

STOP = "|"


class CharTokenizer:
    unk_token = "?"
    unk_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def convert_tokens_to_ids(self, token: str) -> int:
        return ord(token) if len(token) == 1 else 0


class OneToolEnv:
    """ "CALL|" calls the tool, "ANS|" answers; every observation is `payload` characters."""

    name = "one-tool"
    stop_tokens = (STOP,)

    def __init__(self, max_turns: int, payload: int = 5) -> None:
        self.max_turns, self.payload = max_turns, payload

    def render_prompt(self, problem: Problem) -> str:
        return problem.question

    def parse_turn(self, text: str) -> TurnAction:
        if text.startswith("CALL"):
            return TurnAction("tool_call", tool="calc", arguments="1+1")
        return TurnAction("answer", answer="2") if text.startswith("ANS") else TurnAction("invalid")

    def run_tool(self, action: TurnAction) -> ToolResult:
        return ToolResult("calc", "success", "x" * self.payload, 0.0)

    def format_observation(self, result: ToolResult) -> str:
        return result.observation
