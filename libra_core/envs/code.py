"""`code`: MBPP / HumanEval programming problems, checked by running tests in the sandbox.

The prompt shows the task and one visible test. The model may run code with the `python` tool
(typically its solution followed by the visible test); the observation is the program's stdout or
the tail of its traceback, and the status says whether it ran cleanly (`success`), raised or failed
an assertion (`failure`) or hit a limit (`timeout`). The final answer is the solution's code
(markers: the text after `<|answer|>`; chatml: the last fenced code block of the answer turn).
Reward: the answer plus *all* the problem's tests run in the sandbox; every test passes ->
`correct`, the program runs but a test fails -> `well_formed`, nothing to run -> `malformed`.

The reference answer of a problem is JSON {"tests": ...}: the reward stage gets only the
reference string and the final answer, so the tests travel with the trajectory.
"""

from __future__ import annotations

import json

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.base import Problem, Segment, ToolResult, TurnAction, unknown_tool
from libra_core.envs.datasets import CodeRecord, load_code, sample_records
from libra_core.envs.protocol import extract_code, text_format
from libra_core.envs.python_tool import PythonTool
from libra_core.envs.sandbox import ExecutionResult

SYSTEM_PROMPT = (
    "Write a Python function that solves the task. You may test code with the python tool, e.g. "
    '<tool_call>\n{"name": "python", "arguments": "def f(x): ...\\nassert f(1) == 2"}\n</tool_call>. '
    "Finish with the complete solution in one ```python code block."
)


class CodeEnv:
    name = "code"

    def __init__(self, cfg: CodeEnvConfig) -> None:
        self.cfg = cfg
        self.format = text_format(cfg.prompt_format)
        self.special_tokens = self.format.special_tokens
        self.stop_tokens = self.format.stop_tokens
        self.max_turns = cfg.max_turns
        self.records = load_code(cfg.data_dir, cfg.files)
        self._by_id = {r.id: r for r in self.records}
        self.python = PythonTool(cfg.sandbox, cfg.max_observation_chars)
        self.tools = (self.python.name,)

    # -- problems -------------------------------------------------------------------------------
    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]:
        return [_problem(r) for r in sample_records(self.records, n, seed, min_difficulty)]

    # -- agent-loop protocol --------------------------------------------------------------------
    def render_prompt(self, problem: Problem) -> str:
        return self.format.prompt(SYSTEM_PROMPT, problem.question)

    def parse_turn(self, turn_text: str) -> TurnAction:
        return self.format.parse(turn_text, self.tools)

    def run_tool(self, action: TurnAction) -> ToolResult:
        if action.tool != self.python.name or action.arguments is None:
            return unknown_tool(action.tool)
        return self.python(extract_code(action.arguments))

    def format_observation(self, result: ToolResult) -> str:
        return self.format.observation(result.observation)

    def run_tests(self, reference_answer: str, final_answer: str) -> ExecutionResult:
        """The answer's code followed by the problem's tests, run once in the sandbox."""
        tests = json.loads(reference_answer)["tests"]
        program = f"{extract_code(final_answer)}\n\n{tests}\n"
        return self.python.sandbox.run_python(program)

    def reward(self, reference_answer: str, final_answer: str | None) -> float:
        weights = self.cfg.reward
        if final_answer is None or not extract_code(final_answer).strip():
            return weights.malformed
        result = self.run_tests(reference_answer, final_answer)
        return weights.correct if result.status == "success" else weights.well_formed

    # -- supervision ----------------------------------------------------------------------------
    def demonstration(self, problem: Problem) -> list[Segment]:
        record = self._by_id[problem.prompt_id]
        solution = record.solution.strip("\n")
        trial = f"{solution}\n{record.visible_test}\nprint('ok')" if record.visible_test else solution
        final = solution if self.format.name == "markers" else f"```python\n{solution}\n```"
        return [
            Segment(self.render_prompt(problem), trainable=False),
            Segment(self.format.call(self.python.name, trial), trainable=True),
            Segment(self.format.observation("ok"), trainable=False),
            Segment(self.format.answer(final), trainable=True),
        ]

    def corpus(self, n: int, seed: int) -> list[str]:
        texts = ["".join(s.text for s in self.demonstration(p)) for p in self.sample_problems(n, seed)]
        texts.append(
            self.format.observation(
                'Traceback (most recent call last):\n  File "main.py", line 3, in <module>\nAssertionError\n'
                "NameError: name 'x' is not defined\nerror: execution timed out (cpu_limit)\n(no output)"
            )
        )
        return texts


def _problem(record: CodeRecord) -> Problem:
    reference = json.dumps({"tests": record.tests})
    return Problem(record.id, record.prompt, reference, record.difficulty)
