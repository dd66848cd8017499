"""`code`: MBPP / HumanEval programming problems, checked by running tests in the sandbox.

The prompt shows the task and one visible test. The model may run code with the `python` tool
(typically its solution followed by the visible test); the observation is the program's stdout or
the tail of its traceback, and the status says whether it ran cleanly (`success`), raised or failed
an assertion (`failure`) or hit a limit (`timeout`). The final answer is the solution's code
(markers: the text after `<|answer|>`; chatml: the last fenced code block of the answer turn).
Reward: the answer plus *all* the problem's tests run in the sandbox; every test passes ->
`correct`, the program runs but a test fails -> `well_formed`, nothing to run -> `malformed`.
"Every test passes" means the program exits with status 0 *and* a per-check random marker printed
after the last test appears in its stdout: an answer that exits early (`sys.exit(0)`,
`os._exit(0)`, `raise SystemExit`) skips the tests and the marker, so it is not `correct`. The
tests run apart from the answer and compare built-in values only (libra_core/envs/code_harness.py),
so an answer returning an always-equal object or redefining `set` does not pass them.

The reference answer of a problem is JSON {"tests", "names", "setup"} (the names the tests take
from the answer, trusted code run before them): the reward stage gets only the reference string
and the final answer, so the tests travel with the trajectory.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import warnings

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.base import Problem, Segment, ToolResult, TurnAction, unknown_tool
from libra_core.envs.code_harness import check_plan, check_program
from libra_core.envs.datasets import CodeRecord, load_code, sample_records
from libra_core.envs.protocol import extract_code, python_source, text_format
from libra_core.envs.python_tool import PythonTool
from libra_core.envs.sandbox import ExecutionResult
from libra_core.envs.splits import demonstration_texts

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
        return self.python(python_source(action.arguments))

    def format_observation(self, result: ToolResult) -> str:
        return self.format.observation(result.observation)

    def run_tests(self, reference_answer: str, final_answer: str, marker: str = "") -> ExecutionResult:
        """The answer's code checked by the problem's tests (`code_harness.check_program`: separate
        namespaces, fresh builtins, strict comparisons), run once in the sandbox; the last line
        prints `marker`, which reaches stdout only if the tests ran to the end."""
        # Dedented as the python tool's calls are: a fence indented under a list item ran indented
        # (IndentationError, a correct answer scored well_formed) until 2026-12-07.
        program = check_program(check_plan(reference_answer), python_source(final_answer), marker)
        return self.python.sandbox.run_python(program)

    def tests_pass(self, reference_answer: str, final_answer: str) -> bool:
        """Whether every test ran and passed: exit status 0 alone is not enough (an answer may exit
        with 0 before the tests run), so a fresh random marker must also reach stdout."""
        marker = f"libra-tests-done-{secrets.token_hex(16)}"
        result = self.run_tests(reference_answer, final_answer, marker)
        return result.status == "success" and marker in result.stdout

    def reward(self, reference_answer: str, final_answer: str | None) -> float:
        weights = self.cfg.reward
        if final_answer is None or not _has_code(final_answer):
            return weights.malformed
        return weights.correct if self.tests_pass(reference_answer, final_answer) else weights.well_formed

    # -- supervision ----------------------------------------------------------------------------
    def demonstration(self, problem: Problem) -> list[Segment]:
        record = self._by_id[problem.prompt_id]
        solution = record.solution.strip("\n")
        # The observation shown is "ok": the trial prints it (the visible test, when the record has
        # one, passes against the reference solution).
        trial = "\n".join(t for t in (solution, record.visible_test, "print('ok')") if t)
        final = solution if self.format.name == "markers" else f"```python\n{solution}\n```"
        return [
            Segment(self.render_prompt(problem), trainable=False),
            Segment(self.format.call(self.python.name, trial), trainable=True),
            Segment(self.format.observation("ok"), trainable=False),
            Segment(self.format.answer(final), trainable=True),
        ]

    def corpus(self, n: int, seed: int) -> list[str]:
        texts = demonstration_texts(self, n, seed)
        texts.append(
            self.format.observation(
                'Traceback (most recent call last):\n  File "main.py", line 3, in <module>\nAssertionError\n'
                "NameError: name 'x' is not defined\nerror: execution timed out (cpu_limit)\n(no output)"
            )
        )
        return texts


def _has_code(answer: str) -> bool:
    """Whether the answer holds a program: a fenced block, or text that compiles as Python. Prose
    ("I am not sure how to solve this") compiled in the sandbox, failed, and scored well_formed
    above an answer cut off by the token limit, until 2026-12-06; it is malformed, as documented.
    Compiling runs nothing."""
    code = extract_code(answer)
    if not code.strip():
        return False
    if code != answer:  # a fenced block (the whole answer otherwise, fences and all)
        return True
    try:
        with warnings.catch_warnings():  # the model's invalid escapes are its program's business
            warnings.simplefilter("ignore")
            compile(textwrap.dedent(code), "answer", "exec", dont_inherit=True)  # as `run_tests` runs it
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _problem(record: CodeRecord) -> Problem:
    reference = json.dumps({"tests": record.tests, "names": list(record.answer_names), "setup": record.setup})
    return Problem(record.id, record.prompt, reference, record.difficulty)
