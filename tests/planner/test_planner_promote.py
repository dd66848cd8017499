"""Pricing the routing that promotes (mlfq, C-MLFQ when unsure): `build_segment_table(promote=True)`.

Every trajectory starts in the first length range and moves up as its context grows, so a range
serves the band of context it covers of every longer trajectory, and each arrival prefills its
context again."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from libra_core.planner.assignment import homogeneous, solve
from libra_core.planner.presets import workload_preset
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.rollout_cost import RolloutCostModel, _band_shares, build_segment_table
from libra_core.planner.search import SearchSettings, search_plans
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.workload import Turns, workload_from_turns

A800 = get_hardware("A800")


def test_band_shares_split_each_life_and_keep_its_mean_context() -> None:
    rng = np.random.default_rng(3)
    prompt = rng.integers(50, 500, 200).astype(float)
    final = prompt + rng.integers(0, 5000, 200)  # some never grow
    top = np.sort(rng.choice(final, 12, replace=False))
    top[-1] = final.max()
    floor = np.concatenate([[0.0], top[:-1]])
    ceiling = prompt + (final - prompt) * rng.uniform(0, 1, 200)  # context at the last tool return
    for high in (final, ceiling):
        share, mid = _band_shares(prompt, final, floor, top, high)
        assert np.allclose(share.sum(axis=1), 1.0)
        assert np.all(share >= 0)
        # Share-weighted band contexts average to the life's mean context, (prompt + final) / 2.
        grew = final > prompt
        assert np.allclose((share * mid).sum(axis=1)[grew], ((prompt + final) / 2)[grew])
        # No share above the band a trajectory climbs to.
        band_of_high = np.searchsorted(top, high, side="left")
        above = np.arange(len(top))[None, :] > band_of_high[:, None]
        assert np.all(share[above] == 0)
    # Stopping early moves growth down into the stopping band, never up.
    full, _ = _band_shares(prompt, final, floor, top)
    stopped, _ = _band_shares(prompt, final, floor, top, ceiling)
    assert np.all(np.cumsum(stopped, axis=1) >= np.cumsum(full, axis=1) - 1e-9)


@pytest.fixture(scope="module")
def swe_tables() -> tuple[RolloutCostModel, object, object]:
    cost = RolloutCostModel(get_model("qwen3-14b"), A800)
    w = workload_preset("swe-longtail", num_samples=400)
    final = build_segment_table(cost, w, (1, 2, 4, 8), 16, 32)
    promote = build_segment_table(cost, w, (1, 2, 4, 8), 16, 32, promote=True)
    return cost, final, promote


def test_one_range_over_every_length_prices_the_same(swe_tables: tuple) -> None:
    _, final, promote = swe_tables
    k = final.num_bins
    assert np.allclose(promote.work_s[..., 0, k], final.work_s[..., 0, k], rtol=1e-9)
    assert np.allclose(promote.crit_s[..., 0, k], final.crit_s[..., 0, k], rtol=1e-9)
    for n in (8, 16, 32):  # so the one-degree layouts do not depend on the routing
        a, b = homogeneous(final, n), homogeneous(promote, n)
        assert a is not None and b is not None
        assert a.groups[0].tp == b.groups[0].tp and a.makespan_s == pytest.approx(b.makespan_s, rel=1e-9)


def test_short_ranges_carry_the_prefixes_of_longer_trajectories(swe_tables: tuple) -> None:
    _, final, promote = swe_tables
    k = final.num_bins
    for j in range(1, k):
        # The first range serves every trajectory's start: more work than its own trajectories.
        assert np.all(promote.work_s[:, :, 0, j] > final.work_s[:, :, 0, j])
    # The last range sees only the top of its own trajectories' lives, and prefills their floors.
    i = k // 2
    top_work = promote.work_s[:, 0, i, k]
    assert np.all(np.isfinite(top_work[-2:]))
    assert np.all(top_work[-2:] > 0)


def test_promotion_prices_a_split_no_faster_than_admission_by_length(swe_tables: tuple) -> None:
    _, final, promote = swe_tables
    for gpus in (8, 16, 32):
        a, b = solve(final, gpus), solve(promote, gpus)
        assert a is not None and b is not None
        # Admission by final length is what promotion approximates at best (no re-prefill, no
        # long trajectory decoding in a short range).
        assert b.makespan_s >= a.makespan_s * (1 - 1e-3)


def test_promoted_path_covers_the_range_top_and_the_re_prefill() -> None:
    # Two bins of one trajectory each: a short one (prompt 100, 1,000 generated) and a long one
    # (prompt 100, 9,000 generated, one 1-token tool return halfway that took 50 s). The second
    # range starts at the short one's length, 1,100 tokens: the long one climbs there at its tool
    # return (context 4,600.5 under evenly spread calls), prefills 1,100 tokens and ends there.
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns([100, 100], [[1000], [4500, 4500]], [[0], [1, 0]], [0.0, 50.0])
    w = workload_from_turns("two", turns, 1, 2, reprefill_fraction=0.0)
    table = build_segment_table(cost, w, (1,), 2, 1, promote=True)
    plain = build_segment_table(cost, w, (1,), 2, 1)
    assert table.bin_max_len.tolist() == [1100, 9101]
    # First range: all of the short one and the long one's first 1,000 tokens of growth.
    assert table.work_s[0, 0, 0, 1] > plain.work_s[0, 0, 0, 1]
    # Second range: the long one alone (batch 1), 8,001 / 9,001 of its growth at the band's mean
    # context (1,100 + 9,101) / 2, plus a 1,100-token re-prefill; its path is its whole path.
    step = float(cost.decode_step_s(1, 1.0, 5100.5))
    pre = float(cost.prefill_s_per_token(1, 5100.5))
    share = 8001 / 9001
    work = 9000 * share * step + (101 * share + 1100) * pre
    assert table.work_s[0, 0, 1, 2] == pytest.approx(work, rel=1e-9)
    assert table.crit_s[0, 0, 1, 2] == pytest.approx(9000 * step + (101 + 1100) * pre + 50.0, rel=1e-9)
    assert table.crit_s[0, 0, 1, 2] > plain.crit_s[0, 0, 1, 2]


def test_a_trajectory_without_tool_calls_never_leaves_the_first_range() -> None:
    # The same two trajectories, the long one without a tool call: nothing promotes it, so the
    # first range serves all of both and the second range nothing.
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns([100, 100], [[1000], [9000]], [[0], [0]], [0.0, 0.0])
    w = workload_from_turns("two", turns, 1, 2, reprefill_fraction=0.0)
    table = build_segment_table(cost, w, (1,), 2, 1, promote=True)
    plain = build_segment_table(cost, w, (1,), 2, 1)
    assert table.work_s[0, 0, 1, 2] == 0.0 and table.crit_s[0, 0, 1, 2] == 0.0
    assert table.work_s[0, 0, 0, 1] == pytest.approx(plain.work_s[0, 0, 0, 2], rel=1e-9)
    assert table.crit_s[0, 0, 0, 1] == pytest.approx(plain.crit_s[0, 0, 0, 2], rel=1e-9)


def test_an_early_last_call_keeps_the_long_answer_in_the_first_range() -> None:
    # The long one calls its tool after 100 tokens and then answers with 8,900: a router that moves
    # requests only at tool returns sees it at 201 tokens, below the first range's top (1,100), so
    # its whole life runs there. Spreading the call evenly over the growth (the estimate when the
    # workload lacks the measured context) would promote it at 4,601 and price the first range
    # as if it left early: the mixed layouts this underpriced lost 29-39% on dapo-math at 96-128
    # prompts (docs/simulator-notebook.md, sixteenth session).
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns([100, 100], [[1000], [100, 8900]], [[0], [1, 0]], [0.0, 5.0])
    w = workload_from_turns("early", turns, 1, 2, reprefill_fraction=0.0)
    assert w.last_call_ctx_tokens is not None and w.last_call_ctx_tokens.tolist() == [100.0, 201.0]
    measured = build_segment_table(cost, w, (1,), 2, 1, promote=True)
    plain = build_segment_table(cost, w, (1,), 2, 1)
    assert measured.work_s[0, 0, 1, 2] == 0.0 and measured.crit_s[0, 0, 1, 2] == 0.0
    assert measured.crit_s[0, 0, 0, 1] == pytest.approx(plain.crit_s[0, 0, 0, 2], rel=1e-9)
    spread = build_segment_table(cost, replace(w, last_call_ctx_tokens=None), (1,), 2, 1, promote=True)
    assert spread.work_s[0, 0, 1, 2] > 0.0
    assert spread.crit_s[0, 0, 0, 1] < 0.5 * measured.crit_s[0, 0, 0, 1]


def test_a_trajectory_that_stays_counts_even_when_its_bin_has_a_slower_one_that_climbs() -> None:
    # Two long trajectories share the second bin: A (9,000 generated, a 60 s call halfway) is the
    # bin's slowest by its whole path but climbs out of the first range at 4,601 tokens; B (a call
    # after 100 tokens, then 7,900) stops climbing at 201 and decodes all of it in the first
    # range. The first range's critical path is B's, at least its 7,900 tokens at one sequence's
    # step at its prompt's context (the bin's slowest alone prices it at about 20 s).
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns(
        [100, 100, 100, 100],
        [[900], [1000], [4500, 4500], [100, 7900]],
        [[0], [0], [1, 0], [1, 0]],
        [0.0, 0.0, 60.0, 0.0],
    )
    w = workload_from_turns("four", turns, 1, 4, reprefill_fraction=0.0)
    table = build_segment_table(cost, w, (1,), 2, 1, promote=True)
    assert table.bin_max_len.tolist() == [1100, 9101]
    assert table.crit_s[0, 0, 0, 1] >= 7900 * float(cost.decode_step_s(1, 1.0, 100.0))
    assert table.crit_s[0, 0, 0, 1] <= table.crit_s[0, 0, 0, 2]  # never above the whole range's path


def test_queue_wait_prices_the_queue_behind_the_kv_cache() -> None:
    """`queue_wait`: a slowest trajectory queued for KV room waits for half the work queued ahead."""
    cost = RolloutCostModel(get_model("qwen3-14b"), A800)
    w = workload_preset("swe-longtail", num_samples=400)
    k = 16
    plain = build_segment_table(cost, w, (1,), k, 32)
    queued = build_segment_table(cost, w, (1,), k, 32, queue_wait=True)
    assert np.array_equal(plain.work_s, queued.work_s)  # only the critical path changes
    c0, c1 = plain.crit_s[0, :, 0, k], queued.crit_s[0, :, 0, k]
    assert np.all(c1 >= c0 - 1e-9)
    trajectories = w.trajectories_per_iteration
    held = float(cost.concurrency(1, np.nan_to_num(w.total_tokens).mean(), np.inf))
    loaded = [n for n in range(1, 33) if trajectories / n > 2 * held]
    assert len(loaded) >= 2  # the workload overloads a few TP1 instances' KV cache
    # Where the queue binds, the path's price falls with every instance added (flat without it).
    assert np.all(np.diff(c1[[n - 1 for n in loaded]]) < 0)
    assert np.all(c1[[n - 1 for n in loaded]] > c0[[n - 1 for n in loaded]])
    # With promotion only the first range (where every trajectory starts) waits, so one range
    # over every length still prices as without promotion.
    promote = build_segment_table(cost, w, (1,), k, 32, promote=True, queue_wait=True)
    assert np.allclose(promote.crit_s[..., 0, k], queued.crit_s[..., 0, k], rtol=1e-9)
    assert np.allclose(
        promote.crit_s[..., 1:, :],
        build_segment_table(cost, w, (1,), k, 32, promote=True).crit_s[..., 1:, :],
        rtol=1e-9,
        equal_nan=True,
    )


@pytest.mark.parametrize("one_degree_dp", [False, True])
def test_a_one_bucket_layout_is_priced_without_promotion(one_degree_dp: bool) -> None:
    """A layout of one TP degree is one router bucket: there is nowhere to promote to, so it runs as
    admission by length does. The heterogeneous search under `promote` prices each such layout as
    the one-degree search without promotion does, and `evaluate_plan` re-prices it the same way."""
    model = get_model("qwen3-14b")
    w = workload_preset("swe-longtail", num_samples=400)
    s = SearchSettings(promote=True, one_degree_dp=one_degree_dp, top_k=48)
    plans = search_plans(model, A800, 48, w, s)
    reference = SearchSettings(homogeneous=True, one_degree_dp=one_degree_dp, top_k=48)
    key = lambda p: (p.rollout_gpus, tuple(sorted(p.instance_tps.items())))  # noqa: E731
    one = {key(p): p for p in search_plans(model, A800, 48, w, reference)}
    single = [p for p in plans if len(p.instance_tps) == 1]
    assert single and len(single) < len(plans)  # both kinds of layout are offered
    for p in single:
        assert p.t_rollout_s == pytest.approx(one[key(p)].t_rollout_s, rel=1e-9)
        assert evaluate_plan(p, model, A800, w, s).t_rollout_s == pytest.approx(p.t_rollout_s, rel=1e-9)


def test_a_range_is_infeasible_where_a_trajectory_it_keeps_outgrows_the_kv_cache(tmp_path) -> None:  # noqa: ANN001
    # Two trajectories call their one tool early and then grow past TP1's KV cache: under promotion
    # they stay in the first band, so TP1 cannot serve it. Only the bins' own longest were checked
    # (until 2026-12-07), and TP1 on [0, 1) was priced finite.
    import numpy as np

    from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table
    from libra_core.planner.specs import get_hardware, get_model
    from libra_core.planner.workload import Workload

    (tmp_path / "small.yaml").write_text("base: A800\nmemory_gb: 24\n")
    model, hw = get_model("qwen3-8b"), get_hardware(str(tmp_path / "small.yaml"))
    cost = RolloutCostModel(model, hw)
    n, rng = 256, np.random.default_rng(1)
    prompt, gen = np.full(n, 300.0), rng.uniform(300, 2000, n)
    calls, pay, lat = np.full(n, 3.0), np.full(n, 100.0), np.full(n, 1.0)
    last = prompt + gen * 0.9 + pay
    gen[:4], last[:4] = 30000, prompt[:4] + 29000 + pay[:4]
    gen[4:6], calls[4:6], last[4:6] = cost.kv_capacity_tokens(1) + 1400, 1, 600  # an early call, then long
    w = Workload(
        "t", 32, 8, prompt, gen, pay, calls, calls * (prompt + gen / 2), lat, last_call_ctx_tokens=last
    )
    assert w.total_tokens[4] > cost.kv_capacity_tokens(1)
    table = build_segment_table(cost, w, (1, 8), 48, 48, promote=True, two_phase=True)
    assert not np.isfinite(table.crit_s[0, 0, 0, 1])  # TP1 on [0, 1)
    assert np.isfinite(table.crit_s[1, 0, 0, 1])  # TP8 holds it
