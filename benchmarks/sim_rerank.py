"""The planner's price of each split against the simulated rollout of the layout it deploys.

    .venv/bin/python benchmarks/sim_rerank.py [--scenario r2e-gym] [--prompts-per-iteration 96]
        [--policy +planning] [--plans 12] [--per-split]

For iteration 0 of a scenario on 48xA800: the planner's `--plans` best plans for the policy (every
split searched, best priced first), each with its priced rollout and iteration time, and the rollout
and iteration time when its deployment is simulated on iteration 0's trajectories (sim/rerank.py,
as `SimSettings.rerank_plans` does). Then the plan `rerank_plans=4` chooses. A planner that prices
well ranks the splits as the simulation does. `--per-split`: instead of the best `--plans`, the
best-priced plan at each rollout-GPU count (the plans the re-ranking's grid draws from).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from libra_core.planner.search import Plan
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import deployment_from_plan, resolve_policies
from libra_core.sim.rerank import rerank, resimulated, sample_spread
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import SCENARIOS, load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument("--prompts-per-iteration", type=positive_int, default=None)
    ap.add_argument("--policy", default="+planning")
    ap.add_argument("--plans", type=positive_int, default=12, help="best-priced plans shown")
    ap.add_argument("--per-split", action="store_true", help="the best-priced plan per rollout-GPU count")
    args = ap.parse_args(argv)
    cluster = parse_cluster("48xA800")
    spec = (
        None if args.prompts_per_iteration is None else {"prompts_per_iteration": args.prompts_per_iteration}
    )
    try:
        wl = load_scenario(args.scenario, 100, 0, spec_overrides=spec)
        resolved = resolve_policies([args.policy])
    except ValueError as err:
        ap.error(str(err))
    if len(resolved) != 1:  # `all` stands for every policy; the table is one policy's
        ap.error(f"--policy {args.policy} names {len(resolved)} policies; give one")
    policy = resolved[0]
    model = get_model(wl.model)
    settings = SimSettings(rerank_plans=4)
    sim = Simulator(policy, wl, model, cluster.hardware, cluster.num_gpus, 1, settings)
    sample = sim.trajs[0]
    plans = sim.rerank_candidates(sim.workload_of(0))
    spread = sample_spread(sim, sample)
    print(f"{args.scenario}, {len(sample)} trajectories, policy {policy.name}, iteration 0")
    print("| deployment | priced rollout s | priced iteration s | simulated rollout s | iteration s |")
    print("|---|---:|---:|---:|---:|")
    shown = plans[: args.plans]
    if args.per_split:
        best_at: dict[int, Plan] = {}
        for plan in plans:
            best_at.setdefault(plan.rollout_gpus, plan)
        shown = [best_at[n] for n in sorted(best_at)]
    for plan in shown:
        dep = deployment_from_plan(policy, plan, model, cluster.hardware, sim.search)
        sim_plan = resimulated(sim, plan, dep, sample, spread)
        print(
            f"| {dep.label().replace(' | ', '; ')} | {plan.t_rollout_s:,.0f} | {plan.t_iter_s:,.0f} | "
            f"{sim_plan.t_rollout_s:,.0f} | {sim_plan.t_iter_s:,.0f} |"
        )
    t0 = time.perf_counter()
    ranked = rerank(sim, plans, sample)
    best, dep = ranked[0]
    print(
        f"rerank_plans=4 chooses {dep.label()}: simulated rollout {best.t_rollout_s:,.0f} s, iteration "
        f"{best.t_iter_s:,.0f} s ({len(ranked)} simulated, {time.perf_counter() - t0:.1f} s)"
    )


if __name__ == "__main__":
    main()
