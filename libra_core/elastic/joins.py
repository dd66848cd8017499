"""Joins on core rank 0: which connection serves which join, the snapshot it is sent, and when a join
that nobody drives any more fails.

Part of the gateway (libra_core/elastic/gateway.py), which owns the lock every method here runs
under (`cond`) and routes `snapshot`, `snapshot_part` and `loaded` requests here; the coordinator
(libra_core/elastic/membership.py) holds the states.

Binding. A connection serves at most one join: its `snapshot` request binds it to the worker's
current join (`HybridLifecycle.join`, bumped by every request_join). A request on a connection bound
to an earlier join (cancelled or failed, then requested again) changes nothing and is answered
`ended`, so an old training loop stops while the new join goes on; the end of such a connection
changes nothing either.

Liveness. A join that no process drives any more must not stay in a training state (the planner
counts those as training). It fails (rollback to rollout) when the connection bound to it ends while
the worker is JOIN_REQUESTED, LOADING, WARMING or LEAVING; or when no connection has asked for its
snapshot `join_timeout_s` after it was requested (checked at every step boundary). An ACTIVE worker
is watched by the payload deadline instead. A snapshot wait that times out fails nothing: the
snapshot comes at the next step boundary, which a long core step puts off; the reply says `retry`,
the connection stays bound, and the hybrid asks again on it (until 2026-12-07 it failed the join,
so no hybrid could join a core whose step in progress had more than a minute left). Nor does a pull
that times out: a core step may outlast it, and the hybrid pulls again (a connected hybrid that
stops asking is closed by the server's idle timeout, which ends its join).

Snapshots are sent in parts (libra_core/elastic/snapshot.py); the join moves to LOADING only once the
last part has been sent in full, so a failed send leaves it JOIN_REQUESTED, and the end of the
connection then fails it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from libra_core.elastic.membership import Coordinator
from libra_core.elastic.server import Reply
from libra_core.elastic.session import ServerSession
from libra_core.elastic.snapshot import Snapshot, part_count
from libra_core.elastic.state_machine import UNWATCHED, HybridEvent, HybridLifecycle, HybridState

SNAPSHOT_PART_BYTES = 64 << 20  # a snapshot part; smaller if the hybrid's frame limit is
# The smallest part a hybrid may ask for (a bound on the number of parts of a snapshot); a frame
# limit below it cannot carry a useful gradient either. A smaller limit is refused with a reason.
# It was 64 KiB, and a hybrid whose limit was under that was sent parts it refused (until 2026-12-06).
MIN_SNAPSHOT_PART_BYTES = 4 << 10


@dataclass
class Join:
    """The join one connection serves (its handler thread's; fields other threads read are set under
    the gateway's lock)."""

    worker: str
    number: int  # the worker's join number when bound
    part_bytes: int
    snapshot: Snapshot | None = None  # pinned once it is being sent
    parts: int = 0
    next_part: int = 1


def ended(reason: str) -> dict[str, Any]:
    """A reply saying the request's join is over (the hybrid's loop stops; nothing was changed)."""
    return {"ok": False, "ended": True, "reason": reason}


def why_over(life: HybridLifecycle) -> str:
    last = life.history[-1][1] if life.history else None
    if last is HybridEvent.FAIL:
        return f"the join is over: {life.worker_id} failed: {life.failure}"
    return (
        f"the join is over: {life.worker_id} is in {life.state.value} ({last.value if last else 'no event'})"
    )


class JoinDesk:
    def __init__(
        self,
        coordinator: Coordinator,
        cond: threading.Condition,
        *,
        update_log_steps: int,
        join_timeout_s: float,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        """`closed()` says the gateway has closed (read under the lock): waits end at once."""
        self.coordinator, self._cond, self._closed = coordinator, cond, closed
        self.update_log_steps, self.join_timeout_s = update_log_steps, join_timeout_s
        self.snapshot: Snapshot | None = None  # the latest the core stored
        self._joins: dict[str, Join] = {}  # session id -> the join its connection serves
        self._requested_at: dict[str, float] = {}  # worker -> monotonic time of its last request_join

    # ------------------------------------------------------------------ core side (under the lock)

    def requested(self, worker: str) -> None:
        self._requested_at[worker] = time.monotonic()

    def fresh(self, open_step: int) -> bool:
        """A snapshot a joining hybrid can catch up from: stored, and recent enough that the updates
        after it are still in the log (half the log, so replaying stays short)."""
        snap = self.snapshot
        return snap is not None and open_step - snap.step < self.update_log_steps // 2

    def wants_snapshot(self, open_step: int) -> bool:
        """True when a join waits for a snapshot (none is being sent for it) and none is fresh."""
        pending = any(
            life.state is HybridState.JOIN_REQUESTED and not self._sending(w, life.join)
            for w, life in self.coordinator.hybrids.items()
        )
        return pending and not self.fresh(open_step)

    def expire(self) -> None:
        """At a step boundary: fail requested joins that no connection asked a snapshot for in time."""
        now = time.monotonic()
        for worker, life in self.coordinator.hybrids.items():
            waited_s = now - self._requested_at.get(worker, now)
            unserved = life.state is HybridState.JOIN_REQUESTED and self._bound(worker, life.join) is None
            if unserved and waited_s > self.join_timeout_s:
                self.coordinator.fail(worker, f"no snapshot request within {self.join_timeout_s} s")

    def _bound(self, worker: str, number: int) -> Join | None:
        return next((j for j in self._joins.values() if (j.worker, j.number) == (worker, number)), None)

    def _sending(self, worker: str, number: int) -> bool:
        join = self._bound(worker, number)
        return join is not None and join.snapshot is not None

    # ------------------------------------------------------------------ connections (handler threads)

    def join_of(self, session: ServerSession) -> Join | None:
        return self._joins.get(session.session)

    def superseded(self, join: Join | None) -> str | None:
        """Why `join` is over because a later join of its worker was requested, or None."""
        if join is None:
            return None
        current = self.coordinator.lifecycle(join.worker).join
        if join.number == current:
            return None
        return f"join {join.number} of {join.worker} is over: join {current} was requested since"

    def connection_ended(self, session: ServerSession) -> None:
        with self._cond:
            join = self._joins.pop(session.session, None)
            if join is None:
                return
            life = self.coordinator.lifecycle(join.worker)
            if join.number == life.join and life.state in UNWATCHED:
                self.coordinator.fail(
                    join.worker, f"the connection serving its join closed ({life.state.value})"
                )
                self._cond.notify_all()

    def on_snapshot(
        self,
        session: ServerSession,
        wait_s: float,
        part_bytes: int,
        open_step: Callable[[], int],
        update_bytes: int = 0,
    ) -> Reply:
        """Bind the connection to the worker's requested join, wait at most `wait_s` for a fresh
        snapshot (`open_step()` is the gateway's open step), and send its first part. A hybrid whose
        frame limit (`part_bytes`) is below an update's body (`update_bytes`) is refused first: it
        downloaded the whole snapshot, then failed on its first pull."""
        worker = session.worker
        deadline = time.perf_counter() + wait_s
        with self._cond:
            life = self.coordinator.lifecycle(worker)
            retried = self._joins.get(session.session)  # its last wait timed out (`retry`)
            if retried is not None and (retried.snapshot is not None or retried.number != life.join):
                raise ValueError("this connection already serves a join; a new join needs a new connection")
            if life.state is not HybridState.JOIN_REQUESTED:
                return Reply(ended(f"no join requested for {worker}"))
            if retried is None and self._bound(worker, life.join) is not None:
                return Reply(ended(f"join {life.join} of {worker} is served on another connection"))
            if part_bytes < MIN_SNAPSHOT_PART_BYTES:
                reason = (
                    f"the hybrid's frame limit ({part_bytes} B) is below the smallest snapshot part "
                    f"({MIN_SNAPSHOT_PART_BYTES} B); raise its max_frame_bytes"
                )
                self.coordinator.fail(worker, reason)
                return Reply({"ok": False, "reason": reason})
            if part_bytes < update_bytes:
                reason = (
                    f"the hybrid's frame limit ({part_bytes} B) is below one update ({update_bytes} B, "
                    "pulled as one frame); raise its max_frame_bytes"
                )
                self.coordinator.fail(worker, reason)
                return Reply({"ok": False, "reason": reason})
            part_bytes = min(part_bytes, SNAPSHOT_PART_BYTES)
            join = self._joins[session.session] = Join(worker, life.join, part_bytes)
            if self._closed():
                return Reply({"ok": False, "reason": "the gateway closed"})
            # A stale snapshot (stored before the log's oldest kept updates) would fail the join as
            # "expired" on its first pull: wait for the fresh one `wants_snapshot` asks the core for.
            while not self.fresh(open_step()):
                if life.join != join.number or life.state is not HybridState.JOIN_REQUESTED:
                    return Reply(ended(self.superseded(join) or why_over(life)))
                left = deadline - time.perf_counter()
                if left <= 0:
                    reason = f"no fresh snapshot within the wait ({wait_s} s)"
                    return Reply({"ok": False, "reason": reason, "retry": True})
                self._cond.wait(left)
                if self._closed():  # until 2026-12-07 the wait ran on, then failed the join
                    return Reply({"ok": False, "reason": "the gateway closed"})
            snap = join.snapshot = self.snapshot
            assert snap is not None, "a fresh snapshot is a stored one"
        encoded = snap.encode()
        join.parts = part_count(len(encoded), join.part_bytes)
        header = {
            "ok": True,
            "step": snap.step,
            "version": snap.version,
            "bytes": len(encoded),
            "parts": join.parts,
        }
        return Reply(header, encoded[: join.part_bytes], self._after_part(join, 0))

    def on_snapshot_part(self, session: ServerSession, index: int) -> Reply:
        with self._cond:
            join = self._joins.get(session.session)
            if join is None or join.snapshot is None:
                raise ValueError("no snapshot is being sent on this connection")
            life = self.coordinator.lifecycle(join.worker)
            if life.join != join.number or life.state is not HybridState.JOIN_REQUESTED:
                return Reply(ended(self.superseded(join) or why_over(life)))
            if index != join.next_part or index >= join.parts:
                raise ValueError(
                    f"snapshot part {index} asked for; the next is {join.next_part} of {join.parts}"
                )
            join.next_part += 1
            snap = join.snapshot
        encoded = snap.encode()  # already encoded for part 0: no work under the lock either way
        start = index * join.part_bytes
        part = encoded[start : start + join.part_bytes]
        return Reply({"ok": True, "index": index}, part, self._after_part(join, index))

    def _after_part(self, join: Join, index: int) -> Callable[[], None] | None:
        """After the last part has been sent in full, the join is LOADING."""
        if index < join.parts - 1:
            return None

        def fetched() -> None:
            with self._cond:
                life = self.coordinator.lifecycle(join.worker)
                if life.join == join.number and life.state is HybridState.JOIN_REQUESTED:
                    self.coordinator.snapshot_fetched(join.worker)

        return fetched

    def on_loaded(self, session: ServerSession, aligned_through: int) -> dict[str, Any]:
        with self._cond:
            join = self._joins.get(session.session)
            if join is None or join.snapshot is None:
                raise ValueError("loaded before a snapshot was sent on this connection")
            life = self.coordinator.lifecycle(join.worker)
            if over := self.superseded(join):
                return ended(over)
            if life.state is HybridState.ROLLOUT:
                return ended(why_over(life))
            self.coordinator.loaded(join.worker, aligned_through)
        return {"ok": True}
