"""Ray worker pool: one Ray actor per worker, with explicit CPU/GPU resource requests.

The multi-node backend: Ray places the actors, this module only starts, addresses and stops them.
It connects to `address` when one is configured, and otherwise starts (and later shuts down) a local
cluster of `local_num_cpus` CPUs. `ray` is imported lazily, so configs and CLIs that never select
this backend do not pay for it, and a missing install raises a clear error naming the extra.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from libra_core.config.pools import RayPoolConfig
from libra_core.pools.base import (
    ResizeRecord,
    WorkerDiedError,
    WorkerHealth,
    WorkerPool,
    timed_resize,
)

log = logging.getLogger(__name__)


def _make_actor_class(ray: Any) -> Any:
    """The actor: calls run one at a time, in order (like a local worker); `pid` has its own thread
    (a concurrency group) so a health probe is answered while a long call is running."""

    @ray.remote(concurrency_groups={"calls": 1, "probe": 1})
    class _Actor:
        @ray.method(concurrency_group="calls")
        def call(
            self, worker_id: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            try:
                return fn(*args, **kwargs)
            except (Exception, SystemExit):  # SystemExit ends the actor: WorkerDiedError
                raise
            except BaseException as exc:  # noqa: BLE001 - would reach the driver as itself
                # As the local pool: a KeyboardInterrupt or a custom BaseException of the call must
                # not escape the driver's `except Exception` handlers.
                raise RuntimeError(f"worker {worker_id}: the call raised {exc!r}") from None

        @ray.method(concurrency_group="probe")
        def pid(self) -> int:
            return os.getpid()

    return _Actor


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "pools.type is 'ray' but ray is not installed; install the `ray` extra "
            "(pip install 'libra[ray]') or set pools.type to 'local'"
        ) from exc
    return ray


class RayPool(WorkerPool):
    type_name = "ray"

    def __init__(self, cfg: RayPoolConfig | None = None) -> None:
        self.cfg = cfg or RayPoolConfig()
        self._actors: dict[str, Any] = {}
        self._pids: dict[str, int] = {}
        self._next_index = 0
        self._owns_cluster = False
        self._actor_cls: Any = None

    def _ensure_ray(self) -> Any:
        ray = _import_ray()
        if not ray.is_initialized():
            if self.cfg.address is None:
                ray.init(
                    num_cpus=self.cfg.local_num_cpus,
                    include_dashboard=False,
                    namespace=self.cfg.namespace,
                    log_to_driver=False,
                )
                self._owns_cluster = True
            else:
                ray.init(address=self.cfg.address, namespace=self.cfg.namespace, log_to_driver=False)
        if self._actor_cls is None:
            self._actor_cls = _make_actor_class(ray)
        return ray

    def start(self, size: int) -> ResizeRecord:
        assert not self._actors, "the pool is already running; use resize()"
        return self.resize(size)

    def stop(self) -> None:
        if self._actors:
            ray = _import_ray()
            for worker_id in list(reversed(self._actors)):
                ray.kill(self._actors.pop(worker_id))
                self._pids.pop(worker_id, None)
        if self._owns_cluster:
            _import_ray().shutdown()
            self._owns_cluster = False
            self._actor_cls = None

    def resize(self, size: int) -> ResizeRecord:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        ray = self._ensure_ray()
        started_at, t0, from_size = time.time(), time.perf_counter(), self.size
        removed: list[str] = []
        while self.size > size:
            worker_id = self.worker_ids[-1]
            ray.kill(self._actors.pop(worker_id))
            self._pids.pop(worker_id, None)
            removed.append(worker_id)
        added: list[str] = []
        try:
            while self.size < size:
                worker_id = f"w{self._next_index}"
                self._next_index += 1
                self._actors[worker_id] = self._actor_cls.options(
                    num_cpus=self.cfg.num_cpus_per_worker,
                    num_gpus=self.cfg.num_gpus_per_worker,
                ).remote()
                added.append(worker_id)
            try:
                probes = [self._actors[w].pid.remote() for w in added]
                pids = ray.get(probes, timeout=self.cfg.start_timeout_s)
            except ray.exceptions.GetTimeoutError as err:
                raise RuntimeError(
                    f"ray pool: {len(added)} new worker(s) did not start within "
                    f"{self.cfg.start_timeout_s:g} s (pools.ray.start_timeout_s); can the cluster place "
                    f"actors of {self.cfg.num_cpus_per_worker:g} CPU and {self.cfg.num_gpus_per_worker:g} "
                    "GPU each?"
                ) from err
        except BaseException:
            # Not started (a timeout, an actor that died starting, Ctrl-C or a termination signal
            # while waiting): none of them joins the pool, as in LocalPool.resize. Until 2026-12-06
            # only a timeout removed them, and the others left actors the pool counted but that
            # never answered.
            for worker_id in added:
                actor = self._actors.pop(worker_id, None)
                if actor is not None:
                    ray.kill(actor)
            raise
        self._pids.update(zip(added, pids, strict=True))
        record = timed_resize(self.type_name, from_size, started_at, t0, added, removed)
        log.info("ray pool %d -> %d workers in %.2f s", from_size, record.to_size, record.duration_s)
        return record

    def submit(self, worker_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        actor = self._actors.get(worker_id)
        if actor is None:
            raise KeyError(f"no worker {worker_id!r} in this pool; workers: {list(self.worker_ids)}")
        ray = _import_ray()
        ref = actor.call.remote(worker_id, fn, args, kwargs)
        out: Future[Any] = Future()

        def _settle(inner: Future[Any]) -> None:
            exc = inner.exception()
            if exc is None:
                out.set_result(inner.result())
            elif isinstance(exc, ray.exceptions.RayTaskError):
                # Unwrap to the function's own exception, as the local pool reports it.
                cause = exc.as_instanceof_cause()
                out.set_exception(cause.cause if getattr(cause, "cause", None) else cause)
            elif isinstance(exc, ray.exceptions.RayActorError):
                out.set_exception(WorkerDiedError(f"worker {worker_id} died: {exc}"))
            else:
                out.set_exception(exc)

        ref.future().add_done_callback(_settle)
        return out

    def health(self, timeout_s: float = 5.0) -> dict[str, WorkerHealth]:
        ray = _import_ray()
        out: dict[str, WorkerHealth] = {}
        for worker_id, actor in list(self._actors.items()):
            pid = self._pids.get(worker_id)
            try:
                ray.get(actor.pid.remote(), timeout=timeout_s)
                out[worker_id] = WorkerHealth(worker_id, "ok", pid)
            except ray.exceptions.GetTimeoutError:
                out[worker_id] = WorkerHealth(worker_id, "unresponsive", pid)
            except ray.exceptions.RayActorError as exc:
                out[worker_id] = WorkerHealth(worker_id, "dead", pid, str(exc)[:200])
        return out

    def kill(self, worker_id: str) -> None:
        actor = self._actors.pop(worker_id, None)
        if actor is None:
            raise KeyError(f"no worker {worker_id!r} in this pool; workers: {list(self.worker_ids)}")
        self._pids.pop(worker_id, None)
        _import_ray().kill(actor, no_restart=True)

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return tuple(self._actors)
