"""Planner rules a mutation audit found untested: the balanced-groups factor of a re-priced plan, the
two-phase path's KV-queue share, and boundaries of the segment table, the spread and a step's
longest sequence. Expected values are derived from the documented rules here, on small workloads."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

from libra_core.planner.assignment import SegmentTable
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table, instance_tp_degrees
from libra_core.planner.search import SearchSettings, bucket_count, search_plans
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.spread import estimate_spread
from libra_core.planner.step_longest import StepLongest
from libra_core.planner.workload import Turns, Workload, workload_from_turns

A800 = get_hardware("A800")
QWEN3_8B = get_model("qwen3-8b")


def _uniform(samples: int, prompt: float, gen: float, tool_s: float, prompts: int, group: int) -> Workload:
    """`samples` equal trajectories (one turn, no calls) standing for `prompts x group` of them."""
    return Workload(
        "uniform",
        prompts,
        group,
        np.full(samples, prompt),
        np.full(samples, gen),
        np.zeros(samples),
        np.zeros(samples),
        np.zeros(samples),
        np.full(samples, tool_s),
    )


# -- 1: re-pricing a running plan for the spread keeps the balanced-groups factor -----------------
def _grouped_spread_workload() -> Workload:
    # 32 GRPO groups of 4 (8 per iteration): every fourth group long, the rest short, lengths drawn
    # per trajectory, so the slowest trajectory of an iteration varies (a rollout spread).
    rng = np.random.default_rng(0)
    prompt, gen, pay, lat, idx = [], [], [], [], []
    for g in range(32):
        for _ in range(4):
            n = int(rng.integers(200, 4000)) if g % 4 else int(rng.integers(4000, 16000))
            prompt.append(200)
            gen.append([n // 2, n // 2])
            pay.append([100, 0])
            lat.append(1.0)
            idx.append(g)
    return workload_from_turns("grouped", Turns(prompt, gen, pay, lat), 8, 4, group_index=np.array(idx))


def test_a_mixed_plan_re_priced_for_the_spread_pays_for_its_slowest_group() -> None:
    w = _grouped_spread_workload()
    s = SearchSettings(staleness=1, plan_for_spread=True, top_k=8, num_bins=8)
    plans = search_plans(QWEN3_8B, A800, 16, w, s)
    mixed = [p for p in plans if bucket_count(p.rollout) == 2]
    assert mixed, [p.instance_tps for p in plans]
    plan = mixed[0]
    cv = estimate_spread(
        w, RolloutCostModel(QWEN3_8B, A800, s.max_num_seqs), instance_tp_degrees(QWEN3_8B, A800)
    )
    assert cv.rollout_cv > 0.05
    # Two buckets each sized to end at T: the rollout ends with the slower, E = T (1 + cv E[max of 2
    # N(0, 1)]), and E[max of 2 N(0, 1)] = 1 / sqrt(pi).
    factor = 1.0 + cv.rollout_cv / math.sqrt(math.pi)
    again = evaluate_plan(plan, QWEN3_8B, A800, w, s)
    assert bucket_count(again.rollout) == 2
    assert again.t_rollout_s == pytest.approx(again.rollout.makespan_s * factor, rel=1e-4)
    assert again.t_rollout_s == pytest.approx(plan.t_rollout_s, rel=1e-9)  # as the search priced it
    # Planned for the mean, the same plan is the makespan alone: the factor is the spread's doing.
    mean = evaluate_plan(plan, QWEN3_8B, A800, w, replace(s, plan_for_spread=False))
    assert mean.t_rollout_s == pytest.approx(again.rollout.makespan_s, rel=1e-12)
    assert again.t_rollout_s / mean.t_rollout_s == pytest.approx(factor, rel=1e-4)


# -- 2: the two-phase path, finished within the first phase, is the loaded path over rho ----------
def test_a_path_that_ends_in_the_first_phase_holds_a_kv_slot_a_share_rho_of_the_time() -> None:
    # 64 equal trajectories (8 samples x weight 8), one turn, 30 s of tool time each, on TP1
    # instances whose batch is capped at 4 (max_num_seqs): on 1 to 4 instances more of them want to
    # decode than the cap holds, so each holds a slot only rho = cap / demand of the time.
    prompt, gen, tool_s = 500.0, 1000.0, 30.0
    w = _uniform(8, prompt, gen, tool_s, 16, 4)
    cost = RolloutCostModel(QWEN3_8B, A800, max_num_seqs=4)
    table = build_segment_table(cost, w, (1,), 1, 8, two_phase=True)
    ctx = prompt + gen / 2  # the mean context over a trajectory's life
    cap = float(cost.concurrency(1, ctx, np.inf))
    assert cap == 4.0
    per_tok = float(cost.prefill_s_per_token(1, ctx))
    prefill_s = prompt * per_tok
    for n in (1, 2, 4):
        q = 64 / n  # trajectories per instance
        batch = float(cost.active_batch(1, q, gen, prompt, tool_s, ctx, ctx))
        step = float(cost.decode_step_s(1, batch, ctx))
        work_per_instance = q * (gen * step / batch + prefill_s)  # W / n
        stall = prefill_s / (gen * step / batch)  # the others' prefills per second of decode
        loaded = gen * step * (1.0 + stall * (1.0 - 1.0 / q)) + prefill_s + tool_s
        busy = gen * step + prefill_s
        rho = cap / (q * busy / (busy + tool_s))
        assert rho < 1.0  # the queue: more want to decode than the KV cache holds
        assert work_per_instance * rho >= loaded  # it finishes within the first phase (f = 1)
        assert float(table.work_s[0, n - 1, 0, 1]) == pytest.approx(n * work_per_instance, rel=1e-9)
        assert float(table.crit_s[0, n - 1, 0, 1]) == pytest.approx(loaded / rho, rel=1e-6), n
        # ...and not W / n, the second phase's start, which the path would otherwise wait for.
        assert loaded / rho < work_per_instance * (1 - 1e-3)


# -- 3: boundaries of the segment table, the spread and a step's longest sequence ------------------
@dataclass(frozen=True)
class _FixedKvCost(RolloutCostModel):
    """A cost model whose instances hold exactly `kv_tokens` tokens of KV cache (test double)."""

    kv_tokens: float = 0.0

    def kv_capacity_tokens(self, tp: int) -> float:
        return self.kv_tokens


def test_a_segment_table_refuses_a_degree_listed_twice() -> None:
    # "tps must be strictly ascending": a repeated degree would price one degree as two groups.
    prices = np.ones((2, 1, 2, 2))
    edges, longest = np.array([0, 4]), np.array([100.0])
    assert SegmentTable((1, 2), prices, prices, edges, longest).tps == (1, 2)
    for tps in ((2, 2), (2, 1)):
        with pytest.raises(ValueError, match="strictly ascending"):
            SegmentTable(tps, prices, prices, edges, longest)


def test_a_range_whose_longest_context_just_fits_the_kv_cache_is_priced() -> None:
    # "C = inf when TP t cannot ... hold the range's longest context": 1,000 tokens fit 1,000.
    w = _uniform(4, 400.0, 600.0, 0.0, 1, 4)
    assert w.total_tokens.max() == 1000
    fits = build_segment_table(_FixedKvCost(QWEN3_8B, A800, kv_tokens=1000.0), w, (1,), 1, 4)
    assert np.isfinite(fits.crit_s[0, :, 0, 1]).all()
    assert fits.group_time_s(0, 1, 0, 1) > 0
    short = build_segment_table(_FixedKvCost(QWEN3_8B, A800, kv_tokens=999.0), w, (1,), 1, 4)
    assert np.isinf(short.crit_s[0, :, 0, 1]).all()


def _stops_at_the_floor(payload: int) -> Workload:
    # Two trajectories: A (200 tokens, no call) is bin 0, so the range [1, 2) serves contexts above
    # T_0 = 200. B calls a tool once, its context after the return being 100 + 50 + payload.
    return workload_from_turns(
        "floor", Turns([100, 100], [[100], [50, 300]], [[0], [payload, 0]], [0.0, 2.0]), 1, 2
    )


def test_a_trajectory_whose_last_call_ends_at_a_range_floor_never_reaches_that_range() -> None:
    # Promotion moves a request only at a tool return, and a range starting at bin i serves the
    # contexts above T_{i-1}: B's last return at exactly 200 = T_0 leaves it in the first range, so
    # no trajectory reaches [1, 2): no work, no re-prefill of the floor, no path.
    cost = RolloutCostModel(QWEN3_8B, A800)
    at_floor = _stops_at_the_floor(50)
    assert at_floor.last_call_ctx_tokens.tolist() == [100.0, 200.0]
    table = build_segment_table(cost, at_floor, (1,), 2, 2, promote=True)
    assert table.bin_max_len.tolist() == [200.0, 500.0]
    assert table.work_s[0, :, 1, 2].tolist() == [0.0, 0.0]
    assert table.crit_s[0, :, 1, 2].tolist() == [0.0, 0.0]
    # One token above the floor it climbs: it arrives, prefills T_0 again and runs the rest there.
    above = build_segment_table(cost, _stops_at_the_floor(51), (1,), 2, 2, promote=True)
    assert above.bin_max_len.tolist() == [200.0, 501.0]
    assert (above.work_s[0, :, 1, 2] > 200 * float(cost.prefill_s_per_token(1, 200.0)) * 0.5).all()
    assert (above.crit_s[0, :, 1, 2] > 2.0).all()  # its tool time at least


def test_one_promoted_range_prices_a_trajectory_that_never_grew_as_admission_does() -> None:
    # "With one range over every bin it prices exactly as without `promote`", a trajectory that
    # generated nothing (prompt = final context) included: all of it stays in its band.
    w = workload_from_turns(
        "empty-turn",
        Turns([100, 300, 80], [[0], [50, 300], [20]], [[0], [40, 0], [0]], [0.0, 2.0, 0.5]),
        1,
        3,
    )
    assert w.total_tokens[0] == w.prompt_tokens[0]
    cost = RolloutCostModel(QWEN3_8B, A800)
    promoted = build_segment_table(cost, w, (1, 2), 1, 4, promote=True)
    admitted = build_segment_table(cost, w, (1, 2), 1, 4)
    np.testing.assert_allclose(promoted.work_s, admitted.work_s, rtol=1e-12)
    np.testing.assert_allclose(promoted.crit_s, admitted.crit_s, rtol=1e-12)


def test_the_shortest_trajectory_stopping_in_the_first_band_runs_its_whole_path_there() -> None:
    # A (prompt 50) generated nothing and called nothing: it stops climbing in the first band, and
    # "the slowest trajectory that stops climbing there runs its whole path in every range that
    # holds that band": range [0, 1) (A alone) takes its 50-token prefill at context 50, as the
    # admission price does. B (450 tokens) calls at context 250 and climbs out of the band.
    w = workload_from_turns(
        "first-band", Turns([50, 100], [[0], [100, 200]], [[0], [50, 0]], [0.0, 3.0]), 1, 2
    )
    assert w.total_tokens.tolist() == [50.0, 450.0] and w.last_call_ctx_tokens.tolist() == [50.0, 250.0]
    cost = RolloutCostModel(QWEN3_8B, A800)
    promoted = build_segment_table(cost, w, (1, 2), 2, 4, promote=True)
    admitted = build_segment_table(cost, w, (1, 2), 2, 4)
    for ti, tp in enumerate((1, 2)):
        whole = 50 * float(cost.prefill_s_per_token(tp, 50.0))
        assert whole > 0
        np.testing.assert_allclose(promoted.crit_s[ti, :, 0, 1], whole, rtol=1e-9)
        np.testing.assert_allclose(admitted.crit_s[ti, :, 0, 1], whole, rtol=1e-9)


def _two_sizes(groups: int, per_iteration: int) -> Workload:
    """`groups` GRPO groups of 2 trajectories, alternately 1,000 and 3,000 tokens per group."""
    prompt, gen, pay, lat, idx = [], [], [], [], []
    for g in range(groups):
        for _ in range(2):
            prompt.append(100)
            gen.append([400 if g % 2 == 0 else 1400])
            pay.append([0])
            lat.append(1.0)
            idx.append(g)
    return workload_from_turns(
        "two-sizes", Turns(prompt, gen, pay, lat), per_iteration, 2, group_index=np.array(idx)
    )


@pytest.mark.parametrize(("groups", "per_iteration"), [(2, 2), (4, 1)])
def test_two_groups_or_one_prompt_per_iteration_still_spread(groups: int, per_iteration: int) -> None:
    # Group totals alternate 1,000 and 3,000 tokens: std (ddof 1) / mean / sqrt(groups per iteration).
    totals = np.array([1000.0 if g % 2 == 0 else 3000.0 for g in range(groups)])
    expected = totals.std(ddof=1) / totals.mean() / math.sqrt(per_iteration)
    got = estimate_spread(_two_sizes(groups, per_iteration), RolloutCostModel(QWEN3_8B, A800), (1, 2, 4, 8))
    assert got.train_cv == pytest.approx(expected, rel=1e-12)
    assert got.rollout_cv > 0.0  # the slowest trajectory drawn is sometimes a short group's


def test_a_step_longest_of_exactly_the_step_size_is_possible() -> None:
    # Four sequences, two per step, drawn without replacement: the step's longest is s_i with
    # probability (pairs with max s_i) / C(4, 2). The second-shortest is the longest of {s_1, s_2}:
    # N_i = g = 2 sequences at most s_2 already make one pair.
    lens = [10.0, 20.0, 30.0, 40.0]
    pairs = list(itertools.combinations(lens, 2))
    expected = [sum(max(p) == s for p in pairs) / len(pairs) for s in lens]
    assert expected == [0.0, 1 / 6, 2 / 6, 3 / 6]
    dist = StepLongest.of(np.array(lens), pool=4, per_step=2)
    np.testing.assert_allclose(dist.prob, expected, rtol=1e-12, atol=1e-15)
    a, b = 3.0, 0.002
    exact = float(np.mean([a * max(p) + b * max(p) ** 2 for p in pairs]))
    assert dist.expected_floored(0.0, a, b) == pytest.approx(exact, rel=1e-12)
