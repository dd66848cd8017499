"""`libra trace export` and `libra trace-eval`: routing traces out of runs, schedulers scored on them.

    libra trace export RUN_DIR -o trace.parquet
    libra trace synth --preset causal|noisy|fresh [--seed N] -o trace.parquet
    libra trace-eval --trace FILE --scheduler NAME|all --buckets B1,B2 [--json OUT] [CONFIG] [--set ...]

The scheduler settings other than the type and the bucket bounds come from the config (so
`--set scheduler.min_support=2` is honoured). All logic lives in libra_core.traces.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from flows.cli_common import fail, input_path, output_path, output_problem


def add_parsers(
    sub: argparse._SubParsersAction, add_config_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    trace = sub.add_parser("trace", help="routing traces (one row per trajectory)")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    export = trace_sub.add_parser("export", help="write the trace of a run's trajectory lake")
    export.add_argument("run_dir", metavar="RUN_DIR", type=input_path, help="a run folder (has lake/)")
    export.add_argument(
        "-o", "--output", required=True, type=output_path, metavar="FILE", help="Parquet file to write"
    )

    synth = trace_sub.add_parser("synth", help="write a synthetic trace (drift, long tails)")
    synth.add_argument("--preset", default="causal", help="generator preset: causal | noisy | fresh")
    synth.add_argument("--seed", type=int, default=0, help="RNG seed, >= 0 (default 0)")
    synth.add_argument(
        "-o", "--output", required=True, type=output_path, metavar="FILE", help="Parquet file to write"
    )

    ev = sub.add_parser("trace-eval", help="replay a trace under schedulers and report routing metrics")
    ev.add_argument(
        "--trace", required=True, metavar="FILE", type=input_path, help="Parquet trace (libra trace export)"
    )
    ev.add_argument("--scheduler", default="all", help="scheduler name, or `all` (default)")
    ev.add_argument(
        "--buckets",
        required=True,
        metavar="B1,B2,...",
        help="ascending upper bounds in tokens; N bounds give N+1 buckets, the last open",
    )
    ev.add_argument("--json", type=output_path, metavar="OUT", help="also write the records as a JSON list")
    add_config_args(ev)


def cmd_trace(args: argparse.Namespace) -> int:
    import random

    from libra_core.traces.export import export_trace
    from libra_core.traces.report import trace_summary
    from libra_core.traces.schema import TraceSchemaError, read_trace, write_trace
    from libra_core.traces.synthetic import synthetic_trace

    if args.trace_command == "synth" and args.seed < 0:
        return fail(f"--seed must be >= 0, got {args.seed}")
    run_dir = args.run_dir if args.trace_command == "export" else None
    problem = output_problem(args.output, run_dir=run_dir)
    if problem:
        return fail(problem)
    try:
        if args.trace_command == "export":
            path = export_trace(args.run_dir, args.output)
        else:
            path = write_trace(synthetic_trace(random.Random(args.seed), args.preset), args.output)
    except (FileNotFoundError, TraceSchemaError, ValueError) as err:
        return fail(str(err))
    print(f"wrote {path}: {trace_summary(read_trace(path))}")
    return 0


def cmd_trace_eval(
    args: argparse.Namespace, load_config: Callable[[argparse.Namespace], object], config_path: str | None
) -> int:
    """`config_path`: the config file read (the CONFIG argument, else ./stages.yaml if present; None:
    the defaults), an input that `--json` must not replace."""
    from rich.console import Console

    from libra_core.config import LibraConfig
    from libra_core.traces.evaluate import parse_buckets, run_trace_eval
    from libra_core.traces.report import format_plain, format_rich
    from libra_core.traces.schema import TraceSchemaError

    cfg = load_config(args)
    assert isinstance(cfg, LibraConfig)
    if Path(args.trace).is_dir():
        return fail(
            f"--trace {args.trace}: is a folder, not a file; give a Parquet trace (libra trace export)"
        )
    inputs = [args.trace] if config_path is None else [args.trace, config_path]
    problem = None if args.json is None else output_problem(args.json, inputs=inputs)  # "" too
    if problem:
        return fail(problem)
    try:
        buckets = parse_buckets(args.buckets)
        records = run_trace_eval(args.trace, args.scheduler, buckets, base=cfg.scheduler)
    except (FileNotFoundError, TraceSchemaError, ValueError) as err:
        return fail(str(err))
    title = f"{args.trace} (buckets {','.join(map(str, buckets))})"
    if sys.stdout.isatty():  # markup off: the title holds the trace's path, shown as typed
        Console(markup=False).print(format_rich(records, title=title))
    else:  # a pipe or a log file: the markdown table, never cut to a terminal's width
        print(f"{title}\n{format_plain(records)}")
    if args.json is not None:
        from libra_core.data.atomic import atomic_path

        out = Path(args.json)
        # whole records: the table's columns (scheduler, the metrics, moves), decisions, trajectories
        with atomic_path(out) as tmp:
            tmp.write_text(json.dumps(records, indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0
