"""The workload generator's inlined draws (`_lognormal`, `_below_2`) against `random.Random`'s own,
and the per-prompt tool-latency factor."""

from __future__ import annotations

import random
from dataclasses import replace

from libra_core.sim.generator import ScenarioWorkload, _below_2, _lognormal
from libra_core.sim.scenarios import SCENARIOS


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


def test_prompt_latency_factor_scales_only_each_prompts_tool_latencies() -> None:
    spec = replace(SCENARIOS["r2e-gym"], prompt_latency_sigma=0.0)
    base = ScenarioWorkload(spec, 10, seed=0).trajectories(3)
    slow = ScenarioWorkload(replace(spec, prompt_latency_sigma=0.8), 10, seed=0).trajectories(3)
    assert [t.turns for t in slow] == [t.turns for t in base]  # same tokens, tools and statuses
    factors: dict[str, set[float]] = {}
    for a, b in zip(base, slow, strict=True):
        for turn, la, lb in zip(a.turns, a.tool_latency_s, b.tool_latency_s, strict=True):
            if turn.status in ("success", "failure"):
                factors.setdefault(a.prompt_id, set()).add(round(lb / la, 9))
            else:  # timeouts cost timeout_s, the final answer nothing
                assert lb == la
    assert all(len(f) == 1 for f in factors.values())  # one factor per prompt
    spread = sorted(next(iter(f)) for f in factors.values())
    assert spread[0] < 0.8 and spread[-1] > 1.25  # and the prompts differ
