"""Re-pricing a running layout keeps its instance counts: the count-constrained DP equals brute force,
and `evaluate_plan` prices the running instances, not a layout the DP would choose anew."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra_core.planner.assignment import solve
from libra_core.planner.fixed_counts import brute_force_counts, solve_counts
from libra_core.planner.presets import workload_preset
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.search import SearchSettings, search_plans, segment_table
from libra_core.planner.specs import get_hardware, get_model
from tests.planner.test_planner_assignment import random_table


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_count_dp_equals_brute_force(seed: int, strict: bool) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    tps = (1, 2, 4)[: int(rng.integers(1, 4))]
    table = random_table(rng, k, tps, counts=int(rng.integers(1, 4)))
    instances = {tp: int(rng.integers(1, 4)) for tp in tps}
    expected = brute_force_counts(table, instances, strict)
    got = solve_counts(table, instances, rel_tol=1e-9, strict=strict)
    if math.isinf(expected):
        assert got is None
        return
    assert got is not None
    # Spare instances join their degree's slowest range, which only helps (the random prices fall
    # with more instances), and brute force may give them too: equal within the bisection.
    assert got.makespan_s == pytest.approx(expected, rel=1e-6)
    assert [g.start_bin for g in got.groups] == [0, *[g.end_bin for g in got.groups[:-1]]]
    assert got.groups[-1].end_bin == k
    assert [g.tp for g in got.groups] == sorted(g.tp for g in got.groups)
    used = got.instance_tps()
    assert all(used[tp] == instances[tp] for tp in used)  # a degree that serves uses all of its own
    if strict:
        assert len({g.tp for g in got.groups}) == len(got.groups)
    for g in got.groups:
        assert g.time_s == table.group_time_s(tps.index(g.tp), g.instances, g.start_bin, g.end_bin)


def test_evaluate_plan_keeps_the_running_instances() -> None:
    # 48xA800 Qwen3-14B planned on swe-longtail (14xTP1 2xTP2 3xTP4), re-priced on search-medium:
    # the search's DP re-chose 3xTP1 7xTP4 (until 2026-12-07); the running instances stay.
    m, hw = get_model("qwen3-14b"), get_hardware("A800")
    s = SearchSettings(staleness=0, mixed_margin=0.05)
    plan = search_plans(m, hw, 48, workload_preset("swe-longtail", seed=0), s)[0]
    assert len(plan.instance_tps) > 1  # a mixed layout
    for name in ("search-medium", "swe-longtail"):
        w = workload_preset(name, seed=1)
        now = evaluate_plan(plan, m, hw, w, s)
        assert now.instance_tps == plan.instance_tps
        assert now.rollout.gpus == plan.rollout.gpus
        # The DP free to choose the counts on the same degrees and GPUs is a lower bound, and here
        # a strictly lower one: the old re-price was another layout's.
        table = segment_table(
            RolloutCostModel(m, hw, s.max_num_seqs), w, tuple(sorted(plan.instance_tps)), plan.rollout_gpus, s
        )
        free = solve(table, plan.rollout_gpus, s.rel_tol, s.monotone_tp, s.one_range_per_degree)
        assert free is not None and free.instance_tps() != plan.instance_tps
        assert now.rollout.makespan_s > free.makespan_s * 1.01
