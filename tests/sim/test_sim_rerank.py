"""Re-ranking the planner's candidates by simulating their rollout (`SimSettings.rerank_plans`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from libra_core.sim import pipeline
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import build_deployment
from libra_core.sim.rerank import degree_variants, rerank, simulated_rollout_s
from libra_core.sim.settings import SimSettings
from tests.sim.builders import OLD_PRICES, OLD_SHAPES, build_sim


def _sim(scenario: str, policy: str, settings: SimSettings, iterations: int = 1, **spec: float) -> Simulator:
    drift = None if scenario == "tiny" else 100  # the built-in scenarios drift over 100 iterations
    return build_sim(scenario, policy, iterations, settings=settings, drift_iterations=drift, **spec)


def test_negative_rerank_plans_is_rejected() -> None:
    with pytest.raises(ValueError, match="rerank_plans"):
        SimSettings(rerank_plans=-1)


def test_rerank_finds_the_split_a_flat_price_misses() -> None:
    # r2e-gym with 96 prompts: the old prices (`OLD_PRICES`: one range at the capped batch) price
    # every split from 13 to 24 rollout GPUs alike, and the first plan gives rollout 16 TP1
    # instances (docs/simulator-notebook.md, "Re-ranking by simulation").
    settings = replace(OLD_PRICES, rerank_plans=4)
    sim = _sim("r2e-gym", "+planning", settings, prompts_per_iteration=96)
    plain = build_deployment(sim.p, sim.model, sim.hw, sim.G, sim.workload_of(0), sim.search)
    assert sim.dep is not None and sim.dep.instances != plain.instances
    chosen_s = simulated_rollout_s(sim, sim.dep, sim.trajs[0])
    plain_s = simulated_rollout_s(sim, plain, sim.trajs[0])
    # Simulated again from scratch, the chosen layout's rollout is shorter by more than the margin.
    assert chosen_s < plain_s * (1.0 - sim.s.min_gain_fraction)


def test_rerank_keeps_the_planners_first_within_the_margin() -> None:
    # r2e-gym as built in: the simulated candidates differ by ~1% (noise of one iteration), so the
    # planner's first plan runs.
    sim = _sim("r2e-gym", "+cmlfq", SimSettings(rerank_plans=2))
    plain = build_deployment(sim.p, sim.model, sim.hw, sim.G, sim.workload_of(0), sim.search)
    assert sim.dep is not None
    assert (sim.dep.train_gpus, sim.dep.instances) == (plain.train_gpus, plain.instances)


def test_rerank_runs_replans_and_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counted(*args: Any) -> Any:
        calls.append(1)
        return rerank(*args)

    monkeypatch.setattr(pipeline, "rerank", counted)
    settings = SimSettings(rerank_plans=2, replan_every=2, window_iterations=2)
    runs = [_sim("tiny", "+cmlfq", settings, iterations=6).run() for _ in range(2)]
    assert runs[0].replans, "the run replanned"
    assert calls, "replans priced their candidates by simulation"
    assert [r.train_end_s for r in runs[0].records] == [r.train_end_s for r in runs[1].records]
    assert runs[0].deployments == runs[1].deployments


def test_heterogeneous_rerank_also_simulates_the_one_degree_layouts() -> None:
    # r2e-gym with 96 prompts, at the old prices (`OLD_PRICES`: one range at the capped batch).
    # Offered only +hetero-tp's mixed candidates, re-ranking ranks a one-degree alternative ahead
    # of every one of them.
    flat = replace(OLD_PRICES, rerank_plans=4)
    sim = _sim("r2e-gym", "+hetero-tp", flat, prompts_per_iteration=96)
    w0, sample = sim.workload_of(0), sim.trajs[0]
    mixed = [p for p in sim.rerank_candidates(w0) if len(p.instance_tps) > 1]
    alternatives = sim.rerank_alternatives(w0)
    assert mixed and len(alternatives) == 1 and all(len(p.instance_tps) == 1 for p in alternatives[0])
    assert _sim("r2e-gym", "+hetero-tp", replace(flat, rerank_one_degree=False)).rerank_alternatives(w0) == []
    own = rerank(sim, mixed, sample)[0][1]
    ranked = [dep for _, dep in rerank(sim, mixed, sample, alternatives)]
    assert len({tp for tp, _ in ranked[0].instances}) == 1 and len({tp for tp, _ in own.instances}) > 1
    # Simulated on the same sample, the mixed layout that won alone ranks behind the alternative.
    assert own in ranked[1:]
    # Single-degree policies have nothing to add.
    plain = _sim("tiny", "+planning", SimSettings(rerank_plans=2))
    assert plain.rerank_alternatives(plain.workload_of(0)) == []


def test_degree_variants_keep_the_split_and_change_the_degree() -> None:
    sim = _sim("tiny", "+planning", SimSettings())
    assert sim.dep is not None and sim.dep.plan is not None
    plan = sim.dep.plan
    variants = degree_variants(plan, (1, 2, 4, 8, 16))
    (g,) = plan.rollout.groups
    tps = [v.rollout.groups[0].tp for v in variants]
    assert g.tp not in tps and all(t <= plan.rollout_gpus for t in tps)
    for v in variants:
        (vg,) = v.rollout.groups
        assert v.train_gpus == plan.train_gpus and v.rollout_gpus == plan.rollout_gpus
        assert vg.instances == plan.rollout_gpus // vg.tp and v.rollout.gpus == vg.instances * vg.tp
        assert (vg.start_bin, vg.end_bin) == (g.start_bin, g.end_bin)


def test_rerank_tries_every_degree_at_the_fastest_splits() -> None:
    # dapo-math with 96 prompts: at the old prices (`OLD_PRICES`: one range at the capped batch)
    # the one-degree search keeps TP8 at every split from 32 to 43 rollout GPUs (a flat price),
    # but TP4 at those splits runs faster (docs/simulator-notebook.md).
    spec = {"prompts_per_iteration": 96, **OLD_SHAPES["dapo-math"]}  # and the generator's shape of the time
    flat = replace(OLD_PRICES, rerank_plans=4)
    without = _sim("dapo-math", "+planning", replace(flat, rerank_degrees=False), **spec)
    with_ = _sim("dapo-math", "+planning", flat, **spec)
    assert without.dep is not None and with_.dep is not None
    assert {tp for tp, _ in with_.dep.instances} != {tp for tp, _ in without.dep.instances}
    sample = with_.trajs[0]
    assert simulated_rollout_s(with_, with_.dep, sample) < simulated_rollout_s(with_, without.dep, sample)
