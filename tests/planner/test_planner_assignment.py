"""The request-assignment DP equals brute force on small random instances."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra_core.planner.assignment import SegmentTable, brute_force, frontier, min_gpus, solve


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


@pytest.mark.parametrize("seed", range(25))
def test_dp_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    tps = (1, 2, 4)[: int(rng.integers(1, 4))]
    budget = int(rng.integers(1, 9))
    table = random_table(rng, k, tps, counts=int(rng.integers(1, 4)))
    expected = brute_force(table, budget)
    got = solve(table, budget, rel_tol=1e-9)
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


def test_frontier_matches_min_gpus() -> None:
    rng = np.random.default_rng(7)
    table = random_table(rng, 6, (1, 2, 4, 8), counts=3)
    targets = rng.permutation(np.geomspace(0.5, 100, 40))  # frontier accepts any order
    vec = frontier(table, targets)
    for t, v in zip(targets, vec, strict=True):
        assert min_gpus(table, float(t))[0] == v
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
