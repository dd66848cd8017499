"""The planner's price of its best mixed-TP plans and its best one-degree plan, against simulation.

    .venv/bin/python benchmarks/sim_mixed_price.py [--scenario r2e-gym] [--policy +hetero-tp]
        [--top 3] [--iterations 10] [--setting FIELD=VALUE ...] [--spec FIELD=VALUE ...]

`libra simulate` explains a heterogeneous step that ties by the planner's price: on R2E-Gym it
prices the best mixed-TP layout 7.3% slower than one degree at iteration 0. This checks that price.
For iteration 0 of the scenario (seed 0, 48xA800) it runs the search `--policy` runs (its
`SearchSettings`, as the simulator builds them), takes the `--top` best mixed-TP plans and the best
one-degree plan, deploys each as the policy would (`deployment_from_plan`) and simulates one
`--iterations` of it without replanning: mixed plans under the policy's scheduler, the one-degree
plan under least-load over one bucket. Per plan it prints the priced rollout seconds, iteration 0's
simulated rollout seconds (the rollout's start to its last trajectory's end) and their ratio, then
the tok/s over all the iterations (the workload drifts). A mixed plan whose ratio is above the
one-degree plan's is priced against, relative to one degree; the tok/s say whether that costs a
faster run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libra_core.planner.search import Plan, plan_rank, search_plans
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import POLICIES, PolicySpec, deployment_from_plan
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import SCENARIOS, ScenarioSpec, load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import add_overrides, or_stop, positive_int  # noqa: E402

ONE_DEGREE = PolicySpec("one-degree", hetero=True)  # least-load over the plan's one bucket, no replanning


def _degrees(plan: Plan) -> str:
    counts: dict[int, int] = {}
    for g in plan.rollout.groups:
        counts[g.tp] = counts.get(g.tp, 0) + g.instances
    return " ".join(f"{n}xTP{tp}" for tp, n in sorted(counts.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument("--hardware", default="48xA800")
    hetero = [name for name, p in POLICIES.items() if p.hetero]
    ap.add_argument("--policy", default="+hetero-tp", choices=hetero)
    ap.add_argument(
        "--top", type=positive_int, default=3, help="mixed-TP plans to simulate (best priced first)"
    )
    ap.add_argument("--iterations", type=positive_int, default=10, help="iterations each plan runs (static)")
    add_overrides(ap)
    args = ap.parse_args(argv)
    try:
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        spec = parse_overrides(args.spec, ScenarioSpec, "--spec")
        cluster = parse_cluster(args.hardware)
        wl = load_scenario(args.scenario, args.iterations, 0, spec_overrides=spec)
    except ValueError as err:
        ap.error(str(err))
    model, hw, n = get_model(wl.model), settings.hardware(cluster.hardware), cluster.num_gpus
    policy = POLICIES[args.policy]
    # a ValueError when the model does not train on the cluster
    probe = or_stop(Simulator, policy, wl, model, hw, n, args.iterations, settings)
    search = probe.search
    plans = sorted(search_plans(model, hw, n, probe.workload_of(0), search), key=plan_rank)
    one = [p for p in plans if len({g.tp for g in p.rollout.groups}) == 1][:1]
    mixed = [p for p in plans if len({g.tp for g in p.rollout.groups}) > 1][: args.top]
    if not one or not mixed:
        raise SystemExit(f"the search priced no {'one-degree' if not one else 'mixed-TP'} plan to compare")
    static = PolicySpec(f"{policy.name}-static", hetero=True, scheduler=policy.scheduler)
    print(f"{args.scenario}, {args.hardware}, iteration 0, seed 0, the search of {args.policy}")
    print(
        "| plan | layout | priced T_iter s | priced rollout s | simulated rollout s (iteration 0) |"
        f" priced / simulated | tok/s over {args.iterations} iterations |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    details = []
    for kind, plan in [("one degree", one[0]), *((f"mixed {i + 1}", p) for i, p in enumerate(mixed))]:
        run_as = ONE_DEGREE if kind == "one degree" else static
        dep = deployment_from_plan(run_as, plan, model, hw, search)
        sim = Simulator(run_as, wl, model, hw, n, args.iterations, settings, deployment=dep)
        stats = sim.run()
        rec = stats.records[0]
        simulated = rec.rollout_end_s - rec.rollout_start_s
        layout = f"train {plan.train_gpus}, rollout {plan.rollout_gpus} ({_degrees(plan)})"
        print(
            f"| {kind} | {layout} | {plan.t_iter_s:,.0f} | {plan.t_rollout_s:,.0f} | {simulated:,.0f} |"
            f" {plan.t_rollout_s / simulated:.2f} | {stats.tokens_per_s:,.0f} |"
        )
        details.append((kind, dep, plan, {b: t - rec.rollout_start_s for b, t in rec.bucket_end_s.items()}))
    print()
    print("Per bucket: the DP groups it holds (TP x instances, priced group seconds) and when its last")
    print("trajectory finished in the simulation (seconds after the rollout started).")
    for kind, dep, plan, ends in details:
        cells = []
        for b, bound in enumerate([*dep.bucket_bounds, None][: dep.num_buckets]):
            held = [g for g in plan.rollout.groups if any(t == g.tp and k == b for t, k in dep.instances)]
            priced = ", ".join(f"TP{g.tp} x{g.instances} {g.time_s:,.0f} s" for g in held)
            upto = f"up to {bound:,} tokens" if bound is not None and b < dep.num_buckets - 1 else "the rest"
            cells.append(f"bucket {b} ({upto}): {priced}; simulated {ends.get(b, 0.0):,.0f} s")
        print(f"- {kind}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
