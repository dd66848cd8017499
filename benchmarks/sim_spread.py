"""How well one iteration predicts the spread between iterations (planner/spread.py).

For each scenario: the spread `estimate_spread` reads from iteration 0's GRPO groups (update:
relative std of an iteration's tokens; rollout: of its slowest trajectory's path), next to the
measured relative std of the total tokens of the first N iterations around their linear drift.

.venv/bin/python benchmarks/sim_spread.py [--iterations N] [--scenarios NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from libra_core.planner.rollout_cost import RolloutCostModel, instance_tp_degrees
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.planner.spread import estimate_spread
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.workloads import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, int_at_least  # noqa: E402

RUN_ITERATIONS = 100  # the run length whose drift is measured, as in the simulator's tables


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the residual's std around a fitted line has len - 2 degrees of freedom: 3 iterations at least
    ap.add_argument(
        "--iterations",
        type=int_at_least(3),
        default=20,
        help=f"iterations the measured spread is taken over (3 to {RUN_ITERATIONS}: a line is fitted "
        "first, over the tables' run)",
    )
    ap.add_argument(
        "--scenarios", nargs="+", action=ExtendList, default=["r2e-gym", "search-r1", "dapo-math"]
    )
    args = ap.parse_args(argv)
    if args.iterations > RUN_ITERATIONS:  # past the run's end its drift is extrapolated
        ap.error(
            f"--iterations {args.iterations}: the drift is that of a {RUN_ITERATIONS}-iteration run; "
            f"give at most {RUN_ITERATIONS}"
        )
    try:
        workloads = {name: load_scenario(name, RUN_ITERATIONS, 0) for name in args.scenarios}
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    cluster = parse_cluster("48xA800")
    print("| scenario | estimated update cv (iteration 0) | measured token cv | estimated rollout cv |")
    print("|---|---:|---:|---:|")
    for name in args.scenarios:
        wl = workloads[name]  # the drift of the tables' run
        model = get_model(wl.model)
        sim = Simulator(
            resolve_policies(["+planning"])[0],
            wl,
            model,
            cluster.hardware,
            cluster.num_gpus,
            1,
        )
        cost = RolloutCostModel(model, cluster.hardware)
        est = estimate_spread(sim.workload_of(0), cost, instance_tp_degrees(model, cluster.hardware))
        totals = np.array([sum(t.total_tokens for t in wl.trajectories(j)) for j in range(args.iterations)])
        x = np.arange(len(totals))
        residual = totals - np.polyval(np.polyfit(x, totals, 1), x)
        measured = residual.std(ddof=2) / totals.mean()
        print(f"| {name} | {est.train_cv:.3f} | {measured:.3f} | {est.rollout_cv:.3f} |")


if __name__ == "__main__":
    main()
