"""Edge cases of the calculator, arithmetic env protocol and answer checks (mutation-audit gaps)."""

from __future__ import annotations

from libra_core.envs.answer_check import exact_match, final_answer_text, token_f1
from libra_core.envs.arithmetic import ArithmeticEnv
from libra_core.envs.base import Problem
from libra_core.envs.calculator import Calculator


def test_calculator_rejects_ten_digit_operand() -> None:
    # Regression: operand pattern `\d{1,9}` widened to `\d+` accepted a 10-digit operand.
    assert Calculator()("1234567890*2").status == "failure"
    assert Calculator()("123456789*2").status == "success"


def test_early_answer_uses_latest_result() -> None:
    # Regression: early answer after 1 of 2 calls must be the first step's result 5, not the reference.
    segments = ArithmeticEnv().early_answer_demonstration(Problem("x", "((2+3)*4)", "20", 2), 1)
    assert segments[-1].text == "<|answer|>5<|eos|>"


def test_call_followed_by_answer_is_an_answer() -> None:
    # Regression: a tool call counts only when the turn ends with the call's close tag.
    action = ArithmeticEnv().parse_turn("<|call|>2+3<|/call|><|answer|>5<|eos|>")
    assert action.kind == "answer"
    assert action.answer == "5"


def test_final_answer_text_skips_escaped_brace() -> None:
    # Regression: an escaped `\}` inside a box closed the box early.
    assert final_answer_text(r"\boxed{a\}} and more") == r"\boxed{a\}}"


def test_token_f1_keeps_best_gold() -> None:
    # Regression: a later, worse gold answer overwrote the best F1 (1.0 from "Paris").
    assert token_f1("paris", ["Paris", "Paris France"]) == 1.0


def test_exact_match_drops_articles() -> None:
    # Regression: normalisation must drop articles, so "an apple" matches "apple".
    assert exact_match("an apple", ["apple"])
