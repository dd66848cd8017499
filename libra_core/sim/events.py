"""The discrete-event core: a priority queue with an explicit, total event order.

Events are ordered by the key `(time_s, priority, sequence)`: earlier first; at equal times the lower
`priority` first (a finished update is seen before the rollout that waits on it, a tool return before
the decode step that could take its slot); at equal time and priority, in the order they were
scheduled (`sequence` is a counter), so a run never depends on how the heap breaks ties.

Entities whose next event moves (a rollout instance whose batch changed, a training job that gained
workers) do not delete the stale event: each entity keeps a `version` and the stale event carries the
old one, so `EventQueue.pop` callers drop it (lazy invalidation, O(log n) per change).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from enum import IntEnum
from typing import Any, NamedTuple


class Kind(IntEnum):
    """Event kinds; the value is the priority at equal times (lower first)."""

    TRAIN_DONE = 0  # an update finished (weights become available after the sync)
    WEIGHTS_READY = 1  # a new policy version reached the rollout side
    ROLLOUT_START = 2  # an iteration's trajectories are admitted
    TOOL_RETURN = 3  # a trajectory's tool call returned; its next turn is routed
    HYBRID_READY = 4  # a worker finished switching sides (elastic pool)
    DECODE_DONE = 5  # the next turn on an instance finished generating


class Event(NamedTuple):
    """A tuple, so the heap compares `(time_s, priority, sequence)` in C; `sequence` is unique, so
    the fields after it are never compared."""

    time_s: float
    priority: int
    sequence: int
    kind: Kind
    target: Any = None  # instance / trajectory state / None
    version: int = 0  # the target's version when scheduled


_new_event = tuple.__new__

# Events in a row at one simulated time past which `EventQueue.drain` takes the run as stuck; a
# real run's bursts at one time (a rollout's admissions, turns of no tokens and no latency) are
# orders of magnitude smaller.
STUCK_EVENTS = 10_000_000


class EventQueue:
    """Min-heap of events under the (time, priority, sequence) key; `log` keeps (time, kind) pairs."""

    def __init__(self, record: bool = False) -> None:
        self._heap: list[Event] = []
        self._sequence = 0
        self.now_s = 0.0
        self.processed = 0
        self.log: list[tuple[float, str]] | None = [] if record else None

    def push(self, time_s: float, kind: Kind, target: Any = None, version: int = 0) -> Event:
        """Schedule an event (called a few times per simulated turn, so it avoids Python-level calls:
        the tuple is built with `tuple.__new__`, not the NamedTuple's generated `__new__`)."""
        now = self.now_s
        assert time_s >= now - 1e-9, f"event {kind.name} at {time_s} is before now {now}"
        sequence = self._sequence
        self._sequence = sequence + 1
        ev = _new_event(Event, (time_s if time_s >= now else now, int(kind), sequence, kind, target, version))
        heapq.heappush(self._heap, ev)
        return ev

    def pop(self) -> Event | None:
        if not self._heap:
            return None
        ev = heapq.heappop(self._heap)
        self.now_s = ev.time_s
        self.processed += 1
        return ev

    def drain(self) -> Iterator[Event]:
        """`pop` until the queue is empty, including events pushed meanwhile (the simulator's main
        loop: a generator resumes faster than a method call per event). Asserts once
        `STUCK_EVENTS` events in a row fall at one time: an event that re-schedules itself without
        moving anything forward would otherwise spin for ever."""
        heap, heappop = self._heap, heapq.heappop
        last, repeats, most = self.now_s, 0, STUCK_EVENTS
        while heap:
            ev = heappop(heap)
            now = ev[0]
            if now == last:
                repeats += 1
                assert repeats < most, (
                    f"the simulation is stuck at {now!r} s: {repeats:,} events there in a row, the "
                    f"last a {ev[3].name}; an event that moves nothing forward"
                )
            else:
                last, repeats = now, 0
            self.now_s = now
            self.processed += 1
            yield ev

    def record(self, ev: Event, label: str) -> None:
        """Append a processed event to the trace (golden tests pin it)."""
        if self.log is not None:
            self.log.append((round(ev.time_s, 6), f"{ev.kind.name}:{label}"))

    def __len__(self) -> int:
        return len(self._heap)
