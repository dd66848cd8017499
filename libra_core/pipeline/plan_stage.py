"""Plan stage: decide the pool sizes for this iteration.

The `static` planner returns the sizes written in `stages` of the config; the Global Resource
Planner replaces it later behind the same return type.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.config import LibraConfig


@dataclass(frozen=True)
class Plan:
    iteration: int
    rollout_instances: int
    trainer_workers: int
    planner: str


def make_plan(cfg: LibraConfig, iteration: int) -> Plan:
    if cfg.planner.type != "static":
        raise ValueError(f"unknown planner type {cfg.planner.type!r}; valid: ['static']")
    return Plan(iteration, cfg.stages.rollout.size, cfg.stages.update.size, cfg.planner.type)
