"""`simulate`'s progress callback: each policy, then the lower bound, reports 0..iterations in order,
and watching a run does not change it."""

from __future__ import annotations

from libra_core.sim import simulate
from libra_core.sim.simulate import LOWER_BOUND


def test_progress_reports_every_iteration_of_every_stage_in_order() -> None:
    calls: list[tuple[str, int, int]] = []
    policies = ["colocated", "greedy", "+elastic"]
    watched = simulate("tiny", "8xA800", 3, policies, seed=2, progress=lambda *c: calls.append(c))
    expected = [(stage, done, 3) for stage in [*policies, LOWER_BOUND] for done in range(4)]
    assert calls == expected
    plain = simulate("tiny", "8xA800", 3, policies, seed=2)
    assert [r.makespan_s for r in watched.results] == [r.makespan_s for r in plain.results]
    assert watched.lower_bound_s == plain.lower_bound_s
