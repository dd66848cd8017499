"""Local worker pool: one subprocess per worker on this machine (the embedded default backend).

Each worker is a `multiprocessing` process (spawn by default) running a small call loop over a
private pipe; a reader thread in the driver resolves the futures. A worker that dies fails its
pending futures with WorkerDiedError at once (the pipe closes), so a caller waiting on a crashed
worker is never left hanging. A worker whose driver dies exits within `DRIVER_POLL_S`, mid-call
too, so it never writes into a run folder that a resumed run is using.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from libra_core.config.pools import LocalPoolConfig
from libra_core.pools.base import (
    ResizeRecord,
    WorkerDiedError,
    WorkerHealth,
    WorkerPool,
    timed_resize,
    worker_ping,
)
from libra_core.rollout.engine_registry import process_start

log = logging.getLogger(__name__)

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# How often a worker checks that the process that started it (its driver) is still alive.
DRIVER_POLL_S = 0.5


def _exit_with_driver(parent: int, driver: int, driver_start: int | None) -> None:
    """Exit the worker as soon as its driver is gone (SIGKILL, OOM kill), even mid-call.

    An idle worker notices a dead driver by its pipe closing, but one busy in a long call (an update
    of several minutes) would otherwise finish it and write its results into the run folder while a
    resumed run works there. Under spawn the driver is the parent, and an orphan is re-parented
    (`getppid()` changes); under forkserver the parent is the fork server, which outlives the
    driver, so the driver's own pid and start time are watched too (Linux /proc; a recycled pid has
    another start time).
    """
    while True:
        time.sleep(DRIVER_POLL_S)
        if os.getppid() != parent or (driver_start is not None and process_start(driver) != driver_start):
            os._exit(70)  # no clean-up: nothing the worker holds may outlive its driver


def _worker_main(conn: Connection, threads: int, driver: int, driver_start: int | None) -> None:
    """The worker's call loop: receive (call_id, fn, args, kwargs), send (call_id, ok, value)."""
    for name in _THREAD_ENV:
        os.environ[name] = str(threads)
    args = (os.getppid(), driver, driver_start)
    threading.Thread(target=_exit_with_driver, args=args, name="driver-watch", daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        call_id, fn, args, kwargs = message
        try:
            reply = (call_id, True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the exception is the call's result
            reply = (call_id, False, exc)
        conn.send_bytes(_reply_bytes(reply, fn))


def _reply_bytes(reply: tuple[int, bool, Any], fn: Any) -> bytes:
    """The pickled reply, checked to load again as the driver will load it: a value that pickles
    but cannot be rebuilt (an exception whose __init__ takes other arguments) would otherwise kill
    the driver's reader and leave the call waiting forever. Such a value is replaced by a
    RuntimeError naming it."""
    call_id, ok, value = reply
    try:
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return data
    except Exception as exc:  # noqa: BLE001 - any failure to round-trip is reported the same way
        what = "result" if ok else "exception"
        shown = repr(value)[:500]
        error = RuntimeError(f"the {what} of {fn!r} cannot be sent to the driver ({exc!r}): {shown}")
        return pickle.dumps((call_id, False, error), protocol=pickle.HIGHEST_PROTOCOL)


@dataclass
class _Worker:
    worker_id: str
    process: Any  # multiprocessing process (BaseProcess subclass of the chosen context)
    conn: Connection
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, Future[Any]] = field(default_factory=dict)
    reader: threading.Thread | None = None
    gone: str | None = None  # why the worker can take no more calls (set by its reader, under send_lock)


class LocalPool(WorkerPool):
    type_name = "local"

    def __init__(self, cfg: LocalPoolConfig | None = None) -> None:
        self.cfg = cfg or LocalPoolConfig()
        self._ctx = mp.get_context(self.cfg.start_method)
        self._workers: dict[str, _Worker] = {}
        self._next_index = 0
        self._call_ids = itertools.count()
        self._lock = threading.Lock()
        self._running = False

    # ------------------------------------------------------------------ lifecycle

    def start(self, size: int) -> ResizeRecord:
        assert not self._running, "the pool is already running; use resize()"
        self._running = True
        return self.resize(size)

    def stop(self) -> None:
        for worker_id in list(reversed(self._workers)):
            self._stop_worker(worker_id, graceful=True)
        self._running = False

    def resize(self, size: int) -> ResizeRecord:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self._running = True
        started_at, t0, from_size = time.time(), time.perf_counter(), self.size
        removed: list[str] = []
        while self.size > size:
            worker_id = self.worker_ids[-1]
            self._stop_worker(worker_id, graceful=True)
            removed.append(worker_id)
        added = [self._spawn() for _ in range(size - self.size)]
        # Wait for every new worker's first answer, so the record's duration is start-to-ready.
        for worker_id in added:
            self.run(worker_id, worker_ping, timeout_s=self.cfg.start_timeout_s)
        record = timed_resize(self.type_name, from_size, started_at, t0, added, removed)
        log.info("local pool %d -> %d workers in %.2f s", from_size, record.to_size, record.duration_s)
        return record

    def _spawn(self) -> str:
        worker_id = f"w{self._next_index}"
        self._next_index += 1
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child, self.cfg.threads_per_worker, os.getpid(), process_start(os.getpid())),
            name=f"libra-{worker_id}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(worker_id, process, parent)
        worker.reader = threading.Thread(target=self._read_loop, args=(worker,), daemon=True)
        worker.reader.start()
        with self._lock:
            self._workers[worker_id] = worker
        return worker_id

    def _read_loop(self, worker: _Worker) -> None:
        while True:
            try:
                call_id, ok, value = worker.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a reply that does not load (the worker checks; belt and braces)
                log.exception(
                    "worker %s: a reply could not be read; failing its pending calls", worker.worker_id
                )
                for waiting in list(worker.pending.values()):
                    waiting.set_exception(
                        RuntimeError(f"worker {worker.worker_id}: a reply could not be read")
                    )
                worker.pending.clear()
                continue
            future = worker.pending.pop(call_id, None)
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        worker.process.join(timeout=5)
        gone = f"worker {worker.worker_id} exited (code {worker.process.exitcode})"
        with worker.send_lock:  # a call submitted from here on fails at once (see submit)
            worker.gone = gone
            unanswered = list(worker.pending.values())
            worker.pending.clear()
        for call in unanswered:
            if not call.done():
                call.set_exception(WorkerDiedError(gone))

    def _stop_worker(self, worker_id: str, *, graceful: bool) -> None:
        with self._lock:
            worker = self._workers.pop(worker_id, None)
        if worker is None:
            return
        if graceful and worker.process.is_alive():
            try:
                with worker.send_lock:
                    worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)
        worker.conn.close()
        if worker.reader is not None:
            worker.reader.join(timeout=5)

    # ------------------------------------------------------------------ calls

    def submit(self, worker_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            worker = self._workers.get(worker_id)
        if worker is None:
            raise KeyError(f"no worker {worker_id!r} in this pool; workers: {list(self.worker_ids)}")
        call_id = next(self._call_ids)
        future: Future[Any] = Future()
        with worker.send_lock:
            # Checked and registered under the lock the reader takes when its worker dies: a call
            # registered after the reader failed the pending ones would wait forever.
            if worker.gone is not None:
                future.set_exception(WorkerDiedError(worker.gone))
                return future
            worker.pending[call_id] = future
            try:
                worker.conn.send((call_id, fn, args, kwargs))
            except (BrokenPipeError, OSError) as exc:
                worker.pending.pop(call_id, None)
                future.set_exception(WorkerDiedError(f"worker {worker_id} is gone: {exc}"))
        return future

    def health(self, timeout_s: float = 5.0) -> dict[str, WorkerHealth]:
        with self._lock:
            workers = list(self._workers.values())
        out: dict[str, WorkerHealth] = {}
        for worker in workers:
            pid = worker.process.pid
            if not worker.process.is_alive():
                out[worker.worker_id] = WorkerHealth(
                    worker.worker_id, "dead", pid, f"exit code {worker.process.exitcode}"
                )
            elif worker.pending:
                # Busy with a call; the process is alive, which is all a probe could learn.
                out[worker.worker_id] = WorkerHealth(worker.worker_id, "ok", pid, "busy")
            else:
                try:
                    self.run(worker.worker_id, worker_ping, timeout_s=timeout_s)
                    out[worker.worker_id] = WorkerHealth(worker.worker_id, "ok", pid)
                except TimeoutError:
                    out[worker.worker_id] = WorkerHealth(worker.worker_id, "unresponsive", pid)
                except WorkerDiedError as exc:
                    out[worker.worker_id] = WorkerHealth(worker.worker_id, "dead", pid, str(exc))
        return out

    def kill(self, worker_id: str) -> None:
        with self._lock:
            worker = self._workers.get(worker_id)
        if worker is None:
            raise KeyError(f"no worker {worker_id!r} in this pool; workers: {list(self.worker_ids)}")
        worker.process.kill()
        self._stop_worker(worker_id, graceful=False)

    @property
    def worker_ids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._workers)
