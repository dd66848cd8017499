"""Planning for the expected iteration: spread.py's estimates and the search that uses them."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from libra_core.planner.iteration import iteration_time_s
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.search import SearchSettings, search_plans
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.spread import (
    Spread,
    balanced_groups_factor,
    estimate_spread,
    expected_max,
    expected_max_standard_normal,
)
from libra_core.planner.workload import Turns, concat, workload_from_turns
from libra_core.sim.workloads import load_scenario

A800 = get_hardware("A800")


def test_expected_max_known_answers() -> None:
    assert expected_max(10.0, 0.0, 4.0, 0.0) == 10.0
    # Two equal means: a + sigma / sqrt(pi) (the max of two iid normals).
    assert expected_max(10.0, 2.0, 10.0, 2.0) == pytest.approx(
        10.0 + 2.0 * math.sqrt(2) / math.sqrt(2 * math.pi)
    )
    assert expected_max(math.inf, 1.0, 3.0, 1.0) == math.inf
    rng = np.random.default_rng(0)
    x, y = rng.normal(10.0, 1.5, 400_000), rng.normal(9.0, 1.0, 400_000)
    assert expected_max(10.0, 1.5, 9.0, 1.0) == pytest.approx(float(np.maximum(x, y).mean()), rel=2e-3)
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert expected_max_standard_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-4)
    assert balanced_groups_factor(1, Spread(0.2, 0.1)) == 1.0
    assert balanced_groups_factor(3, Spread(0.2, 0.1)) == pytest.approx(
        1 + 0.2 * 1.5 / math.sqrt(math.pi), rel=1e-4
    )


def test_iteration_time_with_spread_pays_for_balance() -> None:
    spread = Spread(0.1, 0.1)
    assert iteration_time_s(10, 4, 1, staleness=1, spread=Spread()) == 11
    balanced = iteration_time_s(10, 10, 0, staleness=1, spread=spread)
    slack = iteration_time_s(10, 5, 0, staleness=1, spread=spread)
    assert balanced > slack > 10.0 and slack == pytest.approx(10.0, rel=1e-3)
    assert iteration_time_s(10, 10, 0, staleness=0, spread=spread) == 20  # nothing overlaps: no max


def _grouped(totals: list[int], per_group: int) -> object:
    """Groups of `per_group` equal trajectories (prompt 100) whose group totals are `totals`."""
    prompt, gen, pay, lat, idx = [], [], [], [], []
    for g, total in enumerate(totals):
        for _ in range(per_group):
            prompt.append(100)
            gen.append([total // per_group - 100])
            pay.append([0])
            lat.append(1.0)
            idx.append(g)
    return workload_from_turns(
        "grouped", Turns(prompt, gen, pay, lat), 8, per_group, group_index=np.array(idx)
    )


def test_train_spread_is_the_group_spread_over_the_iteration() -> None:
    totals = [4000, 8000] * 16  # 32 groups; an iteration holds 8 of them
    w = _grouped(totals, 4)
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    got = estimate_spread(w, cost, (1, 2, 4, 8))
    arr = np.array(totals, dtype=float)
    assert got.train_cv == pytest.approx(arr.std(ddof=1) / arr.mean() / math.sqrt(8))
    assert got.rollout_cv > 0  # the slowest group of 8 drawn is not always an 8000-token one
    assert estimate_spread(replace(w, group_index=None), cost, (1, 2, 4, 8)) == Spread()
    # Windows concatenate without merging groups of different iterations.
    both = concat([w, w], "two")
    assert both.group_index is not None and len(np.unique(both.group_index)) == 64


def _iteration(scenario: str, j: int) -> object:
    """Iteration j of a simulator scenario as a planner workload, groups indexed by prompt."""
    wl = load_scenario(scenario, 100, 0)
    ts = wl.trajectories(j)
    _, idx = np.unique([t.prompt_id for t in ts], return_inverse=True)
    turns = Turns(
        [t.prompt_tokens for t in ts],
        [[x.gen_tokens for x in t.turns] for t in ts],
        [[x.payload_tokens for x in t.turns] for t in ts],
        [sum(t.tool_latency_s) for t in ts],
    )
    spec = wl.spec
    return workload_from_turns(
        f"{scenario}{j}", turns, spec.prompts_per_iteration, spec.group_size, group_index=idx
    )


def test_one_iteration_predicts_the_spread_between_iterations() -> None:
    # r2e-gym: the train spread estimated from iteration 0's 32 groups against the spread of the
    # total tokens of 20 iterations (around their linear drift).
    wl = load_scenario("r2e-gym", 100, 0)
    totals = [sum(t.total_tokens for t in wl.trajectories(j)) for j in range(20)]
    est = estimate_spread(
        _iteration("r2e-gym", 0), RolloutCostModel(get_model("qwen3-14b"), A800), (1, 2, 4, 8)
    )
    x = np.arange(20)
    res = np.array(totals) - np.polyval(np.polyfit(x, totals, 1), x)
    measured = res.std(ddof=2) / np.mean(totals)
    assert measured / 1.5 < est.train_cv < measured * 1.5


def test_search_optimises_the_expected_iteration() -> None:
    # search-r1 on 48 A800: planned for the mean, rollout and update nearly balance (16 training
    # GPUs); planned for the expected iteration, training gets more GPUs and the rollout slack.
    # At the capped path's prices (the default until 2026-12-04, when this case was found); with the
    # two-phase path both objectives pick the same 12-GPU split here.
    m, w = get_model("qwen2.5-7b"), _iteration("search-r1", 0)
    mean_s = SearchSettings(staleness=1, homogeneous=True, two_phase_path=False)
    spread_s = replace(mean_s, plan_for_spread=True)
    by_mean = search_plans(m, A800, 48, w, mean_s)[0]
    by_spread = search_plans(m, A800, 48, w, spread_s)[0]
    assert by_spread.train_gpus > by_mean.train_gpus
    assert by_spread.t_train_s < by_mean.t_train_s
    # Each is the best of its own objective (up to the split ranking's grid), and the expected
    # iteration is never shorter than the mean one.
    assert by_spread.t_iter_s < evaluate_plan(by_mean, m, A800, w, spread_s).t_iter_s
    assert by_mean.t_iter_s < evaluate_plan(by_spread, m, A800, w, mean_s).t_iter_s
    assert by_spread.t_iter_s >= evaluate_plan(by_spread, m, A800, w, mean_s).t_iter_s


def test_measured_trajectories_carry_their_groups_and_the_service_plans_for_the_spread() -> None:
    import pyarrow as pa

    from libra_core.config.models import LibraConfig
    from libra_core.planner.service import LibraPlanner
    from libra_core.planner.workload import workload_from_trajectory_table

    rows = [
        {
            "iteration": it,
            "prompt_id": f"p{p}",
            "group_id": f"g{it}-{p}",
            "prompt_ids": [1] * 20,
            "loss_mask": [1] * (50 + 10 * p + s),
            "tool_events": [{"turn": 0, "payload_tokens": 5}],
            "tool_latency_s": 0.5,
        }
        for it in (0, 1)
        for p in range(3)
        for s in range(4)
    ]
    w = workload_from_trajectory_table(pa.Table.from_pylist(rows), group_size=4)
    assert w.group_index is not None and len(np.unique(w.group_index)) == 6  # 3 prompts x 2 iterations
    assert w.prompts_per_iteration == 3
    for a, b in zip(rows, w.group_index.tolist(), strict=True):
        assert b == 3 * a["iteration"] + int(a["prompt_id"][1:])
    cfg = {"type": "libra", "hardware": "8xH100", "model_spec": "qwen3-4b", "staleness": 1}
    pipeline = {"mode": "async"}  # staleness 1 prices the overlapped pipeline
    plain = LibraPlanner.from_config(LibraConfig.model_validate({"planner": cfg, "pipeline": pipeline}))
    spread = LibraPlanner.from_config(
        LibraConfig.model_validate({"planner": {**cfg, "plan_for_spread": True}, "pipeline": pipeline})
    )
    assert not plain.settings().plan_for_spread and spread.settings().plan_for_spread
