"""Local worker pool: one subprocess per worker on this machine (the embedded default backend).

Each worker is a `multiprocessing` process (spawn by default) running a small call loop over a
private pipe; a sender thread in the driver writes its call frames in order (so `submit` never
waits for a busy worker to read a frame larger than the pipe holds) and a reader thread resolves the
futures. A worker that dies fails its pending futures with WorkerDiedError at once (the pipe
closes), so a caller waiting on a crashed worker is never left hanging. A worker whose driver dies
exits within `DRIVER_POLL_S`, mid-call too, so it never writes into a run folder that a resumed run
is using.

Every frame on the pipe carries its call id outside the pickle of its payload (see `_CALL_HEAD`,
`_REPLY_HEAD`), so a payload one side cannot load fails that call alone, with a RuntimeError naming
the worker and the error, and the worker and its other calls go on: a call the driver cannot pickle
raises in `submit` and is never registered; a result or exception the driver cannot load (its class
exists only in the worker) fails its own future.

A call that raises an `Exception` fails its future with it. A call that raises `SystemExit` (e.g.
`sys.exit(3)`) ends its worker, as it ends a Ray actor: the worker exits with that code, and the call
and the calls queued behind it fail with WorkerDiedError naming the SystemExit. Any other exception
that is not an `Exception` (KeyboardInterrupt, GeneratorExit, asyncio.CancelledError) comes back as a
RuntimeError naming it and the worker goes on. So no call makes the driver raise a BaseException
that its own code would treat as an order to exit.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
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


# A call frame: the call id, then the pickled (fn, args, kwargs); an empty frame asks the worker to
# exit. A reply frame: the call id and a reply kind, then the payload (the pickled result or
# exception, or for _EXITING the repr of the SystemExit). Each reads the ids without loading the payload.
_CALL_HEAD = struct.Struct("<q")
_REPLY_HEAD = struct.Struct("<qB")
_RETURNED, _RAISED, _EXITING = 0, 1, 2


def _worker_main(
    conn: Connection, worker_id: str, threads: int, driver: int, driver_start: int | None
) -> None:
    """The worker's call loop: receive call frames, run them in order, send one reply frame each."""
    for name in _THREAD_ENV:
        os.environ[name] = str(threads)
    # Too late for a torch that spawn's re-import of the driver's main module already imported
    # (its thread pool was sized then): a driver script that imports torch at the top.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    args = (os.getppid(), driver, driver_start)
    threading.Thread(target=_exit_with_driver, args=args, name="driver-watch", daemon=True).start()
    while True:
        try:
            frame = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not frame:
            return
        (call_id,) = _CALL_HEAD.unpack_from(frame)
        try:
            fn, args, kwargs = pickle.loads(memoryview(frame)[_CALL_HEAD.size :])
        except Exception as exc:  # noqa: BLE001 - e.g. a function whose module only the driver has
            error = RuntimeError(f"worker {worker_id}: the call could not be loaded in the worker ({exc!r})")
            conn.send_bytes(_reply_frame(call_id, _RAISED, error, None))
            continue
        try:
            kind, value = _RETURNED, fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the exception is the call's result
            kind, value = _RAISED, exc
        except SystemExit as exc:
            # The call asked this interpreter to exit: it does (with the code), as a Ray actor does.
            # The driver reads the reason first, then the closed pipe, and fails this call and the
            # ones queued behind it with WorkerDiedError.
            with contextlib.suppress(OSError):
                conn.send_bytes(_REPLY_HEAD.pack(call_id, _EXITING) + repr(exc).encode())
            raise
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt etc.: not the driver's to raise
            kind, value = _RAISED, RuntimeError(f"worker {worker_id}: the call raised {exc!r}")
        conn.send_bytes(_reply_frame(call_id, kind, value, fn))


def _reply_frame(call_id: int, kind: int, value: Any, fn: Any) -> bytes:
    """The reply frame, its payload checked to load again as the driver will load it: a value that
    pickles but cannot be rebuilt (an exception whose __init__ takes other arguments) is replaced by
    a RuntimeError naming it. (A value whose class only the worker has still loads here; the driver
    fails that call alone.)"""
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001 - any failure to round-trip is reported the same way
        what = "result" if kind == _RETURNED else "exception"
        shown = repr(value)[:500]
        error = RuntimeError(f"the {what} of {fn!r} cannot be sent to the driver ({exc!r}): {shown}")
        kind, payload = _RAISED, pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
    return _REPLY_HEAD.pack(call_id, kind) + payload


def _fn_name(fn: Any) -> str:
    qualname = getattr(fn, "__qualname__", None)
    return f"{getattr(fn, '__module__', None) or '?'}.{qualname}" if qualname else repr(fn)[:200]


@dataclass
class _Call:
    future: Future[Any]
    fn_name: str  # for error messages


@dataclass
class _Worker:
    worker_id: str
    process: Any  # multiprocessing process (BaseProcess subclass of the chosen context)
    conn: Connection
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, _Call] = field(default_factory=dict)
    # Frames for the sender thread, in submit order: (call id, frame); (None, b"") is the exit frame,
    # and None ends the sender without writing anything more.
    outbox: queue.SimpleQueue[tuple[int | None, bytes] | None] = field(default_factory=queue.SimpleQueue)
    exit_sent: threading.Event = field(default_factory=threading.Event)
    sender: threading.Thread | None = None
    reader: threading.Thread | None = None
    gone: str | None = None  # why the worker can take no more calls (set by its reader, under send_lock)
    exiting: str | None = None  # why the worker said it exits (a call raised SystemExit)
    ping: Future[Any] | None = None  # the last health probe (see `health`)


def _settle(future: Future[Any], *, value: Any = None, exc: BaseException | None = None) -> None:
    """Resolve a call's future unless its caller cancelled it (`asyncio.wait_for` on a wrapped future
    cancels it at its timeout): setting a cancelled future raised InvalidStateError, which killed
    the reader thread, so no later reply of that worker was read (until 2026-12-06)."""
    with contextlib.suppress(InvalidStateError):  # a cancel may land between the check and the set
        if not future.done():
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)


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
        try:
            return self.resize(size)
        except BaseException:
            self._running = False  # resize stopped what it started: start may be tried again
            raise

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
        added: list[str] = []
        try:
            while self.size < size:
                added.append(self._spawn())
            self._wait_ready(added)
        except BaseException:
            for worker_id in reversed(added):  # not started: none of them joins the pool
                self._stop_worker(worker_id, graceful=False)
            raise
        record = timed_resize(self.type_name, from_size, started_at, t0, added, removed)
        log.info("local pool %d -> %d workers in %.2f s", from_size, record.to_size, record.duration_s)
        return record

    def _wait_ready(self, added: list[str]) -> None:
        """Wait for every new worker's first answer (so a resize record's duration is start-to-ready),
        all of them within one `start_timeout_s`."""
        timeout_s = self.cfg.start_timeout_s
        deadline = time.monotonic() + timeout_s
        pings = [self.submit(worker_id, worker_ping) for worker_id in added]
        try:
            for ping in pings:
                ping.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError as err:
            raise RuntimeError(
                f"local pool: {len(added)} new worker(s) did not start within {timeout_s:g} s "
                "(pools.local.start_timeout_s); raise it where workers start slowly (a loaded "
                "machine, a slow file system)"
            ) from err

    def _spawn(self) -> str:
        worker_id = f"w{self._next_index}"
        self._next_index += 1
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child, worker_id, self.cfg.threads_per_worker, os.getpid(), process_start(os.getpid())),
            name=f"libra-{worker_id}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(worker_id, process, parent)
        worker.sender = threading.Thread(target=self._send_loop, args=(worker,), daemon=True)
        worker.reader = threading.Thread(target=self._read_loop, args=(worker,), daemon=True)
        worker.sender.start()
        worker.reader.start()
        with self._lock:
            self._workers[worker_id] = worker
        return worker_id

    def _send_loop(self, worker: _Worker) -> None:
        """Write the worker's frames in order. A write blocks while the worker is busy and the frame
        is larger than the pipe holds; only this thread waits for it."""
        while (item := worker.outbox.get()) is not None:
            call_id, frame = item
            try:
                worker.conn.send_bytes(frame)
            except (BrokenPipeError, OSError) as exc:
                if call_id is None:
                    return
                with worker.send_lock:
                    call = worker.pending.pop(call_id, None)
                if call is not None:
                    _settle(call.future, exc=WorkerDiedError(f"worker {worker.worker_id} is gone: {exc}"))
                continue
            if call_id is None:  # the exit frame: nothing is written after it
                worker.exit_sent.set()
                return

    def _read_loop(self, worker: _Worker) -> None:
        try:
            self._read_replies(worker)
        finally:  # however the loop ended, no caller is left waiting on this worker
            self._worker_gone(worker)

    def _read_replies(self, worker: _Worker) -> None:
        while True:
            try:
                frame = worker.conn.recv_bytes()
            except (EOFError, OSError):
                return
            call_id, kind = _REPLY_HEAD.unpack_from(frame)
            payload = memoryview(frame)[_REPLY_HEAD.size :]
            if kind == _EXITING:
                call = worker.pending.get(call_id)
                what = f"its call of {call.fn_name}" if call is not None else "a call"
                worker.exiting = f"{what} raised {bytes(payload).decode()}"
                continue
            call = worker.pending.pop(call_id, None)
            if call is None:
                continue
            try:
                value = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - fails this call alone; the worker lives on
                what = "result" if kind == _RETURNED else "exception"
                message = (
                    f"worker {worker.worker_id}: the {what} of {call.fn_name} cannot be loaded in the "
                    f"driver ({exc!r}); return values whose classes the driver can import"
                )
                log.warning("%s", message)
                _settle(call.future, exc=RuntimeError(message))
                continue
            if kind == _RETURNED:
                _settle(call.future, value=value)
            else:
                _settle(call.future, exc=value)

    def _worker_gone(self, worker: _Worker) -> None:
        worker.process.join(timeout=5)
        gone = f"worker {worker.worker_id} exited (code {worker.process.exitcode})"
        if worker.exiting is not None:
            gone += f": {worker.exiting}"
        with worker.send_lock:  # a call submitted from here on fails at once (see submit)
            worker.gone = gone
            unanswered = list(worker.pending.values())
            worker.pending.clear()
        for call in unanswered:
            _settle(call.future, exc=WorkerDiedError(gone))

    def _stop_worker(self, worker_id: str, *, graceful: bool) -> None:
        with self._lock:
            worker = self._workers.pop(worker_id, None)
        if worker is None:
            return
        # The exit frame goes after the frames already submitted. A sender still writing a frame
        # larger than the pipe holds to a busy worker after a second is not waited for (a stop took
        # as long as the worker's running call, until 2026-12-06): that worker is killed below.
        if graceful and worker.process.is_alive():
            worker.outbox.put((None, b""))
            if worker.exit_sent.wait(timeout=1.0):
                worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)
        worker.outbox.put(None)  # a sender still waiting for frames ends; one mid-write gets EPIPE
        if worker.sender is not None:
            worker.sender.join(timeout=5)
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
        # Pickled before the call is registered: a call that cannot be sent leaves nothing pending
        # (a stale entry would make the worker look busy to health() for ever).
        try:
            # pickle, not ForkingPickler: that one moves a torch tensor argument into shared memory,
            # so a call that changed its argument in place changed the driver's tensor too
            payload = pickle.dumps((fn, args, kwargs), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(
                f"cannot send a call of {_fn_name(fn)} to worker {worker_id}: {exc}; pool calls take "
                "module-level functions and picklable arguments"
            ) from exc
        frame = _CALL_HEAD.pack(call_id) + payload
        future: Future[Any] = Future()
        with worker.send_lock:
            # Checked and registered under the lock the reader takes when its worker dies: a call
            # registered after the reader failed the pending ones would wait forever.
            if worker.gone is not None:
                future.set_exception(WorkerDiedError(worker.gone))
                return future
            worker.pending[call_id] = _Call(future, _fn_name(fn))
            # The sender writes it: a worker busy with a long call does not read a frame larger
            # than the pipe holds until that call ends, and the caller does not wait for that.
            worker.outbox.put((call_id, frame))
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
            elif worker.ping is not None and not worker.ping.done():
                # A probe sent while it was idle is still unanswered: it hangs. (The ping counted as
                # a call in `pending`, so from the second probe on it read as busy and healthy.)
                detail = "an earlier health probe is unanswered"
                out[worker.worker_id] = WorkerHealth(worker.worker_id, "unresponsive", pid, detail)
            elif worker.pending:
                # Busy with a call; the process is alive, which is all a probe could learn.
                out[worker.worker_id] = WorkerHealth(worker.worker_id, "ok", pid, "busy")
            else:
                try:
                    worker.ping = self.submit(worker.worker_id, worker_ping)
                    worker.ping.result(timeout=timeout_s)
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
