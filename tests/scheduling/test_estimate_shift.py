"""A shifted ancestor speaks only through its samples that outlast the shift: the request asking is
still running, so an ancestor's trajectories that had ended by now cannot be it."""

from __future__ import annotations

import pytest

from libra_core.scheduling.estimate import Estimate, NodeStats


def _stats(remaining: list[int], generated: list[int]) -> NodeStats:
    return NodeStats.build(remaining, generated, [0] * len(remaining), 0, 4.0)


def test_an_ancestor_met_500_tokens_ago_says_what_its_long_samples_have_left() -> None:
    # Samples of 100 and 1,000 remaining (80 and 800 generated), met 500 tokens ago: only the
    # 1,000 can be this request; 500 remain, 400 of them generated. Until 2026-12-07 the part said
    # max(0, 550 - 500) = 50 remained and put half its mass at 0 (CDF 0.5 at 0 tokens).
    est = Estimate.mix([(1.0, _stats([100, 1000], [80, 800]), 500)], 1.0, 1.0)
    assert est.mean_remaining == pytest.approx(500.0)
    assert est.mean_remaining_gen == pytest.approx(400.0)
    assert est.cdf(0) == 0.0 and est.cdf(499) == 0.0 and est.cdf(500) == pytest.approx(1.0)
    assert est.gen_below(499) == 0.0 and est.gen_below(500) == pytest.approx(400.0)
    assert est.tail_bucket([400, 600], 0, 0.9) == 1
    assert est.mean_bucket([400, 600], 0) == 1


def test_an_exact_node_and_an_outlived_ancestor_are_as_before() -> None:
    stats = _stats([100, 1000], [80, 800])
    exact = Estimate.mix([(1.0, stats, 0)], 1.0, 1.0)  # no shift: the node's own distribution
    assert exact.mean_remaining == pytest.approx(550.0)
    assert exact.cdf(100) == pytest.approx(0.5)
    outlived = Estimate.mix([(1.0, stats, 2000)], 1.0, 1.0)  # every sample ended before now
    assert outlived.mean_remaining == 0.0 and outlived.mean_remaining_gen == 0.0
    assert outlived.cdf(0) == pytest.approx(1.0)


def test_a_mixture_weighs_the_conditioned_part_by_its_share() -> None:
    # An exact node (support 1, pseudocount 1: half the mass) and the ancestor above (the rest).
    near = _stats([300], [300])
    est = Estimate.mix([(1.0, near, 0), (5.0, _stats([100, 1000], [80, 800]), 500)], 1.0, 1.0)
    assert est.mean_remaining == pytest.approx(0.5 * 300 + 0.5 * 500)
    assert est.cdf(300) == pytest.approx(0.5)
    assert est.cdf(500) == pytest.approx(1.0)


def test_an_ancestor_counts_only_its_samples_that_outlast_the_shift() -> None:
    # An ancestor with support 100 whose samples all ended within the 2,000 tokens since: none can
    # be this request, so it takes no share and the mass passes on (before 2026-12-07 it took
    # 0.5 x 100/101 and said 0 remained: mean ~154 instead of 550).
    near = _stats([300], [300])
    outlived = _stats([100, 1000], [80, 800])
    last = _stats([800], [800])
    est = Estimate.mix([(1.0, near, 0), (100.0, outlived, 2000), (1.0, last, 0)], 1.0, 1.0)
    assert est.mean_remaining == pytest.approx(0.5 * 300 + 0.5 * 800)
    assert [round(p[0], 9) for p in est.parts] == [0.5, 0.5]
    # Half of an ancestor's samples outlasting: its support counts half (50 of 100).
    half = Estimate.mix([(1.0, near, 0), (100.0, outlived, 500), (1.0, last, 0)], 1.0, 1.0)
    assert half.parts[1][0] == pytest.approx(0.5 * 50 / 51)
