"""Arithmetic config: every call a demonstration makes must be one the calculator accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from libra_core.config import load_config
from libra_core.config.models import ArithmeticEnvConfig
from libra_core.envs.arithmetic import ArithmeticEnv
from libra_core.envs.base import TurnAction

STAGES_YAML = Path(__file__).resolve().parents[2] / "stages.yaml"
CALCULATOR_LIMIT = 999_999_999  # libra_core/envs/calculator.py: operands of at most 9 digits


@pytest.mark.parametrize(
    ("largest_ok", "max_ops", "operators"),
    [
        (13, 8, ("*",)),  # 13**8 < 10**9 <= 14**8
        (31, 6, ("+", "-", "*")),  # 31**6 < 10**9 <= 32**6
        (177, 4, ("*",)),
        (124_999_999, 8, ("+", "-")),
        (999_999_999, 1, ("+",)),
    ],
)
def test_max_operand_is_bounded_by_the_calculator_limit(
    largest_ok: int, max_ops: int, operators: tuple[str, ...]
) -> None:
    ops = {"operators": operators, "min_ops": max_ops, "max_ops": max_ops}
    # Just over the line: refused, naming both fields and the limit.
    with pytest.raises(ValidationError) as info:
        ArithmeticEnvConfig.model_validate({**ops, "max_operand": largest_ok + 1})
    message = str(info.value)
    assert f"max_operand ({largest_ok + 1})" in message and f"max_ops ({max_ops})" in message
    assert str(CALCULATOR_LIMIT) in message
    # On the line: accepted, and every call its demonstrations make is one the calculator accepts.
    env = ArithmeticEnv(ArithmeticEnvConfig.model_validate({**ops, "max_operand": largest_ok}))
    for problem in env.sample_problems(30, 0):
        for a, op, b, value in env.solution_steps(problem):
            result = env.run_tool(TurnAction("tool_call", tool="calculator", arguments=f"{a}{op}{b}"))
            assert (result.status, result.observation) == ("success", str(value)), problem.question
    # The defaults, stages.yaml and the configs tests use still validate.
    assert ArithmeticEnvConfig().max_operand == 9
    assert load_config(STAGES_YAML, []).environment.type == "arithmetic"
    ArithmeticEnvConfig(max_ops=1, max_operand=1, operators=("+",))
