"""From a planner's training/rollout split to ordered hybrid role switches, and issuing them."""

from __future__ import annotations

import pytest

from libra_core.elastic.membership import Role
from libra_core.elastic.plan import RoleSwitch, apply_switches, plan_switches
from libra_core.elastic.state_machine import HybridState as S

ROLES = {
    "c0": Role.CORE_TRAINING,
    "c1": Role.CORE_TRAINING,
    "r0": Role.CORE_ROLLOUT,
    "h1": Role.HYBRID,
    "h2": Role.HYBRID,
    "h10": Role.HYBRID,
}


def test_grow_joins_lowest_idle_hybrids_in_natural_order() -> None:
    assert plan_switches(ROLES, {}, 4) == [
        RoleSwitch("h1", "join_training"),
        RoleSwitch("h2", "join_training"),
    ]
    assert plan_switches(ROLES, {"h1": S.ACTIVE}, 5) == [
        RoleSwitch("h2", "join_training"),
        RoleSwitch("h10", "join_training"),
    ]


def test_shrink_cancels_pending_joins_before_active_leaves() -> None:
    states = {"h1": S.ACTIVE, "h2": S.ACTIVE, "h10": S.WARMING}
    assert plan_switches(ROLES, states, 4) == [RoleSwitch("h10", "cancel_join")]
    assert plan_switches(ROLES, states, 2) == [
        RoleSwitch("h10", "cancel_join"),
        RoleSwitch("h2", "leave_training"),
        RoleSwitch("h1", "leave_training"),
    ]


def test_no_switch_when_already_at_target_and_joining_counts_as_training() -> None:
    assert plan_switches(ROLES, {"h1": S.LOADING}, 3) == []


def test_targets_outside_core_plus_hybrids_are_errors() -> None:
    with pytest.raises(ValueError, match=r"must be in \[2, 5\]"):
        plan_switches(ROLES, {}, 1)
    with pytest.raises(ValueError, match=r"must be in \[2, 5\]"):
        plan_switches(ROLES, {}, 6)
    with pytest.raises(ValueError, match="only 1 are idle"):
        plan_switches(ROLES, {"h1": S.LEAVING, "h2": S.LEAVING}, 4)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def request_join(self, worker_id: str) -> None:
        self.calls.append(("join", worker_id))

    def request_leave(self, worker_id: str) -> None:
        self.calls.append(("leave", worker_id))

    def cancel(self, worker_id: str) -> None:
        self.calls.append(("cancel", worker_id))

    def start_hybrid(self, worker_id: str) -> None:
        self.calls.append(("start", worker_id))


def test_apply_issues_switches_in_order() -> None:
    rec = Recorder()
    switches = [
        RoleSwitch("h10", "cancel_join"),
        RoleSwitch("h2", "leave_training"),
        RoleSwitch("h1", "join_training"),
    ]
    applied = apply_switches(switches, rec)
    assert rec.calls == [("cancel", "h10"), ("leave", "h2"), ("join", "h1"), ("start", "h1")]
    assert [a.switch for a in applied] == switches and all(a.issued_s >= 0 for a in applied)


def test_a_switch_made_stale_by_a_step_boundary_follows_the_state_and_the_rest_are_issued() -> None:
    # Planned from {h1: warming, h2: join_requested, h10: active}; by the time they are issued h1
    # was activated (cancel is illegal: it must leave) and h10 failed back to rollout (nothing to
    # do). The first illegal switch raised and the ones after it were never issued.
    from libra_core.elastic.membership import Coordinator
    from libra_core.elastic.state_machine import HybridEvent as E

    coord = Coordinator(2)
    for w in ("h1", "h2", "h10"):
        coord.request_join(w)
    for event in (E.SNAPSHOT_FETCHED, E.LOADED, E.ACTIVATE):  # h1 activated since the plan
        coord.lifecycle("h1").apply(event, 0)
    coord.fail("h10", "its connection closed")  # h10 failed back to rollout since the plan

    class Live(Recorder):
        def request_leave(self, worker_id: str) -> None:
            coord.request_leave(worker_id)
            super().request_leave(worker_id)

        def cancel(self, worker_id: str) -> None:
            coord.cancel(worker_id)
            super().cancel(worker_id)

    rec = Live()
    switches = [
        RoleSwitch("h1", "cancel_join"),
        RoleSwitch("h10", "leave_training"),
        RoleSwitch("h2", "cancel_join"),
    ]
    applied = apply_switches(switches, rec)
    assert rec.calls == [("leave", "h1"), ("cancel", "h2")]
    assert [a.switch.worker_id for a in applied] == ["h1", "h2"]
    assert {w: coord.lifecycle(w).state for w in ("h1", "h2", "h10")} == {
        "h1": S.LEAVING,
        "h2": S.ROLLOUT,
        "h10": S.ROLLOUT,
    }
