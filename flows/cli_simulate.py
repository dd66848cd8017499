"""`libra simulate`: replay a drifting agentic workload on a simulated cluster under each policy.

    libra simulate --scenario r2e-gym --hardware 48xA800 --iterations 100 --policies all [--out DIR]
        [--jobs N] [--setting FIELD=VALUE ...] [--spec FIELD=VALUE ...]

All logic lives in libra_core.sim (docs/simulator.md). `--setting` changes the simulator's
`SimSettings` (e.g. `spill_factor=1`), `--spec` the scenario generator's `ScenarioSpec` (e.g.
`prompts_per_iteration=128`) or, for a trace, its replay's `TraceSpec` (e.g. `latency_scale=10`):
what-ifs. Exit 2 on an unknown scenario, hardware, policy or field,
or a bad value, with the valid names in the message, and when the outputs cannot be written (the
table is printed first).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flows.cli_common import EXIT_INTERRUPTED, fail, output_path, output_problem, raise_interrupted


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate Libra and the baselines on a cluster (discrete events)")
    p.add_argument("--scenario", required=True, help="r2e-gym | search-r1 | dapo-math | tiny, or a trace")
    p.add_argument(
        "--hardware", required=True, help="COUNTxGPU, e.g. 48xA800; GPU: a name or a hardware spec YAML file"
    )
    p.add_argument("--iterations", type=int, default=20, help="RL iterations to simulate (default 20)")
    p.add_argument("--policies", default="all", help="comma-separated policy names, or `all`")
    p.add_argument(
        "--model",
        default=None,
        help="model spec name, or a Hugging Face config.json or model spec YAML (default: the scenario's)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of a generated scenario, >= 0 (default 0; a trace replays as recorded)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="policies simulated at once, one process each (default 1; same numbers, sooner on more cores)",
    )
    p.add_argument(
        "--out",
        default=None,
        type=output_path,
        metavar="DIR",
        help="write summary.json, CSVs and PNG plots here",
    )
    p.add_argument(
        "--setting",
        nargs="+",
        action="extend",
        default=[],
        metavar="FIELD=VALUE",
        help="change a simulator setting (SimSettings), e.g. spill_factor=1 move_reprefill=false",
    )
    p.add_argument(
        "--spec",
        nargs="+",
        action="extend",
        default=[],
        metavar="FIELD=VALUE",
        help="change the scenario generator (ScenarioSpec), e.g. prompts_per_iteration=128; for a "
        "trace, its replay (TraceSpec): tool_latency_s, latency_scale",
    )


@contextmanager
def _progress_bars() -> Iterator[Callable[[str, int, int], None]]:
    """One bar per policy (then the lower bound) on stderr, so stdout keeps only the table."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    bars = Progress(
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    ids: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in ids:
            ids[stage] = bars.add_task(stage, total=total)
        bars.update(ids[stage], completed=done)

    with bars:
        yield update


def cmd_simulate(args: argparse.Namespace) -> int:

    from libra_core.sim import SimSettings, format_table, simulate
    from libra_core.sim.overrides import parse_overrides
    from libra_core.sim.report import format_verdicts, write_problem
    from libra_core.sim.workloads import is_trace, spec_class

    for flag, value, least in (
        ("--iterations", args.iterations, 1),
        ("--jobs", args.jobs, 1),
        ("--seed", args.seed, 0),
    ):
        if value < least:
            return fail(f"{flag} must be >= {least}, got {value}")
    if is_trace(args.scenario):  # `~/t.parquet`, as --out and the simulate flow take it
        args.scenario = str(Path(args.scenario).expanduser())
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        return fail(f"--policies names no policy ({args.policies!r}); give names or `all`")
    problem = args.out is not None and (
        output_problem(args.out, folder=True, inputs=[args.scenario] if is_trace(args.scenario) else [])
        or write_problem(Path(args.out))
    )
    if problem:
        return fail(problem)
    if is_trace(args.scenario) and args.seed != 0:  # replays what the trace recorded: nothing is drawn
        print(f"libra: --seed {args.seed} has no effect on a trace replay ({args.scenario})", file=sys.stderr)
    # SIGTERM and SIGHUP end a simulation as Ctrl-C does: with --jobs its worker processes are
    # stopped too (until 2026-12-07 the default handler killed this process alone, and the workers
    # ran on, orphaned), and nothing is written.
    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGHUP, raise_interrupted)
    try:
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        flag = "--spec (for a trace replay)" if is_trace(args.scenario) else "--spec"
        spec = parse_overrides(args.spec, spec_class(args.scenario), flag)
        with _progress_bars() as progress:
            report = simulate(
                args.scenario,
                args.hardware,
                args.iterations,
                policies,
                seed=args.seed,
                model=args.model,
                settings=settings,
                spec_overrides=spec,
                progress=progress,
                jobs=args.jobs,
            )
    except (ValueError, FileNotFoundError, KeyError) as err:
        return fail(str(err))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP (`Interrupted`): one line, not a traceback
        print("libra: simulation interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    # The table first: an output folder that fails now (a full disk) loses the files, not the run.
    print(format_table(report))
    for line in format_verdicts(report):
        print(line)
    if args.out:
        try:
            report.write(Path(args.out))
        except OSError as err:
            where = err.filename or args.out
            return fail(f"the results above were not saved: cannot write {where}: {err.strerror or err}")
    return 0
