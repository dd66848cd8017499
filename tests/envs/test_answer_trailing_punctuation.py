"""A bare final answer that ends a sentence (`72.`, `1,000.`, `72,`) is the number, not the string
"72.": until 2026-12-07 it was boxed with its full stop, parsed as a string and a correct answer
scored `well_formed` (0.1) instead of `correct`."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config.environments import MathToolsEnvConfig
from libra_core.envs.answer_check import math_equivalent, parse_math
from libra_core.envs.registry import build_environment

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.mark.parametrize(
    ("reference", "answer"),
    [
        ("72", "72."),
        ("72", "72,"),
        ("72", "72;"),
        ("72", "72:"),
        ("72", "72.\n"),
        ("72", "**72.**"),
        ("72", "**72**."),
        ("-3", "-3."),
        ("1000", "1,000."),
        ("\\frac{1}{2}", "1/2."),
        ("3.5", "3.5."),
        ("(1,2)", "(1,2)."),
    ],
)
def test_a_bare_answer_with_a_trailing_stop_is_correct(reference: str, answer: str) -> None:
    assert math_equivalent(reference, answer) is True


@pytest.mark.parametrize(
    ("reference", "answer", "expected"),
    [
        ("72", "71.", False),  # a wrong number stays wrong (well formed)
        ("72.5", "72.5", True),  # a decimal point is no full stop
        ("72", "72.5", False),
        ("72", "The answer is 72.", True),  # prose is read as before
        ("72", "The answer is 71.", False),
        ("72", "\\boxed{72}.", True),
        ("72", "$72$.", True),
    ],
)
def test_decimals_prose_and_delimited_answers_read_as_before(
    reference: str, answer: str, expected: bool
) -> None:
    assert math_equivalent(reference, answer) is expected


def test_the_stop_is_not_part_of_the_parsed_value() -> None:
    assert [str(v) for v in parse_math("72.")] == ["72", "72"]
    assert [str(v) for v in parse_math("1,000.")] == ["1000", "1,000"]


@pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_math_tools_rewards_a_bare_answer_with_a_full_stop_as_correct() -> None:
    # Through the environment's reward, which checks in the answer worker under its deadline.
    env = build_environment(MathToolsEnvConfig(type="math_tools", files=("gsm8k/test.jsonl",)))
    weights = env.cfg.reward
    assert env.reward("72", "72.") == weights.correct
    assert env.reward("72", "71.") == weights.well_formed
    markers_turn = env.parse_turn("<|answer|>72.<|eos|>")
    assert env.reward("72", markers_turn.answer) == weights.correct
