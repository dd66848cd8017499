"""A resumed run's planner: `catch_up` replays the recorded iterations into a fresh planner, which
then continues exactly as the planner of the uninterrupted run (plan, corrections, move audit)."""

from __future__ import annotations

import pytest

from libra_core.config import LibraConfig
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanDecision
from libra_core.planner.service import LibraPlanner

LONG = workload_preset("math-short").scaled(4.0)
CONFIG = LibraConfig.model_validate(
    {
        "planner": {
            "type": "libra",
            "replan_every": 4,
            "hardware": "48xA800",
            "model_spec": "qwen3-8b",
            "initial_workload": "math-short",
            "audit_window": 1,
            "min_gain_fraction": 0.001,  # any saving moves
        }
    }
)
# What the run recorded per iteration (rollout s, update s): the workload drifted 4x longer than
# the prior from the start; iteration 5, the first after the move at 4, measured twice as slow.
MEASURED = {k: (900.0, 300.0) for k in range(1, 12)}
MEASURED[5] = (1800.0, 600.0)


def feed(planner: LibraPlanner, k: int) -> None:
    rollout_s, update_s = MEASURED[k]
    planner.observe(LONG, 16, {"rollout": rollout_s, "update": update_s}, iteration=k)


def run(planner: LibraPlanner, first: int, last: int) -> list[ReplanDecision]:
    """The plan stage's calls for iterations first..last: observe the previous one, then step."""
    decisions = []
    for k in range(first, last + 1):
        if k > 1:
            feed(planner, k - 1)
        _, decision = planner.step(k)
        if decision is not None:
            decisions.append(decision)
    return decisions


def test_a_caught_up_planner_continues_as_the_uninterrupted_one() -> None:
    straight = LibraPlanner.from_config(CONFIG)
    before = run(straight, 1, 6)
    # The history holds a move and its revert, so the audit state is not trivial.
    assert [(d.iteration, d.action) for d in before] == [(1, "initial"), (4, "apply"), (6, "revert")]

    resumed = LibraPlanner.from_config(CONFIG)
    replayed = resumed.catch_up(7, lambda k: feed(resumed, k))
    assert [d.as_record() for d in replayed] == [d.as_record() for d in before]
    feed(straight, 6)  # the uninterrupted run observes iteration 6 before planning 7
    assert resumed.corrections.factor("rollout") == pytest.approx(straight.corrections.factor("rollout"))
    assert resumed.corrections.factor("rollout") != pytest.approx(1.0)  # the replay fed corrections
    assert resumed.plan is not None and straight.plan is not None
    assert resumed.plan.same_resources(straight.plan)
    margin = straight.audit.extra_margin(7)
    assert margin > 0 and resumed.audit.extra_margin(7) == pytest.approx(margin)
    assert len(resumed.window) == len(straight.window)

    # From here on both make the same calls and the same decisions (8 and 12 replan).
    for k in range(7, 12):
        for planner in (straight, resumed):
            if k > 7:
                feed(planner, k - 1)
        (a, da), (b, db) = straight.step(k), resumed.step(k)
        assert a.same_resources(b) and a.t_iter_s == pytest.approx(b.t_iter_s)
        assert (da is None) == (db is None)
        if da is not None and db is not None:
            assert da.as_record() == db.as_record()


def test_without_catch_up_a_fresh_planner_starts_over() -> None:
    """What a resumed run did before catch_up: an `initial` plan that ignores the recorded run."""
    straight = LibraPlanner.from_config(CONFIG)
    run(straight, 1, 6)
    fresh = LibraPlanner.from_config(CONFIG)
    _, decision = fresh.step(7)
    assert decision is not None and decision.action == "initial"
    assert fresh.audit.extra_margin(7) == 0.0 < straight.audit.extra_margin(7)


def test_catch_up_needs_a_fresh_planner() -> None:
    planner = LibraPlanner.from_config(CONFIG)
    planner.step(1)
    with pytest.raises(AssertionError, match="fresh planner"):
        planner.catch_up(3, lambda k: feed(planner, k))


def test_catch_up_at_the_first_iteration_does_nothing() -> None:
    planner = LibraPlanner.from_config(CONFIG)
    seen: list[int] = []
    assert planner.catch_up(1, seen.append) == []
    assert seen == [] and planner.plan is None
