"""The rollout pool: a set of vLLM instances serving the current policy.

Started once per experiment by the flow (engine start-up costs seconds), resized by the plan
stage's output, and stopped when the experiment ends or fails. Tasks never hold engine handles:
they pass the pool id and instance URLs (plain strings); this module keeps the processes in a
per-process registry and kills them at interpreter exit so no server outlives its run. A process
killed outright (SIGKILL) runs none of that: each instance's pid is also recorded under
`<log_dir>/engines/` (rollout/engine_registry.py), and the next process that creates a pool on the
same folder (a resumed run) first stops the engines whose owner is gone. Sooner than that, each
engine's watchdog (rollout/engine_watchdog.py) stops it within a second of its owner's death.

Locks: the module lock guards the registry of pools and each pool's small state (served version,
unresponsive marks, the list of servers); it is never held while an engine starts or stops, which
takes seconds to minutes. Each pool's own `lock` serialises what changes its set of engines
(resize, replacement, the record of a new served version), so two stages that find the same dead
engine do not both replace it.

Every instance serves the pool's `served_version`: one started while the policy folder is ahead
of it (the async pipeline's update has written the next version, its sync has not run yet) starts
from a copy of the served version (served_policy.py); one started while a sync runs is reloaded by
`set_served_version` with the version that sync sets.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from libra_core.config.models import VllmEngineConfig
from libra_core.pools.served_policy import ServedPolicy, remove_stale
from libra_core.rollout import engine_registry
from libra_core.rollout.client import EngineClient, EngineRequestError, last_reload
from libra_core.rollout.vllm_server import EngineStartError, VllmServer

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
        self.lock = threading.Lock()  # one change of the set of engines at a time (module docstring)
        self.closed = False  # stopped: a resize still starting engines stops them instead
        self.served = ServedPolicy(model_dir, self.pid_dir)
        # Instances started since the last `set_served_version`, with the time they joined: the
        # sync that sets the next version may have listed the pool's URLs before they joined.
        self.joined: dict[str, float] = {}

    def resize(self, size: int) -> float:
        """Start or stop instances until `size` are healthy; return the wall seconds it took. The
        caller holds `self.lock`. New instances load the served version (`ServedPolicy.start_dir`)
        and each binds its CPU threads to a slot no running instance uses."""
        assert size >= 1, "a rollout pool needs at least one instance"
        start = time.monotonic()
        while len(self.servers) > size:
            with _LOCK:
                server = self.servers.pop()
            self._stop(server)
        new: list[VllmServer] = []
        try:
            while len(self.servers) + len(new) < size:
                iid = f"{self.pool_id}-{self._next_index}"
                self._next_index += 1
                port = self.engine.base_port + self._next_index - 1 if self.engine.base_port else 0
                if port > 65535:  # replacements take the next ports: a raw OverflowError in bind()
                    raise EngineStartError(
                        f"instance {iid} would take port {port}: rollout.engine.base_port "
                        f"{self.engine.base_port} + {self._next_index - 1} instances started passes "
                        "65535; lower base_port, or use 0 for free ports"
                    )
                taken = {s.cpu_slot for s in [*self.servers, *new]}
                server = VllmServer(
                    iid,
                    self.served.start_dir(),
                    self.engine,
                    self.log_dir / f"{iid}.log",
                    self.max_model_len,
                    self.dtype,
                    port,
                    cpu_slot=next(i for i in itertools.count() if i not in taken),
                )
                new.append(server)  # before it starts: a failure from here on stops it
                server.start()
                assert server.process is not None
                engine_registry.record(self.pid_dir, iid, server.process.pid)
            deadline = time.monotonic() + self.engine.startup_timeout_s
            for server in new:
                server.wait_healthy(deadline)
            with _LOCK:
                closed = self.closed
                if not closed:
                    self.servers = [*self.servers, *new]
                    self.joined |= {s.instance_id: time.monotonic() for s in new}
            if closed:
                raise RuntimeError(f"rollout pool {self.pool_id!r} was stopped while its engines started")
        except BaseException:
            # Also on KeyboardInterrupt or a termination signal (a run cancelled while its engines
            # start), or a later engine failing to spawn: these processes are not in the pool yet,
            # so nothing else would stop them.
            for server in new:
                self._stop(server)
            raise
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
        with _LOCK:
            self.closed = True
            servers, self.servers = self.servers, []
        for server in servers:  # all at once: a cancelled run has a bounded grace period
            server.terminate()
        for server in servers:
            self._stop(server)
        self.served.discard()


_POOLS: dict[str, RolloutPool] = {}
_LOCK = threading.Lock()


def _drop_dead(pool: RolloutPool) -> int:
    """Stop and forget instances whose process exited or that were reported unresponsive (logging
    why); return how many. The caller holds `pool.lock`; the stops (up to 15 s for a group that
    ignores SIGTERM) run outside the module lock."""
    with _LOCK:
        dead = [s for s in pool.servers if not s.alive() or s.url in pool.unresponsive]
        pool.servers = [s for s in pool.servers if s not in dead]
        pool.unresponsive.clear()
    for server in dead:
        why = "died" if not server.alive() else "stopped answering (a request timed out)"
        log.warning("rollout instance %s %s; replacing it\n%s", server.instance_id, why, server.log_tail(10))
        pool._stop(server)  # kills a hung group, reaps the exited process, drops its pid file
    return len(dead)


def _pool(pool_id: str) -> RolloutPool:
    with _LOCK:
        pool = _POOLS.get(pool_id)
    if pool is None:
        raise RuntimeError(f"rollout pool {pool_id!r} is not running; the plan stage starts it")
    return pool


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
        created = pool is None
        if pool is None:
            pool = _POOLS[pool_id] = RolloutPool(
                pool_id, model_dir, engine, log_dir, max_model_len=max_model_len, dtype=dtype
            )
            pool.served_version = version
    with pool.lock:
        if created:
            # engines of an earlier process on this folder that was killed before it could stop them
            reaped = engine_registry.reap_orphans(pool.pid_dir)
            if reaped:
                log.warning("stopped %d orphaned engines of an earlier process: %s", len(reaped), reaped)
            remove_stale(pool.pid_dir)
            pool.served.record(version)
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
    runs against a healthy pool. A replacement serves the pool's served version (module docstring)."""
    pool = _pool(pool_id)
    with pool.lock:
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
    """Record that a weight sync finished: the instances now serve `version`, which the pool's
    policy folder holds. Called by the sync stage after it reloaded every instance `live_pool` gave
    it. An instance that joined after that list was taken (a rollout retry replaced an engine while
    the sync ran) and that this process has not reloaded since it joined is reloaded here first,
    from the folder; a replacement still starting is waited for. The folder is then recorded as the
    served policy that later replacements start from."""
    pool = _pool(pool_id)
    with pool.lock:
        served = pool.served_version
        assert version >= served, f"served version going back: {served} -> {version}"
        for server in pool.servers:
            joined_at = pool.joined.get(server.instance_id)
            if joined_at is not None and (last_reload(server.url) or float("-inf")) < joined_at:
                log.info("reloading %s, which joined the pool during the weight sync", server.instance_id)
                client = EngineClient(server.url, timeout_s=pool.engine.request_timeout_s)
                client.swap_weights(str(pool.model_dir))
        with _LOCK:
            pool.served_version = version
            pool.joined.clear()
        pool.served.record(version)


def stop_rollout_pool(pool_id: str) -> None:
    with _LOCK:
        pool = _POOLS.pop(pool_id, None)
    if pool is not None:
        pool.stop()


@atexit.register
def _stop_all() -> None:
    for pool_id in list(_POOLS):
        stop_rollout_pool(pool_id)
