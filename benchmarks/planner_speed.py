"""How long the Global Resource Planner takes to plan, on this machine.

Usage: python benchmarks/planner_speed.py [--repeats 3]

Cases: 48xA800 + Qwen3-14B and 16xH100 + Qwen3-30B-A3B on the swe-longtail preset (acceptance:
< 2 s each), and two 1024-GPU budgets (acceptance: < 30 s each): 1024xH100 + Qwen3-32B on
swe-longtail and 1024xA800 + Qwen3-30B-A3B on search-medium; each at staleness 0 and 1. Reports the
best of `--repeats` wall times of `plan_cluster` (which includes building the workload). Exit code 1
when a case exceeds its limit.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from libra_core.planner import plan_cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int  # noqa: E402

CASES = [
    ("48xA800", "qwen3-14b", "swe-longtail", 2.0),
    ("16xH100", "qwen3-30b-a3b", "swe-longtail", 2.0),
    ("1024xH100", "qwen3-32b", "swe-longtail", 30.0),
    ("1024xA800", "qwen3-30b-a3b", "search-medium", 30.0),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per case; the best is kept")
    args = parser.parse_args(argv)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    print(
        "| cluster | model | workload | staleness | plan (train / rollout) | T_iter s | wall s (best of "
        f"{args.repeats}) | limit s |"
    )
    print("|---|---|---|---:|---|---:|---:|---:|")
    worst_ratio = 0.0
    for cluster, model, workload, limit in CASES:
        for staleness in (0, 1):
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                report = plan_cluster(cluster, model, workload, staleness=staleness)
                times.append(time.perf_counter() - t0)
            best = report.best
            assert best is not None, f"{cluster} {model}: no feasible plan"
            tps = " ".join(f"{n}xTP{t}" for t, n in best.instance_tps.items())
            wall = min(times)
            worst_ratio = max(worst_ratio, wall / limit)
            print(
                f"| {cluster} | {model} | {workload} | {staleness} | {best.train_gpus} "
                f"[{best.train.layout.label()}] / {best.rollout_gpus} [{tps}] | {best.t_iter_s:.1f} | "
                f"{wall:.2f} | {limit:.0f} |"
            )
    print(f"worst wall/limit: {worst_ratio:.2f}")
    return 0 if worst_ratio < 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
