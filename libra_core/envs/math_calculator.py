"""Calculator for word problems: evaluates one arithmetic expression on decimals.

The `math_tools` environment's light tool (the sandboxed Python tool is the heavy one). It accepts
what GSM8K's `<<48/2=24>>` annotations contain: numbers, + - * / // % **, parentheses and unary
minus, evaluated on the parsed syntax tree (no `eval`), with bounded exponents and magnitudes so a
call can never hang. Results are written the way GSM8K writes them: integers without a decimal
point, other values with up to 12 significant digits (0.3, 1e-7, 1e15). A comma is read only as a
thousands separator (1,000*3). Errors are `failure` observations that explain the accepted form, so
failed calls return longer payloads than successful ones.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import time
from collections.abc import Callable

from libra_core.envs.base import ToolResult

USAGE = "error: expected one arithmetic expression on numbers, e.g. (48+24)/2 or 0.2*50"
MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e30
SIGNIFICANT_DIGITS = 12  # float results: 0.1+0.2 is 0.3, 1e15+0.3 is 1e15, not 1000000000000000.25
COMMA = "error: a comma is read only as a thousands separator (1,000); give one expression, e.g. (48+24)/2"
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d,])")

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    pass


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        if not abs(node.value) <= MAX_MAGNITUDE:  # 1e400 is inf; a 200-digit literal is out of range too
            raise CalculatorError("error: number out of range")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"error: exponent {right} too large (at most {MAX_EXPONENT})")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("error: division by zero") from None
        if isinstance(value, complex) or not abs(value) <= MAX_MAGNITUDE:  # `not <=`: NaN too
            raise CalculatorError("error: result out of range")
        return value
    raise CalculatorError(USAGE)


def format_number(value: float) -> str:
    """GSM8K style: 24 not 24.0; 0.2 not 0.20000000000000001; 1e-07 is 1e-7, not 0."""
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:  # exact as an integer
        return str(int(value))
    text = f"{value:.{SIGNIFICANT_DIGITS}g}"  # no trailing zeros; exponent form below 1e-4, from 1e12
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else text


def evaluate(expression: str) -> str:
    """Value of `expression` as text; raises CalculatorError (message = observation) otherwise."""
    text = expression.strip().replace("$", "").replace("×", "*").replace("^", "**")
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
    if not text or len(text) > MAX_CHARS:
        raise CalculatorError(USAGE)
    if "," in text:  # (1,2) or 3,5: a tuple or a decimal comma, not one number
        raise CalculatorError(COMMA)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a lone surrogate ("\ud800") cannot be encoded
        raise CalculatorError(USAGE) from None
    return format_number(_eval(tree))


class MathCalculator:
    """Tool protocol (`libra_core.envs.base.Tool`): never raises; bad input is a `failure`."""

    name = "calculator"

    def __call__(self, arguments: str) -> ToolResult:
        start = time.perf_counter()
        try:
            observation, status = evaluate(arguments), "success"
        except CalculatorError as exc:
            observation, status = str(exc), "failure"
        except (OverflowError, MemoryError, RecursionError):
            observation, status = "error: result out of range", "failure"
        return ToolResult(self.name, status, observation, time.perf_counter() - start)  # type: ignore[arg-type]
