"""Calculator tool: evaluates exactly one binary integer operation per call.

Anything else (two operations, parentheses, words, huge numbers) is a `failure` whose
observation explains the expected form, so failed calls return larger payloads than successful
ones: C-MLFQ later reads both the status and the payload size class.
"""

from __future__ import annotations

import re
import time

from libra_core.envs.base import ToolResult

MAX_OPERAND_DIGITS = 9
MAX_OPERAND = 10**MAX_OPERAND_DIGITS - 1  # largest operand magnitude a call may use
_OPERAND = rf"-?\d{{1,{MAX_OPERAND_DIGITS}}}"
_CALL = re.compile(rf"^\s*({_OPERAND})\s*([+\-*])\s*({_OPERAND})\s*$")
USAGE = "error: expected one operation a+b, a-b or a*b on integers"


class Calculator:
    name = "calculator"

    def __call__(self, arguments: str) -> ToolResult:
        start = time.perf_counter()
        match = _CALL.match(arguments)
        if match is None:
            return ToolResult(self.name, "failure", USAGE, time.perf_counter() - start)
        a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return ToolResult(self.name, "success", str(value), time.perf_counter() - start)
