"""Where each policy wins as the load grows: the simulator's table at several batch sizes.

.venv/bin/python benchmarks/sim_load_sweep.py [--loads 32 64 96 128] [--iterations 10]
    [--scenarios r2e-gym search-r1 dapo-math] [--setting FIELD=VALUE ...] [--spec FIELD=VALUE ...]

One row per scenario and prompts per iteration (`ScenarioSpec.prompts_per_iteration`, GRPO groups of
the scenario's size): every policy's tokens per second, the lower bound, and whether the run
reproduces the paper's ordering (Libra > static-optimal > greedy > colocated) and its ablation
(each part adds throughput), strictly (`report.verdicts`). The built-in scenarios run 32 prompts;
public recipes run larger batches (verl's DAPO recipe: 512 prompts x 16 responses per step), and the
built-in scenarios are bound by their slowest trajectory at 32 (docs/simulator.md), so this shows
which claims hold once GPU work, not one trajectory, sets the iteration time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from libra_core.planner.specs import parse_cluster
from libra_core.sim import POLICIES, simulate, workloads
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import CALIBRATION, check_cluster_size, resolve_policies
from libra_core.sim.report import verdicts
from libra_core.sim.settings import SimSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, add_overrides, non_negative_int, or_stop, positive_int  # noqa: E402

SHORT = {
    "colocated": "coloc",
    "static-uniform": "uniform",
    "greedy": "greedy",
    "static-optimal": "st-opt",
    "+planning": "+plan",
    "+hetero-tp": "+hetero",
    "+cmlfq": "+cmlfq",
    "+elastic": "+elastic",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--loads",
        type=positive_int,
        nargs="+",
        action=ExtendList,
        default=[32, 64, 96, 128],
        help="prompts per iteration",
    )
    ap.add_argument("--iterations", type=positive_int, default=10)
    ap.add_argument(
        "--scenarios", nargs="+", action=ExtendList, default=["r2e-gym", "search-r1", "dapo-math"]
    )
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    add_overrides(ap)
    args = ap.parse_args()
    names = [p for p in POLICIES if p not in CALIBRATION]
    unknown = [s for s in args.scenarios if s not in workloads.SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; valid: {sorted(workloads.SCENARIOS)}")
    try:
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        spec = parse_overrides(args.spec, workloads.ScenarioSpec, "--spec")
        # every policy runs: a cluster one of them cannot split fails here, not mid-table
        check_cluster_size(resolve_policies(names), parse_cluster(args.hardware).num_gpus)
    except ValueError as err:
        ap.error(str(err))
    if "prompts_per_iteration" in spec:
        ap.error("set the load with --loads, not --spec prompts_per_iteration")
    try:  # each scenario at each load, as `simulate` loads it: a bad mix fails here, not mid-table
        for sc in args.scenarios:
            for load in args.loads:
                workloads.load_scenario(
                    sc, args.iterations, args.seed, None, {**spec, "prompts_per_iteration": load}
                )
    except ValueError as err:
        ap.error(str(err))
    print("command: .venv/bin/python benchmarks/sim_load_sweep.py " + " ".join(sys.argv[1:]))
    for sc in args.scenarios:
        for i, load in enumerate(args.loads):
            t0 = time.perf_counter()
            report = or_stop(
                simulate,
                sc,
                args.hardware,
                args.iterations,
                names,
                seed=args.seed,
                settings=settings,
                spec_overrides={**spec, "prompts_per_iteration": load},
            )
            if i == 0:  # after the first run: a cluster too small for the model stops before it
                print(f"\n{sc}, {args.hardware}, {args.iterations} iterations, seed {args.seed}; tok/s")
                print(
                    "| prompts | "
                    + " | ".join(SHORT[n] for n in names)
                    + " | bound | ordering | ablation | wall s |"
                )
                print("|---:|" + "---:|" * (len(names) + 1) + "---|---|---:|")
            v = verdicts(report)
            cells = " | ".join(f"{report.result(n).tokens_per_s:,.0f}" for n in names)
            print(
                f"| {load} | {cells} | {report.lower_bound_tokens_per_s:,.0f} | {v.ordering} | {v.ablation} "
                f"| {time.perf_counter() - t0:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
