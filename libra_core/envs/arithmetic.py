"""Embedded default task: fully parenthesised integer arithmetic solved with a calculator tool.

A problem with k binary operations needs k calculator calls (the tool takes one operation per
call), so trajectory lengths vary several-fold between 1-op and many-op problems. Text protocol
(every marker is a special token of the tokenizer):

    <|user|>((3+4)*5)<|assistant|><|call|>3+4<|/call|><|result|>7<|/result|>
    <|call|>7*5<|/call|><|result|>35<|/result|><|answer|>35<|eos|>

Model turns end at `<|/call|>` or `<|eos|>`; `<|result|>...<|/result|>` is written by the
environment and is loss-masked during training.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from libra_core.config.models import ArithmeticEnvConfig
from libra_core.envs.base import Problem, Segment, ToolResult, TurnAction, call_with_deadline, unknown_tool
from libra_core.envs.calculator import Calculator
from libra_core.envs.splits import demonstration_texts

USER, ASSISTANT = "<|user|>", "<|assistant|>"
CALL, END_CALL = "<|call|>", "<|/call|>"
RESULT, END_RESULT = "<|result|>", "<|/result|>"
ANSWER, EOS, PAD = "<|answer|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (PAD, EOS, USER, ASSISTANT, CALL, END_CALL, RESULT, END_RESULT, ANSWER)

_CALL_TURN = re.compile(re.escape(CALL) + r"(.*?)" + re.escape(END_CALL), re.S)
_ANSWER_TURN = re.compile(re.escape(ANSWER) + r"(.*?)" + re.escape(EOS), re.S)
_INT = re.compile(r"^-?\d+$")
_MAX_ANSWER_CHARS = 1000  # a reference is one operation on operands of at most 9 digits: <= 19 chars


@dataclass(frozen=True)
class _Node:
    value: int
    text: str
    steps: tuple[tuple[int, str, int, int], ...]  # (a, op, b, result) in evaluation order


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class ArithmeticEnv:
    name = "arithmetic"
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS
    stop_tokens: tuple[str, ...] = (END_CALL, EOS)

    def __init__(self, cfg: ArithmeticEnvConfig | None = None) -> None:
        self.cfg = cfg or ArithmeticEnvConfig()
        self.calculator = Calculator()
        self.max_turns = self.cfg.max_turns

    # -- problems -------------------------------------------------------------------------------
    def _build(self, rng: random.Random, ops: int) -> _Node:
        if ops == 0:
            v = rng.randint(1, self.cfg.max_operand)
            return _Node(v, str(v), ())
        left_ops = rng.randint(0, ops - 1)
        left, right = self._build(rng, left_ops), self._build(rng, ops - 1 - left_ops)
        op = rng.choice(self.cfg.operators)
        value = _apply(left.value, op, right.value)
        step = (left.value, op, right.value, value)
        return _Node(value, f"({left.text}{op}{right.text})", left.steps + right.steps + (step,))

    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]:
        rng = random.Random(seed)
        # Stratified difficulty: every op count appears equally often (up to rounding), so the
        # per-iteration reward measures the policy rather than that batch's difficulty mix.
        # `min_difficulty` past max_ops is clamped to it (the hardest problems), as the data-backed
        # environments clamp to their hardest record: the default rollout.min_difficulty (3) with
        # `environment.max_ops=2` passed validation and failed the first rollout, after the
        # warm-up, until 2026-12-06.
        lowest = min(max(self.cfg.min_ops, min_difficulty or 0), self.cfg.max_ops)
        levels = list(range(lowest, self.cfg.max_ops + 1))
        start = rng.randrange(len(levels))
        op_counts = [levels[(start + i) % len(levels)] for i in range(n)]
        rng.shuffle(op_counts)
        problems = []
        for ops in op_counts:
            node = self._build(rng, ops)
            digest = hashlib.sha1(node.text.encode()).hexdigest()[:12]
            problems.append(Problem(f"arith-{digest}", node.text, str(node.value), ops))
        return problems

    def solution_steps(self, problem: Problem) -> tuple[tuple[int, str, int, int], ...]:
        """Re-derive the evaluation order (innermost-left first) from the question text."""
        tokens = re.findall(r"\d+|[()+\-*]", problem.question)
        pos = 0

        def parse() -> _Node:
            nonlocal pos
            tok = tokens[pos]
            pos += 1
            if tok != "(":
                return _Node(int(tok), tok, ())
            left = parse()
            op = tokens[pos]
            pos += 1
            right = parse()
            pos += 1  # ")"
            value = _apply(left.value, op, right.value)
            return _Node(value, "", left.steps + right.steps + ((left.value, op, right.value, value),))

        return parse().steps

    # -- agent-loop protocol --------------------------------------------------------------------
    def render_prompt(self, problem: Problem) -> str:
        return f"{USER}{problem.question}{ASSISTANT}"

    def parse_turn(self, turn_text: str) -> TurnAction:
        call = _CALL_TURN.search(turn_text)
        if call is not None and turn_text.rstrip().endswith(END_CALL):
            return TurnAction("tool_call", tool=self.calculator.name, arguments=call.group(1))
        answer = _ANSWER_TURN.search(turn_text)
        if answer is not None:
            return TurnAction("answer", answer=answer.group(1).strip())
        return TurnAction("invalid")

    def run_tool(self, action: TurnAction) -> ToolResult:
        if action.tool != self.calculator.name or action.arguments is None:
            return unknown_tool(action.tool)
        return call_with_deadline(self.calculator, action.arguments, self.cfg.tool_timeout_s)

    def format_observation(self, result: ToolResult) -> str:
        return f"{RESULT}{result.observation}{END_RESULT}"

    def reward(self, reference_answer: str, final_answer: str | None) -> float:
        weights = self.cfg.reward
        if final_answer is None or not _INT.match(final_answer.strip()):
            return weights.malformed
        if len(final_answer.strip()) > _MAX_ANSWER_CHARS:
            # An integer, but far longer than any reference (int() refuses over 4,300 digits): wrong.
            return weights.well_formed
        return weights.correct if int(final_answer) == int(reference_answer) else weights.well_formed

    # -- supervision ----------------------------------------------------------------------------
    def demonstration(self, problem: Problem) -> list[Segment]:
        steps = self.solution_steps(problem)
        return self._solution(problem, steps, len(steps))

    def warmup_demonstration(self, problem: Problem, rng: random.Random) -> list[Segment]:
        """What the SFT warm-up trains on: `demonstration`, or with probability
        `warmup_early_answer_rate` (problems of two or more operations) a solution that stops
        after a uniformly drawn 1..ops-1 calls and answers with the latest result."""
        steps = self.solution_steps(problem)
        calls, rate = len(steps), self.cfg.warmup_early_answer_rate
        if calls >= 2 and rate > 0 and rng.random() < rate:
            calls = rng.randint(1, calls - 1)
        return self._solution(problem, steps, calls)

    def early_answer_demonstration(self, problem: Problem, calls: int) -> list[Segment]:
        """A flawed demonstration: the first `calls` tool calls, then their last result as the answer
        (a teacher that stops too early; wrong whenever `calls` is below the operation count)."""
        steps = self.solution_steps(problem)
        if not 1 <= calls <= len(steps):
            raise ValueError(f"calls must be in 1..{len(steps)} for {problem.question!r}; got {calls}")
        return self._solution(problem, steps, calls)

    def _solution(
        self, problem: Problem, steps: tuple[tuple[int, str, int, int], ...], calls: int
    ) -> list[Segment]:
        # The first `calls` steps as tool calls, then the answer: the reference after every step,
        # else the latest result.
        segments = [Segment(self.render_prompt(problem), trainable=False)]
        for a, op, b, value in steps[:calls]:
            segments.append(Segment(f"{CALL}{a}{op}{b}{END_CALL}", trainable=True))
            segments.append(Segment(f"{RESULT}{value}{END_RESULT}", trainable=False))
        answer = problem.reference_answer if calls == len(steps) else steps[calls - 1][3]
        segments.append(Segment(f"{ANSWER}{answer}{EOS}", trainable=True))
        return segments

    def corpus(self, n: int, seed: int) -> list[str]:
        texts = demonstration_texts(self, n, seed)
        texts.append(self.format_observation(self.calculator("bad call")))
        return texts
