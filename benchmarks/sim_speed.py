"""Wall time of simulating R2E-Gym on 48xA800 (acceptance: 100 iterations under 60 s per policy).

.venv/bin/python benchmarks/sim_speed.py [--iterations 100] [--policies greedy +elastic]
"""

from __future__ import annotations

import argparse
import platform
import time

from libra_core.sim import simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--policies", nargs="+", default=["greedy", "+elastic"])
    ap.add_argument("--scenario", default="r2e-gym")
    ap.add_argument("--hardware", default="48xA800")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    t0 = time.perf_counter()
    report = simulate(args.scenario, args.hardware, args.iterations, args.policies, seed=0)
    print("| policy | iterations | events | wall s | limit s |")
    print("|---|---:|---:|---:|---:|")
    for r in report.results:
        print(f"| {r.policy} | {args.iterations} | {r.events:,} | {r.wall_s:.1f} | 60 |")
    print(f"total wall (incl. lower bound): {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
