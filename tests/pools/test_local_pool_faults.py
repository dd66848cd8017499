"""Faults of one call on a local-pool worker stay with that call: an argument that does not pickle,
a result the driver cannot load, a function the worker cannot load, a call that exits its worker,
and a pool start that times out."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator

import pytest

from libra_core.config.pools import LocalPoolConfig
from libra_core.pools.base import WorkerDiedError
from libra_core.pools.local import LocalPool

WORKER_ONLY = "libra_test_only_in_worker"
DRIVER_ONLY = "libra_test_only_in_driver"


@pytest.fixture
def pool() -> Iterator[LocalPool]:
    p = LocalPool()
    try:
        yield p
    finally:
        p.stop()


def return_worker_only_instance(delay_s: float) -> object:
    """Return an instance of a class whose module exists only in the worker's interpreter."""
    time.sleep(delay_s)  # so a call submitted right after is queued behind this one
    module = types.ModuleType(WORKER_ONLY)
    exec("class K:\n    pass\n", module.__dict__)
    sys.modules[WORKER_ONLY] = module
    return module.K()


def exit_after(delay_s: float, code: int) -> None:
    time.sleep(delay_s)
    sys.exit(code)


class Interrupt(BaseException):
    """A BaseException that is not an Exception (like trio's Cancelled or pytest's Failed)."""


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def raise_interrupt() -> None:
    raise Interrupt("stop here")


def test_a_call_that_does_not_pickle_raises_and_leaves_the_worker_idle(pool: LocalPool) -> None:
    pool.start(1)
    with pytest.raises(TypeError, match=r"_thread\.lock"):
        pool.submit("w0", repr, threading.Lock())
    # A stale registration made the worker look busy for ever, so a hung worker read as "ok".
    pid = pool.health(timeout_s=10)["w0"].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        health = pool.health(timeout_s=1)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (health["w0"].state, health["w0"].detail) == ("unresponsive", "")
    assert pool.run("w0", divmod, 7, 2, timeout_s=30) == (3, 1)


def test_a_result_only_the_worker_can_load_fails_that_call_alone(pool: LocalPool) -> None:
    pool.start(1)
    unreadable = pool.submit("w0", return_worker_only_instance, 0.5)
    queued = pool.submit("w0", divmod, 7, 2)
    assert queued.result(timeout=30) == (3, 1)  # it used to fail with the unreadable reply
    with pytest.raises(
        RuntimeError,
        match=rf"worker w0: the result of .*return_worker_only_instance cannot be loaded in the "
        rf"driver .*No module named '{WORKER_ONLY}'",
    ):
        unreadable.result(timeout=30)
    assert pool.run("w0", divmod, 9, 4, timeout_s=30) == (2, 1)


def test_a_function_only_the_driver_can_load_fails_that_call_alone(
    pool: LocalPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType(DRIVER_ONLY)
    exec("def answer():\n    return 42\n", module.__dict__)
    monkeypatch.setitem(sys.modules, DRIVER_ONLY, module)
    pool.start(1)
    pid = pool.run("w0", os.getpid, timeout_s=30)
    with pytest.raises(
        RuntimeError, match=rf"worker w0: the call could not be loaded in the worker .*'{DRIVER_ONLY}'"
    ):
        pool.run("w0", module.answer, timeout_s=30)
    assert pool.run("w0", os.getpid, timeout_s=30) == pid  # the same worker, alive


def test_sys_exit_ends_the_worker_and_fails_its_calls_naming_it(pool: LocalPool) -> None:
    pool.start(2)
    exiting = pool.submit("w0", exit_after, 0.5, 3)
    queued = pool.submit("w0", divmod, 7, 2)
    for call in (exiting, queued):
        with pytest.raises(
            WorkerDiedError,
            match=r"worker w0 exited \(code 3\): its call of .*exit_after raised SystemExit\(3\)",
        ):
            call.result(timeout=30)
    assert {w: h.state for w, h in pool.health(timeout_s=10).items()} == {"w0": "dead", "w1": "ok"}
    with pytest.raises(WorkerDiedError, match="SystemExit"):
        pool.run("w0", divmod, 7, 2, timeout_s=30)
    assert pool.run("w1", divmod, 7, 2, timeout_s=30) == (3, 1)


@pytest.mark.parametrize(
    ("fn", "shown"),
    [(raise_keyboard_interrupt, r"KeyboardInterrupt\(\)"), (raise_interrupt, r"Interrupt\('stop here'\)")],
)
def test_other_base_exceptions_come_back_as_runtime_errors(pool: LocalPool, fn: object, shown: str) -> None:
    pool.start(1)
    pid = pool.run("w0", os.getpid, timeout_s=30)
    with pytest.raises(RuntimeError, match=rf"^worker w0: the call raised {shown}$"):
        pool.run("w0", fn, timeout_s=30)  # type: ignore[arg-type]
    assert pool.run("w0", os.getpid, timeout_s=30) == pid


def _children() -> set[int]:
    return {p.pid for p in mp.active_children() if p.pid is not None}


def test_a_start_that_times_out_stops_its_workers_and_names_the_setting() -> None:
    before = _children()
    pool = LocalPool(LocalPoolConfig(start_timeout_s=0.01))
    try:
        with pytest.raises(
            RuntimeError,
            match=r"local pool: 2 new worker\(s\) did not start within 0\.01 s "
            r"\(pools\.local\.start_timeout_s\)",
        ):
            pool.start(2)
        assert pool.worker_ids == ()
        assert _children() == before, "the workers of the failed start are still running"
        pool.cfg = LocalPoolConfig()  # a longer timeout: the same pool starts
        assert pool.start(1).added == ("w2",)
    finally:
        pool.stop()


def test_a_grow_that_times_out_keeps_the_workers_it_had(pool: LocalPool) -> None:
    pool.start(1)
    before = _children()
    pool.cfg = LocalPoolConfig(start_timeout_s=0.01)
    with pytest.raises(RuntimeError, match=r"pools\.local\.start_timeout_s"):
        pool.resize(3)
    assert pool.worker_ids == ("w0",) and _children() == before
    assert pool.run("w0", divmod, 7, 2, timeout_s=30) == (3, 1)


def test_stop_does_not_wait_behind_a_large_call_sent_to_a_busy_worker() -> None:
    # A frame larger than the pipe holds is written under the send lock until the busy worker reads
    # it; stop() took that lock for its exit frame and so waited for the worker's whole call.
    pool = LocalPool(LocalPoolConfig(start_method="spawn"))
    pool.start(1)
    (worker,) = pool.worker_ids
    pool.submit(worker, time.sleep, 8.0)
    threading.Thread(target=lambda: pool.submit(worker, len, b"x" * 2_000_000), daemon=True).start()
    time.sleep(0.5)  # the large frame is being written
    started = time.monotonic()
    pool.stop()
    assert time.monotonic() - started < 5.0  # was the call's 8 s
    assert pool.size == 0


def test_submit_does_not_wait_behind_a_busy_worker_for_a_large_call(tmp_path) -> None:
    # A frame larger than the pipe holds was written by submit itself, so the caller waited until
    # the busy worker finished its running call and read it (a sender thread per worker now writes).
    pool = LocalPool(LocalPoolConfig(start_method="spawn"))
    pool.start(1)
    try:
        (worker,) = pool.worker_ids
        gate = tmp_path / "go"
        busy = pool.submit(worker, _wait_for_file, str(gate))
        futures = []
        submitter = threading.Thread(
            target=lambda: futures.append(pool.submit(worker, len, b"x" * 2_000_000)), daemon=True
        )
        submitter.start()
        submitter.join(timeout=20)
        assert not submitter.is_alive(), "submit waited for the busy worker to read its frame"
        assert not busy.done()
        small = pool.submit(worker, divmod, 7, 2)  # queued behind the large one, answered in order
        gate.touch()
        assert busy.result(timeout=30) == "went"
        assert futures[0].result(timeout=30) == 2_000_000
        assert small.result(timeout=30) == (3, 1)
    finally:
        pool.stop()


def _wait_for_file(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.02)
    return "went"


def test_a_cancelled_call_leaves_the_worker_serving_later_calls(pool: LocalPool) -> None:
    # Its reply set a cancelled future (InvalidStateError), which killed the reader thread: no later
    # reply of the worker was read, health said busy, and stop() left the pending calls unresolved.
    # `asyncio.wait_for` on a wrapped future cancels it so at every timeout.
    pool.start(1)
    busy = pool.submit("w0", time.sleep, 0.5)
    queued = pool.submit("w0", time.sleep, 0.05)
    assert queued.cancel()
    busy.result(timeout=30)
    assert pool.run("w0", sum, [1, 2, 3], timeout_s=30) == 6
    assert pool.health(timeout_s=10)["w0"].state == "ok"


def test_a_hung_worker_stays_unresponsive_across_health_probes(pool: LocalPool) -> None:
    # The timed-out probe stayed pending, so the next probe read the worker as busy and healthy.
    pool.start(1)
    pid = pool.health()["w0"].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive, not answering
    try:
        states = [pool.health(timeout_s=0.5)["w0"] for _ in range(3)]
        assert [h.state for h in states] == ["unresponsive"] * 3, states
        assert states[1].detail == "an earlier health probe is unanswered"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for_ok(pool)  # it answers the probe once it runs again


def wait_for_ok(pool: LocalPool, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pool.health(timeout_s=2)["w0"].state == "ok":
            return True
        time.sleep(0.1)
    return False
