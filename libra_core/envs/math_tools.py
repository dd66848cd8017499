"""`math_tools`: GSM8K / MATH-500 word problems solved with a calculator and a sandboxed Python tool.

Problems come from JSONL files (libra_core/envs/datasets.py). Two tools: `calculator` (one
arithmetic expression, in-process, microseconds) and `python` (arbitrary code in the sandbox,
~0.1 s, can fail or time out), so tool returns differ in latency, payload size and status.
Reward: math-verify equivalence of the final answer with the reference (libra_core/envs/
answer_check.py), checked in a worker process under `answer_check_timeout_s` (answer_worker.py);
`reward.well_formed` for a parseable wrong answer (or a check past the deadline), `reward.malformed`
for none.
Demonstrations for the SFT warm-up replay GSM8K's `<<48/2=24>>` annotations as calculator calls;
MATH records (no annotations) demonstrate the answer alone. Text protocol: libra_core/envs/protocol.py.
"""

from __future__ import annotations

from libra_core.config.environments import MathToolsEnvConfig
from libra_core.envs.base import Problem, Segment, ToolResult, TurnAction, call_with_deadline, unknown_tool
from libra_core.envs.datasets import MathRecord, load_math, sample_records
from libra_core.envs.math_calculator import CalculatorError, MathCalculator, evaluate
from libra_core.envs.protocol import python_source, text_format
from libra_core.envs.python_tool import PythonTool
from libra_core.envs.splits import demonstration_texts

SYSTEM_PROMPT = (
    "Solve the math problem. You may call tools: calculator (one arithmetic expression) and python "
    "(a program; print the result), e.g. <tool_call>\n"
    '{"name": "calculator", "arguments": "48/2"}\n</tool_call>. '
    "Finish with the final answer in \\boxed{}."
)


class MathToolsEnv:
    name = "math_tools"

    def __init__(self, cfg: MathToolsEnvConfig) -> None:
        self.cfg = cfg
        self.format = text_format(cfg.prompt_format)
        self.special_tokens = self.format.special_tokens
        self.stop_tokens = self.format.stop_tokens
        self.max_turns = cfg.max_turns
        self.records = load_math(cfg.data_dir, cfg.files)
        self._by_id = {r.id: r for r in self.records}
        self.calculator = MathCalculator()
        self.python = PythonTool(cfg.sandbox, cfg.max_observation_chars)
        self.tools = (self.calculator.name, self.python.name)

    # -- problems -------------------------------------------------------------------------------
    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]:
        return [_problem(r) for r in sample_records(self.records, n, seed, min_difficulty)]

    # -- agent-loop protocol --------------------------------------------------------------------
    def render_prompt(self, problem: Problem) -> str:
        return self.format.prompt(SYSTEM_PROMPT, problem.question)

    def parse_turn(self, turn_text: str) -> TurnAction:
        return self.format.parse(turn_text, self.tools, code_block_tool=self.python.name)

    def run_tool(self, action: TurnAction) -> ToolResult:
        if action.tool == self.python.name and action.arguments is not None:
            return self.python(python_source(action.arguments))
        if action.tool != self.calculator.name or action.arguments is None:
            return unknown_tool(action.tool)
        return call_with_deadline(self.calculator, action.arguments, self.cfg.tool_timeout_s)

    def format_observation(self, result: ToolResult) -> str:
        return self.format.observation(result.observation)

    def reward(self, reference_answer: str, final_answer: str | None) -> float:
        weights = self.cfg.reward
        if final_answer is None:
            return weights.malformed
        verdict = self._math_equivalent(reference_answer, final_answer)
        if verdict is None:
            return weights.malformed
        return weights.correct if verdict else weights.well_formed

    def _math_equivalent(self, reference_answer: str, final_answer: str) -> bool | None:
        timeout_s = self.cfg.answer_check_timeout_s
        if timeout_s is None:
            from libra_core.envs.answer_check import math_equivalent

            return math_equivalent(reference_answer, final_answer)
        from libra_core.envs.answer_worker import shared_worker

        return shared_worker(timeout_s).math_equivalent(reference_answer, final_answer)

    # -- supervision ----------------------------------------------------------------------------
    def demonstration(self, problem: Problem) -> list[Segment]:
        record = self._by_id.get(problem.prompt_id)
        segments = [Segment(self.render_prompt(problem), trainable=False)]
        for expr in record.steps if record is not None else ():
            try:
                value = evaluate(expr)
            except CalculatorError:
                continue  # an annotation our calculator rejects is not demonstrated
            segments.append(Segment(self.format.call(self.calculator.name, expr), trainable=True))
            segments.append(Segment(self.format.observation(value), trainable=False))
        answer = problem.reference_answer
        text = answer if self.format.name == "markers" else f"The answer is \\boxed{{{answer}}}."
        segments.append(Segment(self.format.answer(text), trainable=True))
        return segments

    def corpus(self, n: int, seed: int) -> list[str]:
        texts = demonstration_texts(self, n, seed)
        # Tool errors the model will read (their characters must be in the tokenizer's alphabet).
        texts.append(self.format_observation(self.calculator("bad call")))
        texts.append(self.format.observation('Traceback (most recent call last):\n  File "main.py", line 1'))
        texts.append(
            self.format.observation("NameError: name 'x' is not defined\nerror: execution timed out")
        )
        return texts


def _problem(record: MathRecord) -> Problem:
    return Problem(record.id, record.question, record.answer, record.difficulty)
