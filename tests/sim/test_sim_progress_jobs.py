"""`simulate`'s progress callback and its `jobs`: each policy, then the lower bound, reports
0..iterations in order; watching a run or splitting it over worker processes does not change it;
failures in a worker reach the caller with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_script_without_the_main_guard_is_told_why_its_workers_died(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from libra_core.sim import simulate\n"
        "simulate('tiny', '8xA800', 1, ['greedy', 'colocated'], jobs=2)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode != 0
    assert "BrokenProcessPool" in out.stderr and "if __name__ == '__main__':" in out.stderr
