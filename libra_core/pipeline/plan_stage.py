"""Plan stage: decide the pool sizes for this iteration.

`planner.type: static` returns the sizes written in `stages`. `libra` runs the Global Resource
Planner (libra_core.planner) on the run's hardware spec: it observes the previous iteration's
trajectories and measured stage times, and every `planner.replan_every` iterations proposes a plan
that is applied only when it pays for the move. Each decision (kept or applied, with the numbers)
is appended to `<run>/planner/decisions.jsonl`, which the history and reports read.

The planner keeps state across iterations (its window and current plan) in this process; a fresh
process (a resumed run) rebuilds it by replaying the last `window_iterations` iterations from the
trajectory lake and the history.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra_core.config import LibraConfig


@dataclass(frozen=True)
class Plan:
    iteration: int
    rollout_instances: int
    trainer_workers: int
    planner: str
    predicted_iteration_s: float | None = None  # the cost model's T_iter for this plan (libra only)
    decision: str | None = None  # initial | keep | apply when a (re)plan happened this iteration


_PLANNERS: dict[str, Any] = {}
_OBSERVED: dict[str, int] = {}  # run -> last iteration fed to its planner
_LOCK = threading.Lock()


def decisions_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "planner" / "decisions.jsonl"


def read_decisions(run_dir: str | Path) -> list[dict[str, Any]]:
    path = decisions_path(run_dir)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _observe(planner: Any, cfg: LibraConfig, run_dir: str, iteration: int) -> None:
    from libra_core.data.history import read_history
    from libra_core.data.io import lake_path, read_lake

    history = {h["iteration"]: h for h in read_history(run_dir)}
    if iteration not in history or not lake_path(run_dir, iteration).exists():
        return
    lake = read_lake(run_dir, iteration)
    h = history[iteration]
    measured = {"rollout": h["rollout_s"], "update": h["update_s"]}
    planner.observe(lake, cfg.training.grpo.group_size, measured, iteration=iteration)


def _planner_for(cfg: LibraConfig, run_dir: str, iteration: int) -> Any:
    from libra_core.planner import LibraPlanner

    planner = _PLANNERS.get(run_dir)
    if planner is None:
        planner = _PLANNERS[run_dir] = LibraPlanner.from_config(cfg)
        first = max(1, iteration - cfg.planner.window_iterations)
        for past in range(first, iteration):
            _observe(planner, cfg, run_dir, past)
        _OBSERVED[run_dir] = iteration - 1
    elif _OBSERVED.get(run_dir, 0) < iteration - 1:
        _observe(planner, cfg, run_dir, iteration - 1)
        _OBSERVED[run_dir] = iteration - 1
    return planner


def make_plan(cfg: LibraConfig, iteration: int, run_dir: str | None = None) -> Plan:
    if cfg.planner.type == "static":
        return Plan(iteration, cfg.stages.rollout.size, cfg.stages.update.size, "static")
    if cfg.planner.type != "libra":
        raise ValueError(f"unknown planner type {cfg.planner.type!r}; valid: ['libra', 'static']")
    assert run_dir is not None, "the libra planner needs the run folder (trajectory lake, history)"
    with _LOCK:
        planner = _planner_for(cfg, run_dir, iteration)
        chosen, decision = planner.step(iteration)
    if decision is not None:
        path = decisions_path(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(decision.as_record()) + "\n")
    instances = sum(g.instances for g in chosen.rollout.groups)
    return Plan(
        iteration,
        rollout_instances=max(1, instances),
        trainer_workers=max(1, chosen.train.layout.dp),
        planner="libra",
        predicted_iteration_s=chosen.t_iter_s,
        decision=None if decision is None else decision.action,
    )
