"""The scheduler registry: `SchedulerConfig.type` -> a factory building that scheduler.

`build_scheduler` is the one way the rollout router and the trace evaluator get a scheduler. The
built-in names are registered explicitly below with `register_scheduler` (a duplicate name raises,
and so does a name `SchedulerConfig.type` cannot hold: a new scheduler adds its name to
`SchedulerType` in libra_core/config/scheduler.py, so that a config can select it). `oracle` reads
realised trajectory lengths, so it is only built when the caller says it replays a trace
(`allow_oracle=True`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from libra_core.config.models import SchedulerConfig
from libra_core.config.scheduler import SchedulerType
from libra_core.scheduling.base import Scheduler
from libra_core.scheduling.baselines import (
    InputLengthScheduler,
    LeastLoadScheduler,
    MLFQScheduler,
    OracleScheduler,
    RoundRobinScheduler,
    StaticScheduler,
)
from libra_core.scheduling.cmlfq import CMLFQScheduler

SchedulerFactory = Callable[[SchedulerConfig], Scheduler]

_REGISTRY: dict[str, SchedulerFactory] = {}
EVALUATION_ONLY = frozenset({"oracle"})


def register_scheduler(name: str, factory: SchedulerFactory) -> None:
    if name not in get_args(SchedulerType):
        raise ValueError(
            f"scheduler {name!r} is not a SchedulerConfig.type ({list(get_args(SchedulerType))}); "
            "add it to SchedulerType in libra_core/config/scheduler.py first"
        )
    if name in _REGISTRY:
        raise ValueError(f"scheduler {name!r} is already registered; pick another name")
    _REGISTRY[name] = factory


def scheduler_names(*, include_oracle: bool = True) -> list[str]:
    """Registered names in registration order (baselines first, then cmlfq, oracle last)."""
    names = [n for n in _REGISTRY if include_oracle or n not in EVALUATION_ONLY]
    return sorted(names, key=lambda n: (n in EVALUATION_ONLY, list(_REGISTRY).index(n)))


def build_scheduler(cfg: SchedulerConfig, *, allow_oracle: bool = False) -> Scheduler:
    """A fresh scheduler of type `cfg.type` over `cfg.num_buckets` buckets."""
    factory = _REGISTRY.get(cfg.type)
    if factory is None:
        raise ValueError(f"unknown scheduler type {cfg.type!r}; valid: {scheduler_names()}")
    if cfg.type in EVALUATION_ONLY and not allow_oracle:
        raise ValueError(
            f"scheduler {cfg.type!r} reads realised lengths and is for trace evaluation only; "
            f"use one of {scheduler_names(include_oracle=False)} in a run"
        )
    return factory(cfg)


for _name, _factory in (
    ("static", StaticScheduler),
    ("round_robin", RoundRobinScheduler),
    ("least_load", LeastLoadScheduler),
    ("mlfq", MLFQScheduler),
    ("input_length", InputLengthScheduler),
    ("cmlfq", CMLFQScheduler),
    ("oracle", OracleScheduler),
):
    register_scheduler(_name, _factory)
