"""Plan stage: decide the pool sizes for this iteration.

`planner.type: static` returns the sizes written in `stages`. `libra` runs the Global Resource
Planner (libra_core.planner) on the run's hardware spec: it observes the previous iteration's
trajectories and measured stage times, and every `planner.replan_every` iterations proposes a plan
that is applied only when it pays for the move (at once, due or not, when the running plan cannot
run the recent trajectories: LibraPlanner.step). Each decision (kept or applied, with the numbers)
is appended to `<run>/planner/decisions.jsonl`, which the history and reports read.

The planner keeps state across iterations (its window, stage corrections, current plan and move
audit) in this process. A fresh process (a resumed run) rebuilds that state by replaying the run's
recorded iterations from the trajectory lake and the history (`LibraPlanner.catch_up`): the resumed
run keeps the plan it was running, instead of planning from scratch (an `initial` decision, and a
pool resize the replanning policy never weighed). A replayed decision that differs from the logged
one (the lake or the config changed) is logged as a warning. Decisions logged for the iteration the
run resumes at, or later, belong to an iteration that did not finish; they are dropped before it
runs again, so the log keeps one record per decision.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra_core.config import LibraConfig
from libra_core.data.atomic import atomic_path

log = logging.getLogger(__name__)


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
    return _read_decisions(decisions_path(run_dir))[0]


def _read_decisions(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records, and whether the last line was torn (ignored)."""
    if not path.exists():
        return [], False
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a JSON-lines decision log ({err})") from err
    except OSError as err:  # a folder of that name, no permission
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from err
    lines = [line for line in text.splitlines() if line.strip()]
    records: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if n < len(lines):
                raise ValueError(f"{path}: line {n} is not a JSON decision record ({e})") from e
            # the last line of a process killed while appending: the decision it was writing is
            # remade when its iteration runs again
            log.warning("%s: ignoring a torn last line (%d characters)", path, len(line))
            return records, True
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {n} is not a JSON decision record (not an object)")
        number = record.get("iteration")
        if not isinstance(number, int) or isinstance(number, bool):
            # a bare KeyError or a str/int comparison, naming no file (until 2026-12-07)
            raise ValueError(f"{path}: line {n} has no integer 'iteration' (got {number!r})")
        records.append(record)
    return records, False


def _history(run_dir: str) -> dict[int, dict[str, Any]]:
    from libra_core.data.history import read_history

    return {h["iteration"]: h for h in read_history(run_dir)}


def _observe(
    planner: Any,
    cfg: LibraConfig,
    run_dir: str,
    iteration: int,
    history: dict[int, dict[str, Any]] | None = None,
) -> None:
    from libra_core.data.io import lake_path, read_lake

    history = _history(run_dir) if history is None else history
    if iteration not in history or not lake_path(run_dir, iteration).exists():
        return
    lake = read_lake(run_dir, iteration)
    h = history[iteration]
    measured = {"rollout": h["rollout_s"], "update": h["update_s"]}
    if h["optimizer_steps"] == 0 or h["tokens_trained"] == 0:
        # A skipped update (no group with signal) took a moment and trained nothing: compared with
        # any training price it would teach the stage correction that updates are 5x cheaper.
        del measured["update"]
    # Rollout sampled every trajectory in the lake; the update trained only those dynamic sampling
    # and the staleness bound kept (up to twice the prompts it trains are sampled): the training
    # side is priced on that share of the tokens. Until 2026-12-07 on all of them.
    generated, trained = h["tokens_generated"], h["tokens_trained"]
    share = min(1.0, trained / generated) if generated > 0 else 1.0
    # The audit compares tokens per second of iteration, as the simulator's does: in async mode the
    # stages overlap, and their sum would read a move that balances them as a loss.
    planner.observe(
        lake,
        cfg.training.grpo.group_size,
        measured,
        iteration=iteration,
        period_s=h["iteration_s"],
        train_share=share,
    )


def drop_unfinished_decisions(run_dir: str | Path, iteration: int) -> list[dict[str, Any]]:
    """Remove logged decisions of `iteration` and later (an iteration that did not finish) and a
    torn last line; returns the records kept. The log is rewritten atomically. Called by the first
    plan stage of a process and by `apply_resume` (which a static planner's run also goes through)."""
    path = decisions_path(run_dir)
    records, torn = _read_decisions(path)
    kept = [r for r in records if r["iteration"] < iteration]
    if torn or len(kept) < len(records):
        with atomic_path(path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        log.info(
            "dropped %d planner decisions of unfinished iterations >= %d", len(records) - len(kept), iteration
        )
    return kept


def _catch_up(planner: Any, cfg: LibraConfig, run_dir: str, iteration: int) -> None:
    logged = drop_unfinished_decisions(run_dir, iteration)
    history = _history(run_dir)
    start = time.perf_counter()
    replayed = planner.catch_up(iteration, lambda k: _observe(planner, cfg, run_dir, k, history))
    if iteration > 1:
        log.info(
            "planner caught up on iterations 1-%d (%d decisions) in %.1fs",
            iteration - 1,
            len(replayed),
            time.perf_counter() - start,
        )
    got = [(d.iteration, d.action) for d in replayed]
    want = [(r["iteration"], r["action"]) for r in logged]
    if got != want:
        log.warning(
            "planner replay of iterations 1-%d made decisions %s, the run logged %s; continuing "
            "from the replayed state (did the trajectory lake, the history or the config change?)",
            iteration - 1,
            got,
            want,
        )


def _planner_for(cfg: LibraConfig, run_dir: str, iteration: int) -> Any:
    from libra_core.planner import LibraPlanner

    planner = _PLANNERS.get(run_dir)
    if planner is None:
        planner = LibraPlanner.from_config(cfg)
        _catch_up(planner, cfg, run_dir, iteration)
        _PLANNERS[run_dir] = planner  # only once caught up: a failed replay is redone next call
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
