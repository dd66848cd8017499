"""The shape of a generated scenario's trajectories: quantiles per iteration, tail shares, the cap.

    .venv/bin/python benchmarks/sim_workload_shape.py [--scenario r2e-gym] [--iterations 100]
        [--at 0 50 99] [--spec FIELD=VALUE ...]

For each listed iteration: p50 / p90 / p99 / max of a trajectory's total tokens (prompt + generated +
tool payloads), generated tokens, summed tool seconds and turns; the share of the top 10% of
trajectories in summed generated tokens and in summed tool seconds; and the share of trajectories cut
at the scenario's context cap (`max_total_tokens`). No simulation runs: this is the workload the
policies are given. `--spec` changes generator fields as `benchmarks/sim_table.py --spec` does.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from libra_core.sim.overrides import parse_overrides
from libra_core.sim.workloads import SCENARIOS, ScenarioSpec, ScenarioWorkload, long_tail_share

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, non_negative_int, positive_int  # noqa: E402


def _quantiles(x: np.ndarray) -> str:
    return " / ".join(f"{np.quantile(x, q):,.0f}" for q in (0.5, 0.9, 0.99, 1.0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument(
        "--iterations", type=positive_int, default=100, help="run length the drift is spread over"
    )
    ap.add_argument(
        "--at",
        type=non_negative_int,
        nargs="+",
        action=ExtendList,
        default=None,
        help="iterations (default: first, mid, last)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--spec",
        nargs="+",
        action="extend",
        default=[],
        metavar="FIELD=VALUE",
        help="changes to the generator (repeatable)",
    )
    args = ap.parse_args(argv)
    n = args.iterations
    at = args.at if args.at is not None else sorted({0, n // 2, n - 1})
    bad = [i for i in at if not 0 <= i < n]
    if bad:
        ap.error(f"--at {bad} outside 0..{n - 1}")
    try:
        spec = replace(SCENARIOS[args.scenario], **parse_overrides(args.spec, ScenarioSpec, "--spec"))
        wl = ScenarioWorkload(spec, n, args.seed)
    except ValueError as err:
        ap.error(str(err))
    shape = f"{spec.prompts_per_iteration} prompts x {spec.group_size}, cap {spec.max_total_tokens:,}"
    print(f"{spec.name}: {shape}")
    print("quantiles are p50 / p90 / p99 / max; top 10% = their share of the iteration's sum")
    cols = ("iteration", "total tokens", "generated tokens", "tool s", "turns", "top 10% gen", "top 10% tool")
    print("| " + " | ".join(cols) + " | at cap |")
    print("|" + "---:|" * (len(cols) + 1))
    for i in at:
        ts = wl.trajectories(i)
        total = np.array([t.total_tokens for t in ts], dtype=float)
        gen = np.array([sum(x.gen_tokens for x in t.turns) for t in ts], dtype=float)
        tool = np.array([sum(t.tool_latency_s) for t in ts])
        turns = np.array([len(t.turns) for t in ts], dtype=float)
        capped = float(np.mean(total >= spec.max_total_tokens))
        row = (
            str(i),
            _quantiles(total),
            _quantiles(gen),
            _quantiles(tool),
            _quantiles(turns),
            f"{long_tail_share(list(gen)):.0%}",
            f"{long_tail_share(list(tool)):.0%}",
            f"{capped:.0%}",
        )
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
