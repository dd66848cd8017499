"""Planner edge cases a mutation audit found unguarded.

Guards the boundaries of: the rollout frontier at exactly the GPUs a range needs, the replan
hysteresis and move-cost comparisons at equality, `Plan.same_gpu_groups` over expert parallelism,
expert optimizer sharding over dp/ep, 1F1B micro-batches in flight, re-pricing a plan whose
training no longer fits, and the split candidates' last value.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from libra_core.planner.assignment import SegmentTable
from libra_core.planner.memory import activation_bytes_per_token_layer, params_per_gpu, train_memory
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanPolicy
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import SearchSettings, _rollout_frontier, _split_candidates, search_plans
from libra_core.planner.specs import get_hardware, get_model

M, HW = get_model("qwen3-8b"), get_hardware("A800")
MOE = get_model("qwen3-30b-a3b")
SET = SearchSettings(staleness=1)
INF = math.inf


def one_bin_table() -> SegmentTable:
    """One TP-1 bin: 10 s of work, a 2 s critical path, priced alike for any instance count."""
    work = np.array([[[INF, 10.0], [INF, INF]]])
    crit = np.array([[[INF, 2.0], [INF, INF]]])
    return SegmentTable((1,), work, crit, np.array([0, 1]), np.array([5.0]))


def test_rollout_frontier_is_finite_with_exactly_the_gpus_needed() -> None:
    # Regression: `need <= n` as `need < n` priced a range needing exactly n GPUs at infinity.
    dp = _rollout_frontier(one_bin_table(), SearchSettings())
    one = dp(1)
    assert math.isfinite(one)
    assert one == pytest.approx(10.0, rel=2e-3)  # one instance does all 10 s of work (grid step)
    assert dp(2) == pytest.approx(5.0, rel=2e-3)  # two split it, still above the 2 s critical path


@pytest.fixture(scope="module")
def base_plan():
    return search_plans(M, HW, 48, workload_preset("math-short"), SET)[0]


def moved(plan):
    """`plan` on another training split: a move that costs GPU transfers."""
    return replace(plan, train_gpus=plan.train_gpus + 8, rollout_gpus=plan.rollout_gpus - 8)


def test_saving_equal_to_the_hysteresis_threshold_is_not_below_it(base_plan) -> None:
    # Regression: `saving < threshold` as `<=` kept a plan whose saving equals the threshold.
    window = workload_preset("math-short")
    current = replace(base_plan, t_iter_s=8.0)
    proposed = replace(moved(base_plan), t_iter_s=7.0)  # saving 1.0 == 0.125 * 8.0
    policy = ReplanPolicy(min_gain_fraction=0.125, expected_iterations=60)
    decision = policy.decide(1, current, current, proposed, window, move_cost_s=59.0)
    assert decision.action == "apply"
    assert decision.saving_per_iter_s == 1.0 and decision.move_cost_s == 59.0


def test_amortised_gain_equal_to_the_move_cost_keeps_the_plan(base_plan) -> None:
    # Regression: `gain <= cost` as `gain < cost` applied a move whose gain only equals its cost.
    window = workload_preset("math-short")
    current = replace(base_plan, t_iter_s=8.0)
    proposed = replace(moved(base_plan), t_iter_s=7.0)  # gain 60 iterations x 1.0 s = 60 s
    policy = ReplanPolicy(min_gain_fraction=0.125, expected_iterations=60)
    decision = policy.decide(1, current, current, proposed, window, move_cost_s=60.0)
    assert decision.action == "keep" and "move cost" in decision.reason


def test_same_gpu_groups_at_equal_price_is_no_saving(base_plan) -> None:
    # Regression: a free proposal priced exactly like the current plan applied (saving 0 is none).
    window = workload_preset("math-short")
    current = replace(base_plan, t_iter_s=8.0)
    layout = base_plan.train.layout
    proposed = replace(
        current, train=replace(base_plan.train, layout=replace(layout, recompute=not layout.recompute))
    )
    assert proposed.same_gpu_groups(current)
    decision = ReplanPolicy(0.125, 60).decide(1, current, current, proposed, window)
    assert decision.action == "keep" and decision.reason == "no saving"
    assert decision.move_cost_s == 0.0


def test_same_gpu_groups_differs_on_expert_parallelism() -> None:
    # Regression: `same_gpu_groups` ignored EP, so an EP change counted as a free move.
    plans = search_plans(MOE, HW, 16, workload_preset("math-short"), SET)
    a = next(p for p in plans if p.train.layout.ep > 1)
    b = replace(a, train=replace(a.train, layout=replace(a.train.layout, ep=1)))
    assert not a.same_gpu_groups(b) and not b.same_gpu_groups(a)
    c = replace(a, train=replace(a.train, layout=replace(a.train.layout, zero_stage=1)))
    assert a.same_gpu_groups(c)  # a ZeRO change alone moves no GPU


def test_expert_optimizer_states_shard_over_dp_over_ep() -> None:
    # Regression: expert states sharded over dp (8) instead of the dp/ep = 2 expert replicas.
    mem = train_memory(
        MOE, tp=1, pp=1, dp=8, ep=4, zero_stage=1, recompute=False, micro_batch_tokens=4096.0, micro_batches=1
    )
    dense, _ = params_per_gpu(MOE, 1, 1, 4)
    expert = MOE.num_layers * MOE.num_experts * MOE.expert_params / 4  # experts split over EP 4
    assert mem.optimizer_bytes == pytest.approx(dense * 12 / 8 + expert * 12 / 2)
    assert mem.weights_bytes == pytest.approx((dense + expert) * 2)  # ZeRO-1 keeps whole bf16 weights


def test_pipeline_holds_only_the_micro_batches_it_has() -> None:
    # Regression: `min(micro_batches, pp)` as `pp` counted 4 micro-batches in flight with only 1.
    tokens = 8192.0
    kw = dict(tp=1, pp=4, dp=1, ep=1, zero_stage=1, recompute=False, micro_batch_tokens=tokens)
    one = train_memory(M, micro_batches=1, **kw)
    four = train_memory(M, micro_batches=4, **kw)
    per_layer = activation_bytes_per_token_layer(M, 1) * tokens
    assert one.activations_bytes == pytest.approx(per_layer * M.num_layers / 4)
    assert four.activations_bytes == pytest.approx(4 * one.activations_bytes)


def test_re_pricing_a_workload_training_cannot_fit_is_infinite(base_plan) -> None:
    # Regression: an infeasible training estimate's finite time_s priced the plan as if it ran.
    longer = workload_preset("math-short").scaled(8.0)
    now = evaluate_plan(base_plan, M, HW, longer, SET)
    assert not now.train.feasible and math.isfinite(now.train.time_s)
    assert math.isfinite(now.t_rollout_s)  # rollout still fits: only training is out of memory
    assert now.t_train_s == INF and now.t_iter_s == INF


def test_split_candidates_cover_every_split_up_to_total_minus_one() -> None:
    # Regression: a candidate list that dropped total - 1 (7 training GPUs of 8).
    assert _split_candidates(8, 8) == [1, 2, 3, 4, 5, 6, 7]
    assert _split_candidates(2, 8) == [1]
