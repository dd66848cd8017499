"""The trainer pool: a long-lived worker process the update stage runs in.

In the async pipeline the update of iteration i overlaps the rollout of iteration i+1. Run inside
the flow's process, the two would share one interpreter lock: the trainer's Python between torch
ops and the agent loop's client code (tool calls, token bookkeeping, HTTP) would take turns, and
on a small model both are mostly Python. So the update runs in a worker of a local pool, spawned
once per run and kept until the run ends. The worker holds nothing between calls (the update loads
the policy and optimizer state from the run folder and writes them back), so a crashed worker is
replaced on the next call without losing anything. Sync mode keeps the update in the flow's
process: nothing overlaps there, so a pipe hop would buy nothing.

Like the rollout pool, workers live in a per-process registry keyed by the run's pool id and are
stopped at interpreter exit.

Threads. The worker's torch/OMP thread count is the `threads` its caller passes; `pools.local`'s
`threads_per_worker` is used only when that is 0 (the caller leaves the choice open). The update
stage passes `training.threads`, or, when that is 0 in the async pipeline, half the cores
(libra_core/pipeline/cpu_split.py), and the update sets torch's threads to the same number, so in a
run `training.threads` decides and `threads_per_worker` does not apply to the trainer (until
2026-12-07 it was replaced without a word, and a `threads` of 0 meant 1 thread, not the setting).
"""

from __future__ import annotations

import atexit
import importlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from libra_core.config.pools import LocalPoolConfig
from libra_core.pools.base import WorkerDiedError
from libra_core.pools.local import LocalPool

T = TypeVar("T")

_POOLS: dict[str, LocalPool] = {}
_LOCK = threading.Lock()


def _pool(pool_id: str, cfg: LocalPoolConfig, threads: int) -> LocalPool:
    with _LOCK:
        pool = _POOLS.get(pool_id)
        if pool is not None:
            return pool
        if threads > 0:
            cfg = cfg.model_copy(update={"threads_per_worker": threads})
        pool = LocalPool(cfg)
        try:
            pool.start(1)
        except BaseException:
            pool.stop()  # the registry does not hold it: nothing else would stop what it started
            raise
        _POOLS[pool_id] = pool
        return pool


def run_on_trainer(
    pool_id: str, cfg: LocalPoolConfig, threads: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any
) -> T:
    """Run `fn(*args, **kwargs)` in the pool's trainer process (started on first use, with
    `threads` torch/OMP threads, or `cfg.threads_per_worker` when `threads` is 0; a running
    worker keeps the count it started with) and return its result; its exceptions are re-raised here. A
    worker that died between calls (killed while idle) is replaced before the call is sent: until
    2026-12-06 the call went to the dead worker and failed, and with it the run's update."""
    pool = _pool(pool_id, cfg, threads)
    if trainer_pid(pool_id) is None:
        stop_trainer_pool(pool_id)
        pool = _pool(pool_id, cfg, threads)
    try:
        result: T = pool.run(pool.worker_ids[0], fn, *args, **kwargs)
    except WorkerDiedError:
        stop_trainer_pool(pool_id)  # the next call starts a new worker
        raise
    return result


def _import(module: str) -> None:
    importlib.import_module(module)


def warm_trainer(pool_id: str, cfg: LocalPoolConfig, threads: int, module: str) -> None:
    """Start the pool's trainer process and import `module` there, so the first update pays for
    neither the spawn nor the imports (call it while the rollout engines start)."""
    run_on_trainer(pool_id, cfg, threads, _import, module)


def trainer_pid(pool_id: str) -> int | None:
    """Process id of the pool's trainer worker, or None when none is running (a dead worker's pid
    was returned until 2026-12-06, so the async rollout task never warmed a replacement)."""
    pool = _POOLS.get(pool_id)
    if pool is None or pool.size == 0:
        return None
    health = pool.health()[pool.worker_ids[0]]
    return None if health.state == "dead" else health.pid


def stop_trainer_pool(pool_id: str) -> None:
    with _LOCK:
        pool = _POOLS.pop(pool_id, None)
    if pool is not None:
        pool.stop()


@atexit.register
def _stop_all() -> None:
    for pool_id in list(_POOLS):
        stop_trainer_pool(pool_id)
