"""The simulator's comparison tables, one per scenario, next to the paper's figures.

.venv/bin/python benchmarks/sim_table.py [--iterations 30] [--scenarios r2e-gym search-r1 dapo-math]
    [--spec FIELD=VALUE ...] [--setting FIELD=VALUE ...] [--policies NAME ...] [--calibration]
    [--seed N | --seeds N N ...] [--jobs N] [--out DIR]

`--spec` changes fields of the chosen scenarios' generator (`ScenarioSpec` in
libra_core/sim/workloads.py) for this run only, e.g. `--spec mean_subtasks=2 difficulty_sigma=2`:
a what-if on the workload shape. `--setting` changes the simulator's `SimSettings`
(libra_core/sim/settings.py), e.g. `--setting spill_factor=1 move_reprefill=false`: a what-if on the
router or the engine. `--policies` runs only the named policies (default: all of them). `--jobs`
simulates that many policies at once, each in its own process (the same numbers; each policy's
wall time grows when jobs outnumber the cores).
`--spec`, `--setting`, `--scenarios`, `--policies` and `--seeds` may be repeated: their values add up.
Bad values (an unknown scenario, policy or field, `--iterations 0`, an `--out` that cannot be
written) stop the script before it simulates anything, with one `error:` line and exit code 2.
`--seeds` runs every seed and then prints, per scenario, each policy's tok/s by seed (with the
smallest and largest) and the two verdicts by seed: how robust an ordering is to the workload's draw.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.cli_common import output_problem
from libra_core.sim import POLICIES, format_table, simulate, workloads
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import CALIBRATION, check_cluster_size, resolve_policies
from libra_core.sim.report import SimReport, format_verdicts, verdicts
from libra_core.sim.settings import SimSettings
from libra_core.sim.simulate import SimRun

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, add_overrides, non_negative_int, or_stop, positive_int  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict, SimSettings]:
    """The arguments, checked before any simulation: (args, `--spec` overrides, settings). A bad
    value exits 2 with one `error:` line (argparse's `error`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=positive_int, default=30)
    ap.add_argument(
        "--scenarios", nargs="+", action=ExtendList, default=["r2e-gym", "search-r1", "dapo-math"]
    )
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=non_negative_int, default=None, help="the seed (default 0)")
    ap.add_argument(
        "--seeds",
        type=non_negative_int,
        nargs="+",
        action="extend",
        default=None,
        help="several seeds, summarised (not with --seed)",
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for summary.json and CSVs per scenario")
    add_overrides(ap)
    ap.add_argument(
        "--policies", nargs="+", action="extend", default=None, help="policy names (default: all)"
    )
    ap.add_argument(
        "--jobs", type=positive_int, default=1, help="policies simulated at once, one process each"
    )
    ap.add_argument(
        "--calibration",
        action="store_true",
        help="also run the oracle-routing and oracle-replan policies (perfect admission)",
    )
    args = ap.parse_args(argv)
    if args.seeds and args.seed is not None:
        ap.error("give either --seed or --seeds")
    if args.out is not None:
        problem = output_problem(
            args.out, folder=True, inputs=[s for s in args.scenarios if workloads.is_trace(s)]
        )
        if problem:
            ap.error(f"--out {problem}")
    try:
        overrides = parse_overrides(args.spec, workloads.ScenarioSpec, "--spec")
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        specs = resolve_policies(policy_names(args))
        for sc in args.scenarios:  # what `simulate` loads first: bad names fail here, not mid-table
            run = SimRun(sc, args.hardware, args.iterations, 0, None, settings, scenario_spec(sc, overrides))
            check_cluster_size(specs, run.load()[0].num_gpus)
    except (ValueError, FileNotFoundError, KeyError) as err:
        ap.error(str(err))
    return args, overrides, settings


def policy_names(args: argparse.Namespace) -> list[str]:
    """`--policies`, or every policy (the calibration ones with `--calibration`)."""
    return args.policies or [p for p in POLICIES if p not in CALIBRATION or args.calibration]


def scenario_spec(scenario: str, overrides: dict) -> dict | None:
    """`--spec` changes a generated scenario; a trace has no generator."""
    return overrides if scenario in workloads.SCENARIOS else None


def main(argv: list[str] | None = None) -> None:
    args, overrides, settings = parse_args(argv)
    print(
        "command: .venv/bin/python benchmarks/sim_table.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    seeds = args.seeds or [0 if args.seed is None else args.seed]
    names = policy_names(args)
    for sc in args.scenarios:
        reports = []
        for seed in seeds:
            # a trace's results go under its file's stem (`OUT / "/abs/run.parquet"` is the trace itself)
            out = args.out / (Path(sc).stem if workloads.is_trace(sc) else sc) if args.out else None
            if out is not None and args.seeds:
                out = out / f"seed{seed}"
            report = or_stop(
                simulate,
                sc,
                args.hardware,
                args.iterations,
                names,
                seed=seed,
                out_dir=out,
                settings=settings,
                spec_overrides=scenario_spec(sc, overrides),
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
