"""The life cycle of one hybrid worker in the Elastic Hybrid Pool, as an explicit transition table.

A hybrid serves rollout until the planner moves it to training. Joining is non-blocking for the
core: the hybrid fetches a snapshot and replays averaged updates (zero-gradient steps) while core
training keeps stepping, and is activated only at a step boundary. Every change of state goes
through `HybridLifecycle.apply`, which raises IllegalTransition for a pair not in TRANSITIONS, so a
late or duplicated event can never put a worker in an undefined state.

    ROLLOUT --request_join--> JOIN_REQUESTED --snapshot_fetched--> LOADING --loaded--> WARMING
    WARMING --activate (step boundary)--> ACTIVE --request_leave--> LEAVING --left--> ROLLOUT
    JOIN_REQUESTED | LOADING | WARMING --cancel--> ROLLOUT
    any training-side state --fail--> ROLLOUT   (rollback: the worker serves rollout again)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class HybridState(enum.Enum):
    ROLLOUT = "rollout"  # serving rollout; not part of training
    JOIN_REQUESTED = "join_requested"  # the plan moved it to training; waiting to fetch the snapshot
    LOADING = "loading"  # fetching / loading the model + optimizer snapshot
    WARMING = "warming"  # replaying averaged updates; contributes zero gradient, not counted
    ACTIVE = "active"  # in the frozen membership; its gradient is summed and counted
    LEAVING = "leaving"  # asked to leave; still counted in steps whose membership was frozen before


class HybridEvent(enum.Enum):
    REQUEST_JOIN = "request_join"
    SNAPSHOT_FETCHED = "snapshot_fetched"
    LOADED = "loaded"
    ACTIVATE = "activate"
    REQUEST_LEAVE = "request_leave"
    LEFT = "left"
    CANCEL = "cancel"
    FAIL = "fail"


S, E = HybridState, HybridEvent

TRANSITIONS: dict[tuple[HybridState, HybridEvent], HybridState] = {
    (S.ROLLOUT, E.REQUEST_JOIN): S.JOIN_REQUESTED,
    (S.JOIN_REQUESTED, E.SNAPSHOT_FETCHED): S.LOADING,
    (S.LOADING, E.LOADED): S.WARMING,
    (S.WARMING, E.ACTIVATE): S.ACTIVE,
    (S.ACTIVE, E.REQUEST_LEAVE): S.LEAVING,
    (S.LEAVING, E.LEFT): S.ROLLOUT,
    (S.JOIN_REQUESTED, E.CANCEL): S.ROLLOUT,
    (S.LOADING, E.CANCEL): S.ROLLOUT,
    (S.WARMING, E.CANCEL): S.ROLLOUT,
    (S.JOIN_REQUESTED, E.FAIL): S.ROLLOUT,
    (S.LOADING, E.FAIL): S.ROLLOUT,
    (S.WARMING, E.FAIL): S.ROLLOUT,
    (S.ACTIVE, E.FAIL): S.ROLLOUT,
    (S.LEAVING, E.FAIL): S.ROLLOUT,
}

# States in which the worker holds training state (snapshot, replica) that a failure must discard.
TRAINING_SIDE = frozenset({S.JOIN_REQUESTED, S.LOADING, S.WARMING, S.ACTIVE, S.LEAVING})
# Training-side states in which no payload deadline watches the worker: the gateway fails it when the
# connection serving its join ends (an ACTIVE one misses a deadline).
UNWATCHED = TRAINING_SIDE - {S.ACTIVE}
# States in which a hybrid's training loop keeps going (applying updates); any other ends it.
LOOP_STATES = frozenset({S.WARMING, S.ACTIVE, S.LEAVING})


class IllegalTransition(RuntimeError):
    """An event that the current state does not allow (a bug or a stale message, never ignored)."""


@dataclass
class HybridLifecycle:
    """One hybrid's state plus the history of (step, event, new state) it went through."""

    worker_id: str
    state: HybridState = HybridState.ROLLOUT
    history: list[tuple[int, HybridEvent, HybridState]] = field(default_factory=list)
    failure: str | None = None  # reason of the last FAIL (rollback), if any
    # Number of the current (or last) join: bumped by every request_join, so a connection bound to an
    # earlier join (cancelled or failed, then requested again) can be told its join is over.
    join: int = 0

    def can(self, event: HybridEvent) -> bool:
        return (self.state, event) in TRANSITIONS

    def apply(self, event: HybridEvent, step: int, reason: str | None = None) -> HybridState:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            allowed = sorted(e.value for (s, e) in TRANSITIONS if s is self.state)
            raise IllegalTransition(
                f"hybrid {self.worker_id}: event {event.value!r} is illegal in state {self.state.value!r} "
                f"(allowed: {', '.join(allowed)})"
            )
        if event is HybridEvent.FAIL:
            self.failure = reason or "unspecified failure"
        elif event is HybridEvent.REQUEST_JOIN:
            self.join += 1
        self.state = new
        self.history.append((step, event, new))
        return new
