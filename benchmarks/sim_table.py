"""The simulator's comparison tables, one per scenario, next to the paper's figures.

.venv/bin/python benchmarks/sim_table.py [--iterations 30] [--scenarios r2e-gym search-r1 dapo-math]
    [--spec FIELD=VALUE ...] [--setting FIELD=VALUE ...] [--policies NAME ...] [--calibration]

`--spec` changes fields of the chosen scenarios' generator (`ScenarioSpec` in
libra_core/sim/workloads.py) for this run only, e.g. `--spec mean_subtasks=2 difficulty_sigma=2`:
a what-if on the workload shape. `--setting` changes the simulator's `SimSettings`
(libra_core/sim/engine.py), e.g. `--setting spill_factor=1 move_reprefill=false`: a what-if on the
router or the engine. `--policies` runs only the named policies (default: all of them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libra_core.sim import POLICIES, format_table, simulate, workloads
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import CALIBRATION
from libra_core.sim.report import format_verdicts
from libra_core.sim.settings import SimSettings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--scenarios", nargs="+", default=["r2e-gym", "search-r1", "dapo-math"])
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="folder for summary.json and CSVs per scenario")
    ap.add_argument("--spec", nargs="*", default=[], help="FIELD=VALUE changes to the scenarios' generator")
    ap.add_argument("--setting", nargs="*", default=[], help="FIELD=VALUE changes to SimSettings")
    ap.add_argument("--policies", nargs="*", default=None, help="policy names (default: all)")
    ap.add_argument(
        "--calibration",
        action="store_true",
        help="also run the oracle-routing and oracle-replan policies (perfect admission)",
    )
    args = ap.parse_args()
    try:
        overrides = parse_overrides(args.spec, workloads.ScenarioSpec, "--spec")
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print("command: .venv/bin/python benchmarks/sim_table.py " + " ".join(sys.argv[1:]))
    for sc in args.scenarios:
        out = args.out / sc if args.out else None
        names = args.policies or [p for p in POLICIES if p not in CALIBRATION or args.calibration]
        report = simulate(
            sc,
            args.hardware,
            args.iterations,
            names,
            seed=args.seed,
            out_dir=out,
            settings=settings,
            spec_overrides=overrides if sc in workloads.SCENARIOS else None,  # a trace has no generator
        )
        print()
        print(format_table(report))
        for line in format_verdicts(report):
            print(line)
        print("wall s per policy: " + ", ".join(f"{r.policy} {r.wall_s:.1f}" for r in report.results))


if __name__ == "__main__":
    main()
