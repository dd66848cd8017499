"""Roles, the per-step frozen membership, and the coordinator that advances it at step boundaries.

The coordinator lives on core rank 0 (inside the gateway) and is the only writer of hybrid state.
It is pure bookkeeping: no sockets, no tensors. The gateway calls it when messages arrive, and the
core calls `freeze_next` once per step boundary, after the update of step s is published, to fix
the membership of step s+1. That frozen membership is what payloads are checked against and what
the divisor counts, so a join or leave can never change the arithmetic of a step already under way.

Timing rules (precise, and tested):
- A join or leave requested before the boundary that freezes step s+1 takes effect at step s+1.
- A WARMING hybrid is activated at the boundary after update s if it has applied every update up to
  s-1 (it will apply update s next, so it starts step s+1 at the core's version).
- An ACTIVE hybrid that missed the payload deadline of a step fails (rollback to rollout) and is
  absent from the next frozen membership; it may join again later.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from libra_core.elastic.state_machine import HybridEvent, HybridLifecycle, HybridState

log = logging.getLogger(__name__)


class Role(enum.Enum):
    CORE_TRAINING = "core_training"  # fixed data-parallel core; its communicators never change
    CORE_ROLLOUT = "core_rollout"  # always serves rollout
    HYBRID = "hybrid"  # moves between rollout and training as a whole data-parallel replica


@dataclass(frozen=True)
class Membership:
    """Who contributes to step `step`: the K core replicas and the active hybrids (frozen)."""

    step: int
    version: int  # policy version every contributor's gradient must be computed against
    epoch: int  # bumped each time the active hybrid set changes
    num_core: int
    active: frozenset[str]

    @property
    def max_divisor(self) -> int:
        return self.num_core + len(self.active)


class Coordinator:
    def __init__(self, num_core: int, *, start_step: int = 0, start_version: int = 0) -> None:
        assert num_core >= 1, "the core group needs at least one replica"
        self.hybrids: dict[str, HybridLifecycle] = {}
        self._aligned_through: dict[str, int] = {}  # last update step a warming hybrid has applied
        self.current = Membership(start_step, start_version, 0, num_core, frozenset())

    def lifecycle(self, worker_id: str) -> HybridLifecycle:
        if worker_id not in self.hybrids:
            self.hybrids[worker_id] = HybridLifecycle(worker_id)
        return self.hybrids[worker_id]

    def state(self, worker_id: str) -> HybridState:
        return self.lifecycle(worker_id).state

    def _apply(self, worker_id: str, event: HybridEvent, reason: str | None = None) -> HybridState:
        new = self.lifecycle(worker_id).apply(event, self.current.step, reason)
        log.info("hybrid %s: %s -> %s at step %d", worker_id, event.value, new.value, self.current.step)
        return new

    # Events from the plan applier (control messages).
    def request_join(self, worker_id: str) -> None:
        self._apply(worker_id, HybridEvent.REQUEST_JOIN)

    def request_leave(self, worker_id: str) -> None:
        self._apply(worker_id, HybridEvent.REQUEST_LEAVE)

    def cancel(self, worker_id: str) -> None:
        self._apply(worker_id, HybridEvent.CANCEL)
        self._aligned_through.pop(worker_id, None)

    def fail(self, worker_id: str, reason: str) -> None:
        if self.lifecycle(worker_id).can(HybridEvent.FAIL):
            log.warning("hybrid %s failed at step %d: %s", worker_id, self.current.step, reason)
            self._apply(worker_id, HybridEvent.FAIL, reason)
        self._aligned_through.pop(worker_id, None)

    # Events from the hybrid (gateway messages).
    def snapshot_fetched(self, worker_id: str) -> None:
        self._apply(worker_id, HybridEvent.SNAPSHOT_FETCHED)

    def loaded(self, worker_id: str, aligned_through: int) -> None:
        self._apply(worker_id, HybridEvent.LOADED)
        self._aligned_through[worker_id] = aligned_through

    def update_applied(self, worker_id: str, step: int) -> None:
        if self.state(worker_id) is HybridState.WARMING:
            self._aligned_through[worker_id] = step

    def freeze_next(self, published_step: int, next_version: int) -> Membership:
        """At the boundary after update `published_step`: fix and return the membership of the next step."""
        active = set(self.current.active)
        for worker_id, life in self.hybrids.items():
            if (
                life.state is HybridState.WARMING
                and self._aligned_through.get(worker_id) == published_step - 1
            ):
                life.apply(HybridEvent.ACTIVATE, published_step + 1)
                self._aligned_through.pop(worker_id, None)
                active.add(worker_id)
            elif life.state is HybridState.LEAVING:
                life.apply(HybridEvent.LEFT, published_step + 1)
                active.discard(worker_id)
            elif life.state is not HybridState.ACTIVE:
                active.discard(worker_id)
        epoch = self.current.epoch + (frozenset(active) != self.current.active)
        self.current = Membership(
            published_step + 1, next_version, epoch, self.current.num_core, frozenset(active)
        )
        log.debug("membership step %d: epoch %d, active %s", self.current.step, epoch, sorted(active))
        return self.current
