"""Environment interfaces: where problems, tools and rewards come from.

An environment is what the agent loop talks to during rollout and what the reward stage scores
against. The agent loop (libra_core.rollout.agent_loop) calls, per trajectory:
`render_prompt` once, then after every model turn `parse_turn`; a tool call goes to `run_tool`, whose
observation text is tokenised and appended (loss-masked) before the next turn; an answer ends the
trajectory. The reward stage calls `reward` once per finished trajectory. The SFT warm-up calls
`demonstration`, or `warmup_demonstration(problem, rng)` where an environment defines it (to vary
what the warm-up sees; the arithmetic task mixes in premature answers). Implementations must be
deterministic given their seed and safe to call from several threads (tools may run concurrently).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

ToolStatus = Literal["success", "failure", "timeout"]


@dataclass(frozen=True)
class Problem:
    """One prompt of a task. `prompt_id` is stable across runs with the same seed."""

    prompt_id: str
    question: str
    reference_answer: str
    difficulty: int  # e.g. number of tool calls an ideal solution needs


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned. `observation` is the text appended to the context."""

    tool: str
    status: ToolStatus
    observation: str
    latency_s: float


UNKNOWN_TOOL = "unknown"  # the tool key of a call to a name the environment does not have
MAX_TOOL_NAME_CHARS = 64


def unknown_tool(name: object) -> ToolResult:
    """The `failure` a call to a tool the environment lacks gets. The key is `UNKNOWN_TOOL`, not the
    model's text: an invented name must neither grow the observation nor become a key of
    C-MLFQ's prefix tree."""
    shown = str(name)[:MAX_TOOL_NAME_CHARS]
    return ToolResult(UNKNOWN_TOOL, "failure", f"error: unknown tool {shown!r}", 0.0)


def call_with_deadline(tool: Callable[[str], ToolResult], arguments: str, timeout_s: float) -> ToolResult:
    """Run an in-process tool; a call that took longer than `timeout_s` counts as a `timeout` (the
    tool itself cannot be interrupted, so this only classifies slow calls)."""
    start = time.perf_counter()
    result = tool(arguments)
    elapsed = time.perf_counter() - start
    if elapsed > timeout_s:
        return ToolResult(result.tool, "timeout", f"error: {result.tool} timed out", elapsed)
    return result


@dataclass(frozen=True)
class TurnAction:
    """How the environment reads one model turn.

    kind "tool_call": `tool` and `arguments` are set. kind "answer": `answer` is set.
    kind "invalid": the turn was neither; the loop ends the trajectory (finish_reason "error").
    """

    kind: Literal["tool_call", "answer", "invalid"]
    tool: str | None = None
    arguments: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class Segment:
    """A piece of a demonstration; `trainable` marks text the policy should learn to write."""

    text: str
    trainable: bool


class Tool(Protocol):
    """A callable tool. Must never raise on bad arguments: it returns status "failure"."""

    name: str

    def __call__(self, arguments: str) -> ToolResult: ...


class Environment(Protocol):
    name: str
    special_tokens: tuple[str, ...]  # tokens the tokenizer must keep atomic
    stop_tokens: tuple[str, ...]  # generation stops after any of these (end of call, end of answer)
    max_turns: int  # most model turns per trajectory

    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]: ...
    def render_prompt(self, problem: Problem) -> str: ...
    def parse_turn(self, turn_text: str) -> TurnAction: ...
    def run_tool(self, action: TurnAction) -> ToolResult: ...
    def format_observation(self, result: ToolResult) -> str: ...
    def reward(self, reference_answer: str, final_answer: str | None) -> float: ...
    def demonstration(self, problem: Problem) -> list[Segment]: ...
    def corpus(self, n: int, seed: int) -> list[str]: ...
