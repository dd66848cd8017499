"""Python tool: runs model-written code in the sandbox and returns what it printed.

Used by `math_tools` (the model computes with Python) and `code` (the model runs its solution
against a test). The status is the sandbox's: `success` (exit 0), `failure` (exception, non-zero
exit, a limit other than time), `timeout` (CPU or wall limit). The observation is stdout on
success, otherwise the tail of stderr (the traceback's last lines say what went wrong), cut to
`max_observation_chars` - so payload sizes vary with what the code did, as C-MLFQ expects.
"""

from __future__ import annotations

import time

from libra_core.config.environments import SandboxConfig
from libra_core.envs.base import ToolResult
from libra_core.envs.sandbox import ExecutionResult, Sandbox

TIMEOUT_MESSAGE = "error: execution timed out"
EMPTY_OUTPUT = "(no output)"


def clip(text: str, limit: int) -> str:
    """At most `limit` characters: head and tail of longer texts (both ends carry information)."""
    if len(text) <= limit:
        return text
    head = limit // 2
    marker = "\n...\n"
    return text[:head] + marker + text[len(text) - (limit - head - len(marker)) :]


def observation_of(result: ExecutionResult, limit: int) -> str:
    """The text a model sees for a sandboxed run."""
    if result.status == "timeout":
        return clip(f"{TIMEOUT_MESSAGE} ({result.reason})\n{result.stdout}", limit).rstrip()
    if result.status == "success":
        return clip(result.stdout.rstrip(), limit) or EMPTY_OUTPUT
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    detail = "\n".join(lines[-3:]) if lines else f"exit code {result.exit_code} ({result.reason})"
    if result.reason == "output_limit":
        detail = "error: output limit exceeded"
    return clip(detail, limit)


class PythonTool:
    """Tool protocol (`libra_core.envs.base.Tool`); never raises, thread-safe."""

    name = "python"

    def __init__(self, sandbox_cfg: SandboxConfig | None = None, max_observation_chars: int = 400) -> None:
        self.sandbox = Sandbox(sandbox_cfg)
        self.max_observation_chars = max_observation_chars

    def __call__(self, arguments: str) -> ToolResult:
        start = time.perf_counter()
        result = self.sandbox.run_python(arguments)
        observation = observation_of(result, self.max_observation_chars)
        return ToolResult(self.name, result.status, observation, time.perf_counter() - start)
