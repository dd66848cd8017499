"""`simulate`'s progress callback: each policy, then the lower bound, reports 0..iterations in order,
and watching a run does not change it."""

from __future__ import annotations

import pytest

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


def test_jobs_give_the_same_results_and_every_stage_reaches_its_end() -> None:
    policies = ["colocated", "greedy", "+cmlfq", "+elastic"]
    calls: list[tuple[str, int, int]] = []
    side_by_side = simulate(
        "tiny", "8xA800", 3, policies, seed=1, jobs=2, progress=lambda *c: calls.append(c)
    )
    one_by_one = simulate("tiny", "8xA800", 3, policies, seed=1)
    for a, b in zip(side_by_side.results, one_by_one.results, strict=True):
        assert (a.policy, a.makespan_s, a.moves, a.iteration_s) == (
            b.policy,
            b.makespan_s,
            b.moves,
            b.iteration_s,
        )
    for stage in [*policies, LOWER_BOUND]:  # interleaved across stages, in order within each
        assert [done for s, done, _ in calls if s == stage] == [0, 1, 2, 3], calls


def test_bad_jobs_and_a_cluster_too_small_for_a_split_are_named() -> None:
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        simulate("tiny", "8xA800", 1, ["greedy"], jobs=0)
    with pytest.raises(ValueError, match="greedy, \\+cmlfq: each splits the cluster .* the cluster has 1"):
        simulate("tiny", "1xA800", 1, ["colocated", "greedy", "+cmlfq"])
    assert simulate("tiny", "1xA800", 1, ["colocated"]).results[0].tokens_per_s > 0


def test_a_failing_policy_in_a_worker_raises_in_the_caller() -> None:
    # qwen3-32b trains on no 4 of the 8 GPUs: static-uniform fails in its worker, not silently.
    with pytest.raises(ValueError, match="qwen3-32b does not train on 4"):
        simulate("tiny", "8xA800", 1, ["static-uniform", "colocated"], model="qwen3-32b", jobs=2)
