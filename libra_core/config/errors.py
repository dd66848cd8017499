"""The config layer's one error type: every problem with a config, one line each.

Raised by the YAML reader (yaml_io.py), the override parser (overrides.py) and validation
(loader.py); the CLI prints `format_problems` as-is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OVERRIDES_SOURCE = "<overrides>"
DEFAULTS_SOURCE = "<defaults>"

_MAX_VALUE_REPR = 80


class ConfigError(Exception):
    """A user-facing config problem: what is wrong, where, and what is allowed.

    `problems` holds one human-readable line per problem (`stages.rollout.size: ...`); `source` is
    the file the config came from, or `<overrides>` / `<defaults>` when no file is involved.
    """

    def __init__(self, problems: Sequence[str], source: str) -> None:
        assert problems, "ConfigError needs at least one problem"
        self.problems: list[str] = list(problems)
        self.source: str = source
        super().__init__(format_problems(self))

    def __reduce__(self) -> tuple[Any, tuple[list[str], str]]:
        # Prefect and multiprocessing pickle exceptions; the default would call __init__(message).
        return (type(self), (self.problems, self.source))


def format_problems(err: ConfigError) -> str:
    """One line per problem, each prefixed by the source, for the CLI to print as-is."""
    return "\n".join(f"{err.source}: {problem}" for problem in err.problems)


def short_repr(value: Any) -> str:
    """`repr(value)`, cut to 80 characters, for a problem line."""
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_REPR else text[: _MAX_VALUE_REPR - 3] + "..."
