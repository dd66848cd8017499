"""Mean iteration seconds per policy over windows of iterations, from a `sim_table.py --out` run.

    .venv/bin/python benchmarks/sim_iteration_means.py OUT/SCENARIO [--first 1 10] [--last 10]
        [--policies greedy static-optimal +planning]

Reads `summary.json` (written by `SimReport.write`): `--first A B` averages iterations A..B
(inclusive, 0-based), `--last N` the last N. Iteration 0 includes the pipeline's start (the first
rollout runs before any update), so the default early window starts at 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a scenario folder of `sim_table.py --out`")
    ap.add_argument("--first", type=int, nargs=2, default=[1, 10], metavar=("A", "B"))
    ap.add_argument("--last", type=int, default=10)
    ap.add_argument(
        "--policies", nargs="+", action="extend", default=None, help="default: every policy in the run"
    )
    args = ap.parse_args(argv)
    path = args.folder / "summary.json"
    if not path.is_file():
        ap.error(f"{path} not found; pass a scenario folder written by sim_table.py --out")
    a, b = args.first
    if not 0 <= a <= b or args.last < 1:
        ap.error(f"need 0 <= A <= B and --last >= 1, got --first {a} {b} --last {args.last}")
    try:
        summary = json.loads(path.read_text())
        header = f"{summary['scenario']}, {summary['iterations']} iterations, seed {summary['seed']}"
        series = {r["policy"]: [float(s) for s in r["iteration_s"]] for r in summary["results"]}
    except (ValueError, KeyError, TypeError) as err:
        ap.error(f"{path}: not a summary.json of sim_table.py --out ({type(err).__name__}: {err})")
    unknown = sorted(set(args.policies or []) - set(series))
    if unknown:
        ap.error(f"--policies {unknown} are not in {path}; it has {list(series)}")
    chosen = {p: its for p, its in series.items() if not args.policies or p in args.policies}
    if not chosen:
        ap.error(f"{path}: holds no policy's results")
    short = min(len(its) for its in chosen.values())  # every window is checked before the table
    if b >= short or args.last > short:
        ap.error(f"the run has {short} iterations; --first {a} {b} --last {args.last} is beyond it")
    print(header)
    print(f"| policy | mean iteration s, {a}-{b} | mean iteration s, last {args.last} |")
    print("|---|---:|---:|")
    for policy, its in chosen.items():
        early, late = its[a : b + 1], its[-args.last :]
        print(f"| {policy} | {statistics.mean(early):.1f} | {statistics.mean(late):.1f} |")


if __name__ == "__main__":
    main()
