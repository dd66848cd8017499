"""The worker-pool interface: a resizable set of long-lived workers, each addressable by id.

A pool is owned by one driver process (the flow's process, or a test): the driver starts it once,
resizes it when a plan moves workers between training and rollout, runs functions on chosen
workers, and stops it when the experiment ends. Workers keep state between calls (a loaded model,
a process group), so a function sent to a worker is like a method call on an actor: calls to one
worker run one at a time, in submission order; calls to different workers run in parallel.

Functions and their arguments cross a process boundary, so they must be picklable (module-level
functions, plain data). That pickle stream stays between the driver and its own workers (a local
pipe or Ray's object store) and never reads network input from others.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Literal


class WorkerDiedError(RuntimeError):
    """A worker exited (crashed, was killed, or the pool stopped) before its call returned."""


@dataclass(frozen=True)
class ResizeRecord:
    """What one start/resize did and how long it took (written to the run's timings by the caller)."""

    pool_type: str
    from_size: int
    to_size: int
    added: tuple[str, ...]  # worker ids started, in start order
    removed: tuple[str, ...]  # worker ids stopped
    duration_s: float  # wall time from the call until every added worker answered a ping
    started_at: float  # time.time() when the resize began

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkerHealth:
    worker_id: str
    state: Literal["ok", "dead", "unresponsive"]
    pid: int | None  # OS process id when known (local workers; Ray actors report theirs)
    detail: str = ""


class WorkerPool(ABC):
    """Contract shared by every pool backend (the contract test in tests/pools runs it on each).

    Worker ids are `w0, w1, ...` in start order and never reused within a pool, so a record or log
    line naming a worker stays unambiguous after resizes. Growing starts new ids; shrinking stops the
    most recently started workers first (LIFO), so long-lived workers keep their ids.
    """

    type_name: str = ""

    @abstractmethod
    def start(self, size: int) -> ResizeRecord:
        """Start `size` workers (the pool must not be running); blocks until each answers."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker; calls still running fail with WorkerDiedError. Idempotent."""

    @abstractmethod
    def resize(self, size: int) -> ResizeRecord:
        """Grow or shrink to `size` workers (>= 0); blocks until started workers answer."""

    @abstractmethod
    def submit(self, worker_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue `fn(*args, **kwargs)` on one worker; the future holds its result or exception.

        Raises KeyError for an unknown worker id. If the worker dies first, the future fails with
        WorkerDiedError.
        """

    @abstractmethod
    def health(self, timeout_s: float = 5.0) -> dict[str, WorkerHealth]:
        """Probe every worker; a worker busy with a long call answers `ok` if its process is alive."""

    @abstractmethod
    def kill(self, worker_id: str) -> None:
        """Terminate one worker at once (fault injection, or a forced leave); its id is retired."""

    @property
    @abstractmethod
    def worker_ids(self) -> tuple[str, ...]:
        """Ids of the workers currently in the pool, in start order."""

    @property
    def size(self) -> int:
        return len(self.worker_ids)

    def run(
        self,
        worker_id: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn` on one worker and return its result (re-raising its exception)."""
        return self.submit(worker_id, fn, *args, **kwargs).result(timeout=timeout_s)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker_ping() -> int:
    """Return the worker's process id; used by pools to tell that a worker is up."""
    import os

    return os.getpid()


def timed_resize(
    pool_type: str, from_size: int, started_at: float, t0: float, added: list[str], removed: list[str]
) -> ResizeRecord:
    return ResizeRecord(
        pool_type=pool_type,
        from_size=from_size,
        to_size=from_size + len(added) - len(removed),
        added=tuple(added),
        removed=tuple(removed),
        duration_s=time.perf_counter() - t0,
        started_at=started_at,
    )
