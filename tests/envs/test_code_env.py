"""code on MBPP / HumanEval: model code runs against the real tests in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.registry import build_environment

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "code").is_dir(), reason=f"shared data folder {DATA} is absent")


def _answer_of(env, problem) -> str:  # noqa: ANN001
    return env.demonstration(problem)[-1].text.removeprefix("<|answer|>").removesuffix("<|eos|>")


@pytest.mark.parametrize("file", ["code/mbpp.jsonl", "code/HumanEval.jsonl.gz"])
def test_reference_solutions_pass_and_wrong_ones_fail(file: str) -> None:
    env = build_environment(CodeEnvConfig(type="code", files=(file,)))
    problems = env.sample_problems(4, 1)
    for problem in problems:
        assert env.reward(problem.reference_answer, _answer_of(env, problem)) == 1.0, problem.prompt_id
    wrong = "def nothing():\n    return None\n"
    assert env.reward(problems[0].reference_answer, wrong) == 0.1
    assert env.reward(problems[0].reference_answer, None) == 0.0
    assert env.reward(problems[0].reference_answer, "   ") == 0.0
    # prose is no program: it scored 0.1 (it compiled in the sandbox and failed), above an answer
    # cut off by the token limit; a fenced block and bare code that compiles are programs
    assert env.reward(problems[0].reference_answer, "I am not sure how to solve this, sorry.") == 0.0
    assert env.reward(problems[0].reference_answer, f"```python\n{wrong}```") == 0.1
    assert env.reward(problems[0].reference_answer, "def f(:\n") == 0.0  # no fence, no program


def test_execution_tool_reports_success_failure_and_timeout() -> None:
    env = build_environment(CodeEnvConfig(type="code"))
    problem = env.sample_problems(1, 0)[0]
    demo_call = env.demonstration(problem)[1].text
    passed = env.run_tool(env.parse_turn(demo_call))
    failed = env.run_tool(env.parse_turn("<|call|>python:def f(x):\n    return x\nassert f(1) == 2<|/call|>"))
    crashed = env.run_tool(env.parse_turn("<|call|>python:print(1/0)<|/call|>"))
    hung = env.run_tool(env.parse_turn("<|call|>python:while True:\n    pass<|/call|>"))
    assert (passed.status, passed.observation) == ("success", "ok")
    assert failed.status == "failure" and "AssertionError" in failed.observation
    assert crashed.status == "failure" and "ZeroDivisionError" in crashed.observation
    assert hung.status == "timeout"
    assert len({len(r.observation) for r in (passed, failed, crashed, hung)}) == 4


def test_chatml_answer_is_the_last_code_block() -> None:
    env = build_environment(CodeEnvConfig(type="code", prompt_format="chatml"))
    problem = env.sample_problems(1, 2)[0]
    solution = env.demonstration(problem)[-1].text.removesuffix("<|im_end|>")
    action = env.parse_turn(f"Here is my solution:\n{solution}\nDone.<|im_end|>")
    assert action.kind == "answer"
    assert env.reward(problem.reference_answer, action.answer) == 1.0


def test_an_indented_answer_is_dedented_as_the_python_tool_does(tmp_path: Path) -> None:
    # A solution in a fence indented under a list item ran indented: IndentationError, 0.1 for a
    # correct answer, though the same block as a python tool call ran (until 2026-12-07).
    tests = "assert perimeter(10) == 40\n"
    (tmp_path / "code.jsonl").write_text(json.dumps({"id": "p", "question": "q", "tests": tests}) + "\n")
    env = build_environment(CodeEnvConfig(type="code", data_dir=str(tmp_path), files=("code.jsonl",)))
    reference = env.sample_problems(1, 0)[0].reference_answer
    solution = "```python\ndef perimeter(a):\n    return 4 * a\n```"
    indented = "Steps:\n1. Compute it:\n" + "\n".join("   " + line for line in solution.splitlines())
    assert env.reward(reference, indented) == 1.0
    assert env.reward(reference, "  def perimeter(a):\n      return 4 * a\n") == 1.0  # no fence
    assert env.reward(reference, indented.replace("4 * a", "3 * a")) == 0.1
