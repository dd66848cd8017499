"""How much routing the long tail to its own instances can gain on a scenario's static-optimal layout.

    .venv/bin/python benchmarks/sim_long_bucket.py [--scenario dapo-math] [--iterations 6]
        [--prompts-per-iteration N]

C-MLFQ's premise is that a trajectory found to be long should decode on instances that the short
ones do not crowd. This measures the ceiling of that idea in the simulator, on 48xA800, seed 0: the
`static-optimal` deployment (one TP degree, one bucket) is run as is, then with its instances split
into a short bucket and a long bucket of `L` instances (same degree, same GPUs) whose bound is the
`q`-th percentile of iteration 0's trajectory lengths, once with perfect admission (`oracle`: each
trajectory starts in the bucket of its final length) and once with C-MLFQ (admission by the tree,
moves at tool returns). Each row: throughput, mean rollout time and moves; the last line prints the
path bound (no policy can beat it: the slowest trajectories alone on an empty cluster).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import Deployment, PolicySpec, resolve_policies
from libra_core.sim.simulate import scenario_lower_bound
from libra_core.sim.workloads import SCENARIOS, load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="dapo-math", choices=sorted(SCENARIOS))
    ap.add_argument("--iterations", type=positive_int, default=6)
    ap.add_argument("--prompts-per-iteration", type=positive_int, default=None)
    args = ap.parse_args(argv)
    cluster = parse_cluster("48xA800")
    spec = (
        None if args.prompts_per_iteration is None else {"prompts_per_iteration": args.prompts_per_iteration}
    )
    try:
        wl = load_scenario(args.scenario, args.iterations, 0, spec_overrides=spec)
    except ValueError as err:
        ap.error(str(err))
    model = get_model(wl.model)

    def run(policy: PolicySpec, dep: Deployment | None) -> Simulator:
        sim = Simulator(
            policy, wl, model, cluster.hardware, cluster.num_gpus, args.iterations,
            deployment=dep,
        )  # fmt: skip
        st = sim.run()
        rollout_s = np.mean([r.rollout_end_s - r.rollout_start_s for r in st.records])
        moves = sum(r.moves for r in st.records)
        bounds = "open" if dep is None else dep.bucket_bounds[0]
        print(f"| {policy.name} | {bounds} | {st.tokens_per_s:,.0f} | {rollout_s:,.1f} | {moves} |")
        return sim

    print(f"{args.scenario}, 48xA800, {args.iterations} iterations, seed 0")
    print("| routing, long bound percentile, long instances | long bound | tok/s | mean rollout s | moves |")
    print("|---|---:|---:|---:|---:|")
    base = run(resolve_policies(["static-optimal"])[0], None).dep
    assert base is not None
    tp, k = base.instances[0][0], len(base.instances)
    lengths = np.array([t.total_tokens for t in wl.trajectories(0)])
    for q in (80, 90, 95):
        bound = int(np.percentile(lengths, q))
        for n_long in (1, 2):
            if n_long >= k:
                continue
            inst = ((tp, 0),) * (k - n_long) + ((tp, 1),) * n_long
            dep = replace(base, instances=inst, bucket_bounds=(bound,), plan=None)
            for scheduler in ("oracle", "cmlfq"):
                run(PolicySpec(f"{scheduler}, p{q}, {n_long} long", hetero=True, scheduler=scheduler), dep)
    hw, gpus = cluster.hardware, cluster.num_gpus
    bound_s, tokens, _, _ = scenario_lower_bound(wl, args.iterations, model, hw, gpus)
    print(f"static-optimal layout: {base.label()}; lower bound {tokens / bound_s:,.0f} tok/s")


if __name__ == "__main__":
    main()
