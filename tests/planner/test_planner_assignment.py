"""The request-assignment DP equals brute force on small random instances."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from libra_core.planner.assignment import (
    SegmentTable,
    brute_force,
    frontier,
    homogeneous,
    homogeneous_dp,
    min_gpus,
    one_degree,
    solve,
)


def random_table(rng: np.random.Generator, k: int, tps: tuple[int, ...], counts: int = 1) -> SegmentTable:
    """Random prices; with `counts` > 1 they depend on the instance count n = 1..counts like a
    real table's: the critical path shrinks (smaller batches per instance) and the work grows."""
    work = np.full((len(tps), counts, k + 1, k + 1), np.inf)
    crit = np.full((len(tps), counts, k + 1, k + 1), np.inf)
    per_bin = rng.uniform(1, 10, size=k)
    tail = np.sort(rng.uniform(1, 20, size=k))
    shrink = rng.uniform(0.0, 0.5)
    for ti, tp in enumerate(tps):
        speed = tp ** rng.uniform(0.5, 0.95)  # more TP: faster per request, less per GPU
        for i in range(k):
            for j in range(i + 1, k + 1):
                w = per_bin[i:j].sum() * rng.uniform(0.9, 1.1) / speed
                for m in range(counts):
                    work[ti, m, i, j] = w * (1 + shrink * m / 4)
                    crit[ti, m, i, j] = tail[j - 1] / speed * (1 - shrink * m / (m + 1))
        if rng.random() < 0.2:
            crit[ti, :, :, k] = np.inf  # this TP cannot hold the longest bin
    return SegmentTable(tps, work, crit, np.arange(k + 1), tail)


MODES = [(True, False), (False, False), (True, True)]  # (monotone, strict)


@pytest.mark.parametrize("monotone,strict", MODES)
@pytest.mark.parametrize("seed", range(25))
def test_dp_equals_brute_force(seed: int, monotone: bool, strict: bool) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    tps = (1, 2, 4)[: int(rng.integers(1, 4))]
    budget = int(rng.integers(1, 9))
    table = random_table(rng, k, tps, counts=int(rng.integers(1, 4)))
    expected = brute_force(table, budget, monotone, strict)
    got = solve(table, budget, rel_tol=1e-9, monotone=monotone, strict=strict)
    if math.isinf(expected):
        assert got is None
        return
    assert got is not None
    assert got.gpus <= budget
    assert got.makespan_s == pytest.approx(expected, rel=1e-6)
    # The groups tile the bins in order and their times are what the table says.
    assert [g.start_bin for g in got.groups] == [0, *[g.end_bin for g in got.groups[:-1]]]
    assert got.groups[-1].end_bin == k
    assert sum(g.tp * g.instances for g in got.groups) == got.gpus
    if monotone:
        assert [g.tp for g in got.groups] == sorted(g.tp for g in got.groups)
    if strict:  # each degree serves one range
        assert len({g.tp for g in got.groups}) == len(got.groups)


@pytest.mark.parametrize("monotone,strict", MODES)
def test_frontier_matches_min_gpus(monotone: bool, strict: bool) -> None:
    rng = np.random.default_rng(7)
    table = random_table(rng, 6, (1, 2, 4, 8), counts=3)
    targets = rng.permutation(np.geomspace(0.5, 100, 40))  # frontier accepts any order
    vec = frontier(table, targets, monotone, strict)
    for t, v in zip(targets, vec, strict=True):
        assert min_gpus(table, float(t), monotone, strict)[0] == v
    by_time = vec[np.argsort(targets)]
    assert np.all(np.diff(by_time[np.isfinite(by_time)]) <= 0)  # more time allowed, never more GPUs


def test_more_gpus_never_slower() -> None:
    table = random_table(np.random.default_rng(3), 5, (1, 2, 4), counts=3)
    spans = [a.makespan_s for b in range(4, 20) if (a := solve(table, b, 1e-9)) is not None]
    assert all(x >= y - 1e-9 for x, y in zip(spans, spans[1:], strict=False))


def test_three_dimensional_table_prices_every_count_alike() -> None:
    rng = np.random.default_rng(11)
    flat = random_table(rng, 4, (1, 2))
    assert flat.max_instances == 1
    for n in (1, 2, 5):
        t = flat.group_time_s(0, n, 0, 4)
        assert t == max(flat.crit_s[0, 0, 0, 4], flat.work_s[0, 0, 0, 4] / n)


def test_table_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="work_s"):
        SegmentTable((1, 2), np.zeros((1, 3, 3)), np.zeros((1, 3, 3)), np.arange(3), np.ones(2))


def test_monotone_forbids_a_smaller_tp_for_longer_work() -> None:
    # Two bins: the short one only meets T = 10 on TP2, the long one is cheapest on TP1.
    inf = np.inf
    work = np.array(
        [
            [[inf, 5.0, 30.0], [inf, inf, 5.0], [inf, inf, inf]],
            [[inf, 8.0, 40.0], [inf, inf, 16.0], [inf, inf, inf]],
        ]
    )
    crit = np.array(
        [
            [[inf, 20.0, 20.0], [inf, inf, 5.0], [inf, inf, inf]],
            [[inf, 8.0, 8.0], [inf, inf, 5.0], [inf, inf, inf]],
        ]
    )
    table = SegmentTable((1, 2), work, crit, np.arange(3), np.ones(2))
    free_gpus, free_groups = min_gpus(table, 10.0, monotone=False)
    mono_gpus, mono_groups = min_gpus(table, 10.0, monotone=True)
    assert [(g.tp, g.instances) for g in free_groups] == [(2, 1), (1, 1)] and free_gpus == 3
    assert [(g.tp, g.instances) for g in mono_groups] == [(2, 1), (2, 2)] and mono_gpus == 6
    assert mono_gpus == brute_force_gpus(table, 10.0)


def brute_force_gpus(table: SegmentTable, target: float) -> float:
    """Fewest GPUs with TP non-decreasing, by enumeration (2 bins, counts up to 4)."""
    best = np.inf
    options = [((0, 2),), ((0, 1), (1, 2))]
    for ranges in options:
        for choice in itertools.product(range(len(table.tps)), repeat=len(ranges)):
            if list(choice) != sorted(choice):
                continue
            gpus = 0.0
            for (i, j), ti in zip(ranges, choice, strict=True):
                n = next((n for n in range(1, 5) if table.group_time_s(ti, n, i, j) <= target), None)
                gpus = np.inf if n is None else gpus + table.tps[ti] * n
            best = min(best, gpus)
    return best


def test_tps_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        SegmentTable((2, 1), np.zeros((2, 3, 3)), np.zeros((2, 3, 3)), np.arange(3), np.ones(2))


@pytest.mark.parametrize("seed", range(10))
def test_homogeneous_is_the_best_single_degree_on_every_gpu(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, tps, budget = int(rng.integers(1, 6)), (1, 2, 4), int(rng.integers(1, 11))
    table = random_table(rng, k, tps, counts=int(rng.integers(1, 4)))
    got = homogeneous(table, budget)
    prices = {tp: table.group_time_s(ti, budget // tp, 0, k) for ti, tp in enumerate(tps) if budget >= tp}
    finite = {tp: t for tp, t in prices.items() if math.isfinite(t)}
    if not finite:
        assert got is None
        return
    assert got is not None and len(got.groups) == 1
    (g,) = got.groups
    assert (g.start_bin, g.end_bin, g.instances) == (0, k, budget // g.tp)
    assert got.gpus == g.tp * g.instances <= budget
    assert got.makespan_s == min(finite.values()) == finite[g.tp]
    # The DP searches a superset (any ranges, any counts), so it is never slower.
    dp = solve(table, budget, rel_tol=1e-9, monotone=True)
    assert dp is not None and dp.makespan_s <= got.makespan_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_homogeneous_dp_prices_each_degree_by_its_own_dp_and_deploys_one_bucket(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, tps, budget = int(rng.integers(2, 6)), (1, 2, 4), int(rng.integers(1, 11))
    table = random_table(rng, k, tps, counts=int(rng.integers(1, 4)))
    got = homogeneous_dp(table, budget, rel_tol=1e-9)
    # Each degree alone, by brute force over its ranges and counts: the price homogeneous_dp uses.
    per_degree = {}
    for ti, tp in enumerate(tps):
        if budget >= tp:
            sub = one_degree(table, ti)
            assert sub.tps == (tp,)
            per_degree[tp] = _brute_makespan(sub, (budget // tp) * tp)
    finite = {tp: t for tp, t in per_degree.items() if math.isfinite(t)}
    if not finite:
        assert got is None
        return
    assert got is not None and len(got.groups) == 1
    (g,) = got.groups
    assert (g.start_bin, g.end_bin, g.instances) == (0, k, budget // g.tp)  # every instance, one bucket
    assert got.makespan_s == pytest.approx(min(finite.values()), rel=1e-6)
    # One range on all of the degree's instances is one of the DP's choices: never cheaper.
    one_range = homogeneous(table, budget)
    assert one_range is not None and got.makespan_s <= one_range.makespan_s * (1 + 1e-9)


def _brute_makespan(table: SegmentTable, gpus: int) -> float:
    """Smallest makespan of any split of the bins into ranges with instance counts within `gpus`."""
    k, (tp,) = table.num_bins, table.tps
    best = math.inf
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, k), r) for r in range(k)):
        edges = (0, *cuts, k)
        ranges = list(itertools.pairwise(edges))
        for counts in itertools.product(range(1, gpus // tp + 1), repeat=len(ranges)):
            if tp * sum(counts) > gpus:
                continue
            t = max(table.group_time_s(0, n, i, j) for (i, j), n in zip(ranges, counts, strict=True))
            best = min(best, t)
    return best


def test_homogeneous_dp_prices_the_tail_at_its_own_batch() -> None:
    """Two bins on TP1, up to two instances. As one range on both instances the tail is priced at
    the whole range's batch (critical path 10); split, the short bin takes one instance (4 s) and
    the tail the other, at its own smaller batch (6 s). One bucket of two instances either way."""
    inf = np.inf
    work = np.full((1, 2, 3, 3), inf)
    crit = np.full((1, 2, 3, 3), inf)
    work[0, :, 0, 1], crit[0, :, 0, 1] = 4.0, 2.0  # the short bin, on 1 or 2 instances
    work[0, :, 1, 2], crit[0, :, 1, 2] = 3.0, 6.0  # the long bin
    work[0, :, 0, 2], crit[0, :, 0, 2] = 10.0, 10.0  # both bins as one range
    table = SegmentTable((1,), work, crit, np.arange(3), np.array([1.0, 2.0]))
    one_range = homogeneous(table, 2)
    got = homogeneous_dp(table, 2, rel_tol=1e-9)
    assert one_range is not None and one_range.makespan_s == 10.0
    assert got is not None and got.makespan_s == pytest.approx(6.0, rel=1e-6)
    (g,) = got.groups
    assert (g.tp, g.instances, g.start_bin, g.end_bin) == (1, 2, 0, 2)


def test_counts_over_counts_the_instance_counts_that_miss_each_target() -> None:
    from libra_core.planner.assignment import _counts_over

    rng = np.random.default_rng(11)
    table = random_table(rng, 5, (1, 2, 4), counts=6)
    targets = np.sort(rng.uniform(0.5, 60, 30))
    for ti in range(len(table.tps)):
        best = np.minimum.accumulate(np.nan_to_num(table.group_times_s(ti), nan=np.inf), axis=0)
        naive = (best[:, :, :, None] > targets[None, None, None, :]).sum(axis=0)  # n with best[n] > t
        got = _counts_over(table, ti, targets)
        assert got.shape == naive.shape and np.array_equal(got, naive)
        assert got.max() == table.max_instances  # some range misses the smallest target at every n


def test_instance_counts_past_int16_are_counted_exactly() -> None:
    # 40,000 instance counts (a 40,000-GPU cluster of TP1, as many trajectories) raised an
    # AssertionError: the counts were int16
    from libra_core.planner.assignment import _counts_over

    n = 40_000
    work = np.full((1, n, 2, 2), np.nan)
    work[0, :, 0, 1] = 100.0  # one range of 100 s of work
    crit = np.where(np.isnan(work), np.nan, 0.001)
    table = SegmentTable((1,), work, crit, np.array([0, 1]), np.array([10.0]))
    targets = np.array([0.004, 1.0, 10.0])  # met by 25,000 / 100 / 10 instances
    missed = _counts_over(table, 0, targets)[0, 1]
    assert missed.tolist() == [24_999, 99, 9]
