"""Registry of environments keyed by the config's `environment.type`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from libra_core.envs.base import Environment

_REGISTRY: dict[str, Callable[[Any], Environment]] = {}
# The rollout's threads may make the first lookup together: two saw the builtins missing and the
# second raised "already registered" (until 2026-12-07). Reentrant: `_ensure_builtins` registers.
_LOCK = threading.RLock()


def register_environment(name: str, factory: Callable[[Any], Environment]) -> None:
    with _LOCK:
        if name in _REGISTRY:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = factory


def environment_factory(name: str) -> Callable[[Any], Environment]:
    """The factory registered as `name`, without building anything (the warm-up recipe's digest
    reads which module it names: model/prepare.py)."""
    _ensure_builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown environment type {name!r}; valid: {sorted(_REGISTRY)}")
    return factory


def build_environment(cfg: Any) -> Environment:
    """Build the environment for an environment config (anything with a `type` field)."""
    return environment_factory(cfg.type)(cfg)


def registered_environments() -> list[str]:
    _ensure_builtins()
    return sorted(_REGISTRY)


def _ensure_builtins() -> None:
    with _LOCK:
        if "arithmetic" not in _REGISTRY:
            from libra_core.envs.arithmetic import ArithmeticEnv

            register_environment("arithmetic", ArithmeticEnv)
        if "math_tools" not in _REGISTRY:
            # Data-backed environments (docs/environments.md); imported lazily: they load datasets.
            register_environment("math_tools", _math_tools)
            register_environment("search", _search)
            register_environment("code", _code)


def _math_tools(cfg: Any) -> Environment:
    from libra_core.envs.math_tools import MathToolsEnv

    return MathToolsEnv(cfg)


def _search(cfg: Any) -> Environment:
    from libra_core.envs.search import SearchEnv

    return SearchEnv(cfg)


def _code(cfg: Any) -> Environment:
    from libra_core.envs.code import CodeEnv

    return CodeEnv(cfg)
