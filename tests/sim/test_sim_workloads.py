"""The workload generator's inlined draws (`_lognormal`, `_below_2`) against `random.Random`'s own."""

from __future__ import annotations

import random

from libra_core.sim.workloads import _below_2, _lognormal


def test_lognormal_makes_the_library_draws() -> None:
    ours, theirs = random.Random(7), random.Random(7)
    for i in range(5000):
        mu, sigma = (i % 13) * 0.7 - 2.0, 0.1 + (i % 5) * 0.3
        assert _lognormal(ours.random, mu, sigma) == theirs.lognormvariate(mu, sigma)
    assert ours.random() == theirs.random()  # the same number of draws


def test_below_2_makes_the_library_draws() -> None:
    ours, theirs = random.Random(11), random.Random(11)
    drawn = [1 + _below_2(ours.getrandbits) for _ in range(2000)]
    assert drawn == [theirs.randint(1, 2) for _ in range(2000)]
    assert set(drawn) == {1, 2}
    assert ours.random() == theirs.random()
