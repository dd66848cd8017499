"""The simulator's comparison tables, one per scenario, next to the paper's figures.

.venv/bin/python benchmarks/sim_table.py [--iterations 30] [--scenarios r2e-gym search-r1 dapo-math]
    [--spec FIELD=VALUE ...] [--setting FIELD=VALUE ...] [--policies NAME ...] [--calibration]
    [--seed N | --seeds N N ...] [--jobs N] [--out DIR]

`--spec` changes fields of the chosen scenarios' generator (`ScenarioSpec` in
libra_core/sim/workloads.py) for this run only, e.g. `--spec mean_subtasks=2 difficulty_sigma=2`:
a what-if on the workload shape. `--setting` changes the simulator's `SimSettings`
(libra_core/sim/engine.py), e.g. `--setting spill_factor=1 move_reprefill=false`: a what-if on the
router or the engine. `--policies` runs only the named policies (default: all of them). `--jobs`
simulates that many policies at once, each in its own process (the same numbers; each policy's
wall time grows when jobs outnumber the cores).
`--seeds` runs every seed and then prints, per scenario, each policy's tok/s by seed (with the
smallest and largest) and the two verdicts by seed: how robust an ordering is to the workload's draw.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libra_core.sim import POLICIES, format_table, simulate, workloads
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import CALIBRATION
from libra_core.sim.report import SimReport, format_verdicts, verdicts
from libra_core.sim.settings import SimSettings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--scenarios", nargs="+", default=["r2e-gym", "search-r1", "dapo-math"])
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=int, default=None, help="the seed (default 0)")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="several seeds, summarised (not with --seed)"
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for summary.json and CSVs per scenario")
    ap.add_argument("--spec", nargs="*", default=[], help="FIELD=VALUE changes to the scenarios' generator")
    ap.add_argument("--setting", nargs="*", default=[], help="FIELD=VALUE changes to SimSettings")
    ap.add_argument("--policies", nargs="*", default=None, help="policy names (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="policies simulated at once, one process each")
    ap.add_argument(
        "--calibration",
        action="store_true",
        help="also run the oracle-routing and oracle-replan policies (perfect admission)",
    )
    args = ap.parse_args()
    if args.seeds and args.seed is not None:
        ap.error("give either --seed or --seeds")
    try:
        overrides = parse_overrides(args.spec, workloads.ScenarioSpec, "--spec")
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print("command: .venv/bin/python benchmarks/sim_table.py " + " ".join(sys.argv[1:]))
    seeds = args.seeds or [0 if args.seed is None else args.seed]
    for sc in args.scenarios:
        names = args.policies or [p for p in POLICIES if p not in CALIBRATION or args.calibration]
        reports = []
        for seed in seeds:
            out = args.out / sc if args.out else None
            if out is not None and args.seeds:
                out = out / f"seed{seed}"
            report = simulate(
                sc,
                args.hardware,
                args.iterations,
                names,
                seed=seed,
                out_dir=out,
                settings=settings,
                spec_overrides=overrides if sc in workloads.SCENARIOS else None,  # a trace has no generator
                jobs=args.jobs,
            )
            reports.append(report)
            print()
            print(format_table(report))
            for line in format_verdicts(report):
                print(line)
            print("wall s per policy: " + ", ".join(f"{r.policy} {r.wall_s:.1f}" for r in report.results))
        if args.seeds:
            print()
            print(format_seed_summary(sc, seeds, reports))


def format_seed_summary(scenario: str, seeds: list[int], reports: list[SimReport]) -> str:
    """tok/s of every policy by seed (with the smallest and largest) and both verdicts by seed."""
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"{scenario}: {len(seeds)} seeds",
        f"| policy | {head} | min | max |",
        "|---|" + "---:|" * (len(seeds) + 2),
    ]
    for r0 in reports[0].results:
        tok = [rep.result(r0.policy).tokens_per_s for rep in reports]
        cells = " | ".join(f"{t:,.0f}" for t in tok)
        lines.append(f"| {r0.policy} | {cells} | {min(tok):,.0f} | {max(tok):,.0f} |")
    for name in ("ordering", "ablation"):
        got = [getattr(verdicts(rep), name) for rep in reports]
        if all(g is None for g in got):
            continue
        held = sum(1 for g in got if g)
        cells = " | ".join("-" if g is None else str(g) for g in got)
        lines.append(f"| {name} verdict | {cells} | {held} of {len(got)} hold | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
