"""math_tools on GSM8K / MATH-500 records: real calculator and sandboxed Python calls, math-verify reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config.environments import MathToolsEnvConfig
from libra_core.envs.base import TurnAction
from libra_core.envs.math_calculator import evaluate
from libra_core.envs.registry import build_environment

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data folder {DATA} is absent")


@pytest.fixture(scope="module")
def env():  # noqa: ANN201
    return build_environment(MathToolsEnvConfig(type="math_tools", files=("gsm8k/test.jsonl",)))


def test_calculator_reproduces_gsm8k_annotations(env) -> None:  # noqa: ANN001
    checked = 0
    for record in env.records[:200]:
        for expr in record.steps:
            float(evaluate(expr))  # every annotation of these problems is accepted
            checked += 1
    assert checked > 300
    assert evaluate("48/2") == "24" and evaluate("0.2*50") == "10" and evaluate("12/60") == "0.2"


def test_demonstration_replays_annotations_through_the_real_tool(env) -> None:  # noqa: ANN001
    problem = next(p for p in env.sample_problems(20, 3) if p.difficulty >= 2)
    segments = env.demonstration(problem)
    calls = [s.text for s in segments if s.trainable][:-1]
    results = [s.text for s in segments[2::2]]
    assert len(calls) == problem.difficulty
    for call, shown in zip(calls, results, strict=True):
        tool_result = env.run_tool(env.parse_turn(call))
        assert tool_result.status == "success"
        assert env.format_observation(tool_result) == shown
    assert segments[-1].text == f"<|answer|>{problem.reference_answer}<|eos|>"


def test_tool_statuses_and_payloads_vary(env) -> None:  # noqa: ANN001
    calc_ok = env.run_tool(TurnAction("tool_call", tool="calculator", arguments="(48+24)/2"))
    calc_bad = env.run_tool(TurnAction("tool_call", tool="calculator", arguments="two apples"))
    py_ok = env.run_tool(env.parse_turn("<|call|>python:print(sum(i*i for i in range(10)))<|/call|>"))
    py_bad = env.run_tool(env.parse_turn("<|call|>python:print(undefined_name)<|/call|>"))
    py_slow = env.run_tool(env.parse_turn("<|call|>python:while True: pass<|/call|>"))
    assert (calc_ok.status, calc_ok.observation) == ("success", "36")
    assert calc_bad.status == "failure" and len(calc_bad.observation) > 20
    assert (py_ok.status, py_ok.observation) == ("success", "285")
    assert py_bad.status == "failure" and "NameError" in py_bad.observation
    assert py_slow.status == "timeout"


@pytest.mark.parametrize(
    ("reference", "answer", "expected"),
    [
        ("72", "72", 1.0),
        ("72", "72.0", 1.0),
        ("1000", "1,000", 1.0),
        ("72", "The answer is \\boxed{72}.", 1.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "$(3, \\frac{\\pi}{2})$", 1.0),
        ("72", "71", 0.1),
        ("\\frac{1}{2}", "\\frac{1}{3}", 0.1),
        ("72", "I do not know", 0.1),
        ("72", "", 0.0),
        ("72", None, 0.0),
    ],
)
def test_reward_by_equivalence(env, reference: str, answer: str | None, expected: float) -> None:  # noqa: ANN001
    assert env.reward(reference, answer) == expected


def test_math500_records_and_their_own_answers_score() -> None:
    env = build_environment(MathToolsEnvConfig(type="math_tools", files=("math/math500_test.jsonl",)))
    assert len(env.records) == 500
    problems = env.sample_problems(25, 0)
    assert {p.difficulty for p in problems} <= {1, 2, 3, 4, 5}
    assert all(env.reward(p.reference_answer, p.reference_answer) == 1.0 for p in problems)
    assert env.reward(problems[0].reference_answer, "not a number") == 0.1


def test_chatml_format_reads_tool_calls_code_blocks_and_answers() -> None:
    env = build_environment(
        MathToolsEnvConfig(type="math_tools", prompt_format="chatml", files=("gsm8k/test.jsonl",))
    )
    call = env.parse_turn('<tool_call>\n{"name": "calculator", "arguments": "3*4"}\n</tool_call><|im_end|>')
    assert (call.kind, call.tool, call.arguments) == ("tool_call", "calculator", "3*4")
    block = env.parse_turn("Let me compute.\n```python\nprint(3*4)\n```<|im_end|>")
    assert (block.kind, block.tool, block.arguments) == ("tool_call", "python", "print(3*4)\n")
    answer = env.parse_turn("So the total is \\boxed{12}.<|im_end|>")
    assert answer.kind == "answer" and env.reward("12", answer.answer) == 1.0
    assert env.parse_turn("cut off mid-sen").kind == "invalid"
    assert env.stop_tokens == ("<|im_end|>", "<|endoftext|>")


def test_chatml_reward_reads_the_final_box_after_long_reasoning() -> None:
    # The chatml answer is the whole turn; the box comes last, after the reasoning's own numbers.
    env = build_environment(
        MathToolsEnvConfig(type="math_tools", prompt_format="chatml", files=("gsm8k/test.jsonl",))
    )
    reasoning = (
        "Natalia sold 48 clips in April. In May she sold half as many, 48/2 = 24 clips. "
        "Altogether she sold 48 + 24 clips. Let me double check each step carefully. "
    ) * 3
    right = env.parse_turn(reasoning + "So the final answer is \\boxed{72}.<|im_end|>")
    wrong = env.parse_turn(reasoning + "So the final answer is \\boxed{99}.<|im_end|>")
    assert right.kind == wrong.kind == "answer" and len(right.answer or "") > 400
    assert env.reward("72", right.answer) == 1.0  # was 0.1: the answer was cut to its first 400 chars
    assert env.reward("24", wrong.answer) == 0.1  # was 1.0: matched an intermediate value
    assert env.reward("72", "The answer is 72") == 1.0


def test_tiny_tokenizer_covers_the_corpus_and_maps_unseen_characters_to_unk(env) -> None:  # noqa: ANN001
    from libra_core.model.tokenizer import UNK_TOKEN, train_tokenizer

    tokenizer = train_tokenizer(env.corpus(300, 0), env.special_tokens, 512)
    problem = env.sample_problems(1, 5)[0]
    text = "".join(s.text for s in env.demonstration(problem))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    unk = tokenizer.convert_tokens_to_ids(UNK_TOKEN)
    odd = tokenizer.encode("costs 5\u20ac\u2603", add_special_tokens=False)
    assert unk in odd  # a character no demonstration showed is kept as <|unk|>, not dropped


def test_a_fenced_or_spaced_python_call_runs_as_in_the_code_environment() -> None:
    # math_tools ran the arguments as written: a fenced block was a SyntaxError, `python: print(1)`
    # an IndentationError; the code environment ran both.
    chat = build_environment(
        MathToolsEnvConfig(type="math_tools", prompt_format="chatml", files=("gsm8k/test.jsonl",))
    )
    for turn in (
        "<tool_call>\npython:```python\nprint(6*7)\n```\n</tool_call><|im_end|>",
        "<tool_call>python: print(6*7)</tool_call><|im_end|>",
    ):
        result = chat.run_tool(chat.parse_turn(turn))
        assert (result.status, result.observation.strip()) == ("success", "42"), result
