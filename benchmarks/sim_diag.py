"""Per-policy diagnostics of one simulated scenario on 48xA800: tok/s, mean rollout and iteration
time, moves, tail share, the first deployment and the plan's predicted times.

.venv/bin/python benchmarks/sim_diag.py SCENARIO ITERATIONS POLICY[,POLICY...]
e.g.  .venv/bin/python benchmarks/sim_diag.py r2e-gym 6 greedy,+planning,oracle-routing
"""

from __future__ import annotations

import random
import sys
import time

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.workloads import load_scenario, long_tail_share


def main() -> None:
    scenario, iters, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    cluster = parse_cluster("48xA800")
    wl = load_scenario(scenario, iters, 0)
    model = get_model(wl.model)
    for name in policies:
        t0 = time.perf_counter()
        sim = Simulator(
            resolve_policies([name])[0],
            wl,
            model,
            cluster.hardware,
            cluster.num_gpus,
            iters,
            random.Random(0),
        )
        st = sim.run()
        end = st.records[-1].train_end_s
        tokens = sum(r.tokens for r in st.records)
        rollout = [r.rollout_end_s - r.rollout_start_s for r in st.records]
        plan = sim.dep.plan
        print(
            f"{name:15s} tok/s {tokens / end:8.0f}  rollout {sum(rollout) / len(rollout):7.1f} s  "
            f"iteration {end / iters:7.1f} s  moves {sum(r.moves for r in st.records)}  "
            f"tail {long_tail_share(st.latencies_s):.2f}  wall {time.perf_counter() - t0:.1f} s"
        )
        predicted = (
            f"predicted rollout {plan.t_rollout_s:.1f} s, train {plan.t_train_s:.1f} s" if plan else ""
        )
        print(f"    {st.deployments[0]} {predicted} buckets {sim.dep.bucket_bounds}")


if __name__ == "__main__":
    main()
