"""Routing of rollout requests to instances (the slot C-MLFQ will fill).

The rollout stage asks the router once per trajectory at admission (`route`) and gets an index into
its instance list. `static` keeps everything on the first (shortest-work) instance; `round_robin`
spreads requests evenly. Both are reference implementations for the scheduler interface that the
C-MLFQ work extends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol


class Router(Protocol):
    def route(self, request: object) -> int: ...


class StaticRouter:
    def __init__(self, num_instances: int) -> None:
        assert num_instances >= 1
        self.num_instances = num_instances

    def route(self, request: object) -> int:
        return 0


class RoundRobinRouter:
    def __init__(self, num_instances: int) -> None:
        assert num_instances >= 1
        self._cycle = itertools.cycle(range(num_instances))

    def route(self, request: object) -> int:
        return next(self._cycle)


ROUTERS: dict[str, Callable[[int], Router]] = {"static": StaticRouter, "round_robin": RoundRobinRouter}


def build_router(kind: str, num_instances: int) -> Router:
    try:
        return ROUTERS[kind](num_instances)
    except KeyError:
        raise ValueError(f"unknown scheduler type {kind!r}; valid: {sorted(ROUTERS)}") from None
