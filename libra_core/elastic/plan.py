"""Applying a plan's training/rollout split to the Elastic Hybrid Pool as ordered role switches.

The planner says how many workers should train; the core training group is fixed, so only hybrids
move. `plan_switches` is pure: from the current roles and hybrid states it returns the switches, in
the order they should be issued. `apply_switches` issues them through a HybridController (core rank
0's gateway for control, the pool for starting a hybrid's training loop) without waiting for joins to
finish: core training keeps stepping, and each join activates at a later step boundary.

Ordering: leaves before joins (a leave frees rollout capacity at once; a join's snapshot load is the
slow part), leaves take the most recently numbered hybrids first and joins the lowest-numbered idle
ones, so repeated plans move the same few workers back and forth and the rest stay put. Hybrids in
the middle of a join count as training (a plan never cancels and re-requests the same worker).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from libra_core.elastic.membership import Role
from libra_core.elastic.state_machine import HybridState, IllegalTransition

log = logging.getLogger(__name__)

TRAINING_STATES = frozenset(
    {HybridState.JOIN_REQUESTED, HybridState.LOADING, HybridState.WARMING, HybridState.ACTIVE}
)


@dataclass(frozen=True)
class RoleSwitch:
    worker_id: str
    action: Literal["join_training", "leave_training", "cancel_join"]


def _natural(worker_id: str) -> tuple[object, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", worker_id))


def plan_switches(
    roles: Mapping[str, Role], hybrid_states: Mapping[str, HybridState], num_training: int
) -> list[RoleSwitch]:
    """Switches that bring the number of training workers (core + hybrids) to `num_training`.

    `hybrid_states` gives each hybrid's state (missing means ROLLOUT). Raises ValueError when the
    target is below the core size or above core + hybrids: the core group never changes.
    """
    core = sorted(w for w, r in roles.items() if r is Role.CORE_TRAINING)
    hybrids = sorted((w for w, r in roles.items() if r is Role.HYBRID), key=_natural)
    low, high = len(core), len(core) + len(hybrids)
    if not low <= num_training <= high:
        raise ValueError(
            f"the plan asks for {num_training} training workers, but the core group has {low} and "
            f"there are {len(hybrids)} hybrids: the target must be in [{low}, {high}]"
        )
    state = {w: hybrid_states.get(w, HybridState.ROLLOUT) for w in hybrids}
    training = [w for w in hybrids if state[w] in TRAINING_STATES]
    idle = [w for w in hybrids if state[w] is HybridState.ROLLOUT]
    delta = num_training - len(core) - len(training)
    if delta < 0:
        # Not-yet-active joins are cancelled first (cheapest), then active replicas leave, newest first.
        pending = [w for w in reversed(training) if state[w] is not HybridState.ACTIVE]
        active = [w for w in reversed(training) if state[w] is HybridState.ACTIVE]
        chosen = (pending + active)[:-delta]
        return [
            RoleSwitch(w, "cancel_join" if state[w] is not HybridState.ACTIVE else "leave_training")
            for w in chosen
        ]
    if delta > len(idle):
        raise ValueError(
            f"the plan needs {delta} more hybrids in training but only {len(idle)} are idle "
            f"(others are leaving); apply it again after they have left"
        )
    return [RoleSwitch(w, "join_training") for w in idle[:delta]]


class HybridController(Protocol):
    """What applying a plan needs from the running job (core rank 0 and the pool)."""

    def request_join(self, worker_id: str) -> None: ...

    def request_leave(self, worker_id: str) -> None: ...

    def cancel(self, worker_id: str) -> None: ...

    def start_hybrid(self, worker_id: str) -> None:
        """Start the hybrid's training loop on its worker (non-blocking; it fetches the snapshot)."""
        ...


@dataclass(frozen=True)
class AppliedSwitch:
    switch: RoleSwitch
    issued_s: float  # wall time to issue it (control message + start); the join completes later


def apply_switches(switches: list[RoleSwitch], controller: HybridController) -> list[AppliedSwitch]:
    """Issue the switches in order; returns at once after issuing (joins finish asynchronously).
    A leave or cancel follows the hybrid's state when issued (`_retire`); one that finds it out of
    training already is left out of the result."""
    applied: list[AppliedSwitch] = []
    for switch in switches:
        t0 = time.perf_counter()
        if switch.action == "join_training":
            controller.request_join(switch.worker_id)
            controller.start_hybrid(switch.worker_id)
        elif not _retire(switch, controller):
            continue
        applied.append(AppliedSwitch(switch, time.perf_counter() - t0))
        log.info("role switch %s %s issued", switch.worker_id, switch.action)
    return applied


def _retire(switch: RoleSwitch, controller: HybridController) -> bool:
    """Take a hybrid out of training the way its state now allows; False when it already is out.

    The switches were planned from the states at one moment while the core kept stepping: a join
    planned to be cancelled may be ACTIVE by now (it must leave), an active one may have failed back
    to rollout or be leaving already (nothing to do). Until 2026-12-06 the stale switch raised
    IllegalTransition and the switches after it were never issued."""
    cancel_first = switch.action == "cancel_join"
    ways = (
        (controller.cancel, controller.request_leave)
        if cancel_first
        else (controller.request_leave, controller.cancel)
    )
    for way in ways:
        try:
            way(switch.worker_id)
            return True
        except IllegalTransition:
            continue
    log.info("role switch %s %s: already out of training, nothing issued", switch.worker_id, switch.action)
    return False
