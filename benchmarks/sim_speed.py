"""Wall time of simulating R2E-Gym on 48xA800 (acceptance: 100 iterations under 60 s per policy).

.venv/bin/python benchmarks/sim_speed.py [--iterations 100] [--policies greedy +elastic]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from libra_core.sim import simulate
from libra_core.sim.policies import check_cluster_size, resolve_policies
from libra_core.sim.simulate import SimRun

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, or_stop, positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=positive_int, default=100)
    ap.add_argument("--policies", nargs="+", action=ExtendList, default=["greedy", "+elastic"])
    ap.add_argument("--scenario", default="r2e-gym")
    ap.add_argument("--hardware", default="48xA800")
    args = ap.parse_args(argv)
    try:  # what `simulate` checks first, before any timing
        cluster = SimRun(args.scenario, args.hardware, args.iterations).load()[0]
        check_cluster_size(resolve_policies(args.policies), cluster.num_gpus)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    t0 = time.perf_counter()
    report = or_stop(simulate, args.scenario, args.hardware, args.iterations, args.policies, seed=0)
    print("| policy | iterations | events | wall s | limit s |")
    print("|---|---:|---:|---:|---:|")
    for r in report.results:
        print(f"| {r.policy} | {args.iterations} | {r.events:,} | {r.wall_s:.1f} | 60 |")
    print(f"total wall (incl. lower bound): {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
