"""The simulator's comparison tables, one per scenario, next to the paper's figures.

.venv/bin/python benchmarks/sim_table.py [--iterations 30] [--scenarios r2e-gym search-r1 dapo-math]
    [--spec FIELD=VALUE ...] [--calibration]

`--spec` changes fields of the chosen scenarios' generator (`ScenarioSpec` in
libra_core/sim/workloads.py) for this run only, e.g. `--spec mean_subtasks=2 difficulty_sigma=2`:
a what-if on the workload shape.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path

from libra_core.sim import ABLATION, POLICIES, format_table, simulate, workloads
from libra_core.sim.policies import CALIBRATION


def _spec_overrides(pairs: list[str]) -> dict[str, float]:
    numeric = {f.name for f in fields(workloads.ScenarioSpec) if f.type in ("int", "float", int, float)}
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in numeric:
            raise SystemExit(f"--spec {pair!r}: expected FIELD=NUMBER with FIELD one of {sorted(numeric)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise SystemExit(f"--spec {pair!r}: {value!r} is not a number") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--scenarios", nargs="+", default=["r2e-gym", "search-r1", "dapo-math"])
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="folder for summary.json and CSVs per scenario")
    ap.add_argument("--spec", nargs="*", default=[], help="FIELD=VALUE changes to the scenarios' generator")
    ap.add_argument(
        "--calibration",
        action="store_true",
        help="also run the oracle-routing and oracle-replan policies (perfect admission)",
    )
    args = ap.parse_args()
    overrides = _spec_overrides(args.spec)
    for sc in args.scenarios:
        if overrides and sc in workloads.SCENARIOS:
            spec = workloads.SCENARIOS[sc]
            typed = {k: type(getattr(spec, k))(v) for k, v in overrides.items()}
            workloads.SCENARIOS[sc] = replace(spec, **typed)
    print("command: .venv/bin/python benchmarks/sim_table.py " + " ".join(sys.argv[1:]))
    for sc in args.scenarios:
        out = args.out / sc if args.out else None
        names = [p for p in POLICIES if p not in CALIBRATION or args.calibration]
        report = simulate(sc, args.hardware, args.iterations, names, seed=args.seed, out_dir=out)
        print()
        print(format_table(report))
        chain = " -> ".join(f"{report.result(p).tokens_per_s:,.0f}" for p in ABLATION)
        print(f"ablation ({' -> '.join(ABLATION)}): {chain} tok/s")
        order = ["+elastic", "static-optimal", "greedy", "colocated"]
        ok = all(
            report.result(a).tokens_per_s > report.result(b).tokens_per_s
            for a, b in zip(order, order[1:], strict=False)
        )
        print(f"paper ordering Libra > static-optimal > greedy > colocated reproduced: {ok}")
        steps = [report.result(p).tokens_per_s for p in ABLATION]
        print(
            f"ablation increasing at every step: {all(b > a for a, b in zip(steps, steps[1:], strict=False))}"
        )
        print("wall s per policy: " + ", ".join(f"{r.policy} {r.wall_s:.1f}" for r in report.results))


if __name__ == "__main__":
    main()
