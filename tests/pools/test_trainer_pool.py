"""The trainer pool: calls run in one long-lived worker process, errors come back, and a dead
worker is replaced on the next call."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Iterator

import pytest

from libra_core.config.pools import LocalPoolConfig
from libra_core.pools import trainer
from libra_core.pools.base import ResizeRecord, WorkerDiedError
from libra_core.pools.local import LocalPool
from libra_core.pools.trainer import run_on_trainer, stop_trainer_pool, trainer_pid, warm_trainer

POOL = "trainer:test"


@pytest.fixture
def pool() -> Iterator[str]:
    yield POOL
    stop_trainer_pool(POOL)


def _loaded(module: str) -> bool:
    return module in sys.modules


def test_warming_starts_the_worker_and_imports_there(pool: str) -> None:
    cfg = LocalPoolConfig()
    assert trainer_pid(pool) is None
    warm_trainer(pool, cfg, 1, "colorsys")
    pid = trainer_pid(pool)
    assert pid is not None and pid != os.getpid()
    assert run_on_trainer(pool, cfg, 1, _loaded, "colorsys")
    assert not run_on_trainer(pool, cfg, 1, _loaded, "zipapp")  # what was not warmed is not loaded
    assert trainer_pid(pool) == pid
    with pytest.raises(ModuleNotFoundError):
        warm_trainer(pool, cfg, 1, "no_such_module_here")


def test_calls_run_in_one_other_process(pool: str) -> None:
    cfg = LocalPoolConfig()
    first = run_on_trainer(pool, cfg, 1, os.getpid)
    second = run_on_trainer(pool, cfg, 1, os.getpid)
    assert first == second != os.getpid()
    assert trainer_pid(pool) == first
    assert run_on_trainer(pool, cfg, 1, os.getenv, "OMP_NUM_THREADS") == "1"
    assert run_on_trainer(pool, cfg, 1, divmod, 17, 5) == (3, 2)


def test_errors_are_reraised_and_the_worker_survives(pool: str) -> None:
    cfg = LocalPoolConfig()
    pid = run_on_trainer(pool, cfg, 1, os.getpid)
    with pytest.raises(ZeroDivisionError):
        run_on_trainer(pool, cfg, 1, divmod, 1, 0)
    assert run_on_trainer(pool, cfg, 1, os.getpid) == pid


def test_a_dead_worker_fails_its_call_and_is_replaced(pool: str) -> None:
    cfg = LocalPoolConfig()
    pid = run_on_trainer(pool, cfg, 1, os.getpid)
    with pytest.raises(WorkerDiedError):
        run_on_trainer(pool, cfg, 1, os.kill, pid, signal.SIGKILL)
    assert trainer_pid(pool) is None
    new_pid = run_on_trainer(pool, cfg, 1, os.getpid)
    assert new_pid not in (pid, os.getpid())


def test_a_worker_that_died_between_calls_is_replaced_before_the_next(pool: str) -> None:
    """Killed while idle (an OOM kill, a stray signal), the worker still reported its pid, so the
    async rollout task warmed no replacement and the next update failed on it, ending the run."""
    import time

    cfg = LocalPoolConfig()
    pid = run_on_trainer(pool, cfg, 1, os.getpid)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while trainer_pid(pool) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trainer_pid(pool) is None  # the rollout task warms a replacement
    new_pid = run_on_trainer(pool, cfg, 1, os.getpid)  # not a WorkerDiedError: nothing was sent
    assert new_pid not in (pid, os.getpid())


def test_stop_ends_the_worker(pool: str) -> None:
    pid = run_on_trainer(pool, LocalPoolConfig(), 1, os.getpid)
    stop_trainer_pool(pool)
    assert trainer_pid(pool) is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


class _StartsThenFails(LocalPool):
    """A pool whose start fails after its worker is up (a failure past the pool's own clean-up)."""

    def start(self, size: int) -> ResizeRecord:
        super().start(size)
        raise RuntimeError("injected start failure")


def test_a_pool_whose_start_fails_is_stopped(pool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {p.pid for p in mp.active_children()}
    monkeypatch.setattr(trainer, "LocalPool", _StartsThenFails)
    with pytest.raises(RuntimeError, match="injected start failure"):
        run_on_trainer(pool, LocalPoolConfig(), 1, os.getpid)
    assert trainer_pid(pool) is None
    assert {p.pid for p in mp.active_children()} == before, "the failed pool's worker still runs"
    monkeypatch.undo()
    assert run_on_trainer(pool, LocalPoolConfig(), 1, divmod, 7, 2) == (3, 1)


def test_the_callers_threads_win_and_zero_leaves_them_to_threads_per_worker(pool: str) -> None:
    # The documented rule: a run passes training.threads (async, 0: half the cores), which wins over
    # pools.local.threads_per_worker; a caller passing 0 gets the setting (it got 1 until 2026-12-07).
    cfg = LocalPoolConfig(threads_per_worker=3)
    assert run_on_trainer(pool, cfg, 2, os.getenv, "OMP_NUM_THREADS") == "2"
    stop_trainer_pool(pool)
    assert run_on_trainer(pool, cfg, 0, os.getenv, "OMP_NUM_THREADS") == "3"
