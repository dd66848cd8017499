"""The rollout pool: a set of vLLM instances serving the current policy.

Started once per experiment by the flow (engine start-up costs seconds), resized by the plan
stage's output, and stopped when the experiment ends or fails. Tasks never hold engine handles:
they pass the pool id and instance URLs (plain strings); this module keeps the processes in a
per-process registry and kills them at interpreter exit so no server outlives its run. A process
killed outright (SIGKILL) runs none of that: each instance's pid is also recorded under
`<log_dir>/engines/` (rollout/engine_registry.py), and the next process that creates a pool on the
same folder (a resumed run) first stops the engines whose owner is gone.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from libra_core.config.models import VllmEngineConfig
from libra_core.rollout import engine_registry
from libra_core.rollout.client import EngineRequestError
from libra_core.rollout.vllm_server import VllmServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolInfo:
    """Serializable description of a running pool, safe to pass between tasks."""

    pool_id: str
    urls: tuple[str, ...]
    instance_ids: tuple[str, ...]
    resize_s: float  # wall time of the last start/resize


class RolloutPool:
    def __init__(
        self,
        pool_id: str,
        model_dir: Path,
        engine: VllmEngineConfig,
        log_dir: Path,
        *,
        max_model_len: int,
        dtype: str,
    ) -> None:
        self.pool_id, self.model_dir, self.engine, self.log_dir = pool_id, model_dir, engine, log_dir
        self.max_model_len, self.dtype = max_model_len, dtype
        self.servers: list[VllmServer] = []
        self.pid_dir = log_dir / "engines"  # engine_registry's pid files of this pool's instances
        self._next_index = 0
        # Policy version the instances serve: set when the pool starts, advanced by each weight sync.
        # The agent loop reads it at the start of every turn to label the tokens it generates.
        self.served_version = 0
        # URLs of instances that stopped answering (a request timed out) while their process ran:
        # the next `live_pool` replaces them, as it does instances whose process exited.
        self.unresponsive: set[str] = set()

    def resize(self, size: int) -> float:
        """Start or stop instances until `size` are healthy; return the wall seconds it took."""
        assert size >= 1, "a rollout pool needs at least one instance"
        start = time.monotonic()
        while len(self.servers) > size:
            self._stop(self.servers.pop())
        new: list[VllmServer] = []
        try:
            while len(self.servers) + len(new) < size:
                iid = f"{self.pool_id}-{self._next_index}"
                self._next_index += 1
                port = self.engine.base_port + self._next_index - 1 if self.engine.base_port else 0
                server = VllmServer(
                    iid,
                    self.model_dir,
                    self.engine,
                    self.log_dir / f"{iid}.log",
                    self.max_model_len,
                    self.dtype,
                    port,
                )
                new.append(server)  # before it starts: a failure from here on stops it
                server.start()
                assert server.process is not None
                engine_registry.record(self.pid_dir, iid, server.process.pid)
            deadline = time.monotonic() + self.engine.startup_timeout_s
            for server in new:
                server.wait_healthy(deadline)
        except BaseException:
            # Also on KeyboardInterrupt or a termination signal (a run cancelled while its engines
            # start), or a later engine failing to spawn: these processes are not in the pool yet,
            # so nothing else would stop them.
            for server in new:
                self._stop(server)
            raise
        self.servers += new
        return time.monotonic() - start

    def _stop(self, server: VllmServer) -> None:
        server.stop()
        engine_registry.forget(self.pid_dir, server.instance_id)

    def info(self, resize_s: float) -> PoolInfo:
        return PoolInfo(
            self.pool_id,
            tuple(s.url for s in self.servers),
            tuple(s.instance_id for s in self.servers),
            resize_s,
        )

    def stop(self) -> None:
        for server in self.servers:  # all at once: a cancelled run has a bounded grace period
            server.terminate()
        for server in self.servers:
            self._stop(server)
        self.servers = []


_POOLS: dict[str, RolloutPool] = {}
_LOCK = threading.Lock()


def _drop_dead(pool: RolloutPool) -> int:
    """Stop and forget instances whose process exited or that were reported unresponsive (logging
    why); return how many."""
    dead = [s for s in pool.servers if not s.alive() or s.url in pool.unresponsive]
    for server in dead:
        why = "died" if not server.alive() else "stopped answering (a request timed out)"
        log.warning("rollout instance %s %s; replacing it\n%s", server.instance_id, why, server.log_tail(10))
        pool.servers.remove(server)
        pool._stop(server)  # kills a hung group, reaps the exited process, drops its pid file
    pool.unresponsive.clear()
    return len(dead)


def mark_unresponsive(pool_id: str, url: str) -> None:
    """Record that the pool's instance at `url` did not answer a request in time. Called by the
    stages' tasks when a rollout fails with an unresponsive engine, before the task's retry; the
    retry's `live_pool` then stops that instance and starts a replacement. A URL the pool does not
    hold (already replaced, or another pool's) is ignored."""
    with _LOCK:
        pool = _POOLS.get(pool_id)
        if pool is not None and any(s.url == url for s in pool.servers):
            pool.unresponsive.add(url)


def ensure_rollout_pool(
    pool_id: str,
    model_dir: Path,
    engine: VllmEngineConfig,
    log_dir: Path,
    *,
    size: int,
    max_model_len: int,
    dtype: str,
    version: int = 0,
) -> PoolInfo:
    """Create the pool if needed and resize it to `size` healthy instances. `version` is the policy
    version in `model_dir`; it becomes the served version of a pool created by this call."""
    with _LOCK:
        pool = _POOLS.get(pool_id)
        if pool is None:
            pool = _POOLS[pool_id] = RolloutPool(
                pool_id, model_dir, engine, log_dir, max_model_len=max_model_len, dtype=dtype
            )
            pool.served_version = version
            # engines of an earlier process on this folder that was killed before it could stop them
            reaped = engine_registry.reap_orphans(pool.pid_dir)
            if reaped:
                log.warning("stopped %d orphaned engines of an earlier process: %s", len(reaped), reaped)
        _drop_dead(pool)
        resize_s = pool.resize(size)
        return pool.info(resize_s)


@contextmanager
def replacing_unresponsive(pool_id: str) -> Iterator[None]:
    """Run a stage against the pool's engines; if it fails because one of them stopped answering,
    mark that engine for replacement (`mark_unresponsive`) and re-raise. The fault boundary of the
    tasks that talk to engines (rollout, eval, sync), whose declared retry then gets a new one."""
    try:
        yield
    except EngineRequestError as err:
        if err.unresponsive and err.url is not None:
            mark_unresponsive(pool_id, err.url)
        raise


def live_pool(pool_id: str) -> PoolInfo:
    """The pool's current instances, replacing any that died or were marked unresponsive (same
    size). Called by the stages that talk to engines, so a task retry after an engine crash or hang
    runs against a healthy pool."""
    with _LOCK:
        pool = _POOLS.get(pool_id)
        if pool is None:
            raise RuntimeError(f"rollout pool {pool_id!r} is not running; the plan stage starts it")
        size = max(len(pool.servers), 1)
        dead = _drop_dead(pool)
        return pool.info(pool.resize(size) if dead else 0.0)


def served_version(pool_id: str) -> int:
    """The policy version the pool's instances serve now (read by the agent loop every turn)."""
    pool = _POOLS.get(pool_id)
    if pool is None:
        raise RuntimeError(f"rollout pool {pool_id!r} is not running")
    return pool.served_version


def set_served_version(pool_id: str, version: int) -> None:
    """Record that a weight sync finished: the instances now serve `version`."""
    with _LOCK:
        pool = _POOLS.get(pool_id)
        if pool is None:
            raise RuntimeError(f"rollout pool {pool_id!r} is not running")
        assert version >= pool.served_version, (
            f"served version going back: {pool.served_version} -> {version}"
        )
        pool.served_version = version


def stop_rollout_pool(pool_id: str) -> None:
    with _LOCK:
        pool = _POOLS.pop(pool_id, None)
    if pool is not None:
        pool.stop()


@atexit.register
def _stop_all() -> None:
    for pool_id in list(_POOLS):
        stop_rollout_pool(pool_id)
