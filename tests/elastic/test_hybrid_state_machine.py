"""The hybrid life cycle: every legal transition, every illegal one, and coordinator timing rules."""

from __future__ import annotations

import itertools

import pytest

from libra_core.elastic.membership import Coordinator
from libra_core.elastic.state_machine import (
    TRANSITIONS,
    HybridEvent,
    HybridLifecycle,
    HybridState,
    IllegalTransition,
)

S, E = HybridState, HybridEvent


def test_happy_path_join_then_leave() -> None:
    life = HybridLifecycle("h0")
    for event, state in [
        (E.REQUEST_JOIN, S.JOIN_REQUESTED),
        (E.SNAPSHOT_FETCHED, S.LOADING),
        (E.LOADED, S.WARMING),
        (E.ACTIVATE, S.ACTIVE),
        (E.REQUEST_LEAVE, S.LEAVING),
        (E.LEFT, S.ROLLOUT),
    ]:
        assert life.apply(event, step=0) is state
    assert [h[2] for h in life.history][-1] is S.ROLLOUT


@pytest.mark.parametrize(("state", "event"), [p for p in itertools.product(S, E) if p not in TRANSITIONS])
def test_every_pair_outside_the_table_is_illegal(state: HybridState, event: HybridEvent) -> None:
    life = HybridLifecycle("h0", state=state)
    with pytest.raises(IllegalTransition, match=f"event '{event.value}' is illegal in state '{state.value}'"):
        life.apply(event, step=3)
    assert life.state is state and life.history == []


def test_cancel_and_fail_roll_back_to_rollout() -> None:
    for state in (S.JOIN_REQUESTED, S.LOADING, S.WARMING):
        assert HybridLifecycle("h", state=state).apply(E.CANCEL, 0) is S.ROLLOUT
    for state in (S.JOIN_REQUESTED, S.LOADING, S.WARMING, S.ACTIVE, S.LEAVING):
        life = HybridLifecycle("h", state=state)
        assert life.apply(E.FAIL, 0, "boom") is S.ROLLOUT and life.failure == "boom"
    with pytest.raises(IllegalTransition):
        HybridLifecycle("h", state=S.ACTIVE).apply(E.CANCEL, 0)  # an active replica leaves, not cancels


def test_coordinator_activates_at_the_boundary_after_alignment() -> None:
    c = Coordinator(num_core=2)
    c.request_join("h0")
    c.snapshot_fetched("h0")
    c.loaded("h0", aligned_through=1)  # snapshot taken after update 1 (its weights start step 2)
    m2 = c.freeze_next(published_step=1, next_version=2)
    assert m2.active == frozenset() and m2.epoch == 0, "it must first apply update 2 (replay)"
    m3 = c.freeze_next(published_step=2, next_version=3)
    assert m3.active == {"h0"} and m3.epoch == 1 and m3.max_divisor == 3
    c.request_leave("h0")
    assert c.state("h0") is S.LEAVING
    m4 = c.freeze_next(published_step=3, next_version=4)
    assert m4.active == frozenset() and m4.epoch == 2 and c.state("h0") is S.ROLLOUT


def test_coordinator_lagging_hybrid_waits_and_failure_evicts() -> None:
    c = Coordinator(num_core=1)
    c.request_join("h0")
    c.snapshot_fetched("h0")
    c.loaded("h0", aligned_through=0)
    assert c.freeze_next(5, 6).active == frozenset(), "4 updates behind: keeps replaying"
    c.update_applied("h0", 3)
    assert c.freeze_next(5, 6).active == frozenset(), "applied through 3: update 4 still missing"
    c.update_applied("h0", 4)
    assert c.freeze_next(5, 6).active == {"h0"}, "applied through 4: applies 5 next, active in 6"
    c.fail("h0", "missed deadline")
    assert c.freeze_next(7, 8).active == frozenset() and c.state("h0") is S.ROLLOUT
    c.fail("h0", "again")  # failing a worker that already rolled back is a no-op
    with pytest.raises(IllegalTransition):
        c.request_leave("h0")
