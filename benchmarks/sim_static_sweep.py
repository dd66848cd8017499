"""Every static one-degree layout simulated: the best split and TP degree found by brute force.

    .venv/bin/python benchmarks/sim_static_sweep.py [--scenario r2e-gym] [--iterations 10]
        [--setting FIELD=VALUE ...] [--spec FIELD=VALUE ...] [--top 6]

`static-optimal` runs the layout the planner prices best for iteration 0 (one TP degree, no
replanning). This runs the same policy on every layout it could have chosen instead: rollout GPUs
20, 22, ..., 40 of 48xA800 (training gets the rest, with the training layout the planner's cost
model prices best on them), times every TP degree that divides them, and prints the fastest. When
the sweep's best beats `static-optimal` by much, the planner's price ranks layouts wrongly under
these settings, and a policy that beats `static-optimal` has not necessarily beaten the best static
layout. `--spec` changes the scenario's generator (e.g. `prompts_per_iteration=96`, a heavier
load). The last rows put `colocated` (every GPU time-shared) beside them. Seed 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libra_core.planner.rollout_cost import instance_tp_degrees
from libra_core.planner.search import best_train
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.planner.train_cost import TrainShape
from libra_core.sim.engine import Simulator
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import OPEN_BOUND, Deployment, PolicySpec, resolve_policies
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import SCENARIOS, ScenarioSpec, load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import add_overrides, positive_int  # noqa: E402


def cell(text: str) -> str:
    """`text` as one Markdown table cell: a deployment's label separates its halves with ` | `."""
    return text.replace(" | ", "; ")


def tokens_per_s(sim: Simulator) -> float:
    return sim.run().tokens_per_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument("--iterations", type=positive_int, default=10)
    add_overrides(ap)
    ap.add_argument("--top", type=positive_int, default=6, help="fastest layouts printed")
    args = ap.parse_args(argv)
    try:
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        spec = parse_overrides(args.spec, ScenarioSpec, "--spec")
        wl = load_scenario(args.scenario, args.iterations, 0, spec_overrides=spec)
    except ValueError as err:
        ap.error(str(err))
    cluster = parse_cluster("48xA800")
    model = get_model(wl.model)
    policy, colocated = resolve_policies(["static-optimal", "colocated"])

    def sim(deployment: Deployment | None = None, run_policy: PolicySpec = policy) -> Simulator:
        gpus = cluster.num_gpus
        return Simulator(
            run_policy,
            wl,
            model,
            cluster.hardware,
            gpus,
            args.iterations,
            settings,
            deployment=deployment,
        )

    planner = sim()
    planned = tokens_per_s(planner)
    assert planner.dep is not None
    shape = TrainShape.from_workload(planner.workload_of(0))
    rows = []
    for rollout_gpus in range(20, 42, 2):
        train = best_train(model, planner.hw, cluster.num_gpus - rollout_gpus, shape)
        if train is None:
            continue
        for tp in instance_tp_degrees(model, planner.hw):  # the degrees the model shards over
            if rollout_gpus % tp:
                continue
            instances = tuple((tp, 0) for _ in range(rollout_gpus // tp))
            dep = Deployment(
                cluster.num_gpus - rollout_gpus, train.layout, instances, (OPEN_BOUND,), rollout_gpus
            )
            rows.append((tokens_per_s(sim(dep)), cell(dep.label())))
    rows.sort(reverse=True)
    if not rows:
        raise SystemExit("error: no layout to simulate: no rollout GPU count leaves GPUs the model trains on")
    what = " ".join(args.setting + args.spec) or "default"
    print(f"{args.scenario}, 48xA800, {args.iterations} iterations, seed 0, settings: {what}")
    print("| layout | tok/s |")
    print("|---|---:|")
    for rate, label in rows[: args.top]:
        print(f"| {label} | {rate:,.0f} |")
    print(f"| static-optimal (the planner's): {cell(planner.dep.label())} | {planned:,.0f} |")
    shared = tokens_per_s(sim(run_policy=colocated))
    print(f"| colocated (all {cluster.num_gpus} GPUs time-shared) | {shared:,.0f} |")
    print(
        f"{len(rows)} layouts simulated; the best is {rows[0][0] / planned - 1:+.1%} against static-optimal"
        f" and {rows[0][0] / shared - 1:+.1%} against colocated"
    )


if __name__ == "__main__":
    main()
