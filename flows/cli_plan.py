"""`libra plan`: what the Global Resource Planner would run on a cluster, for a model and workload.

    libra plan --hardware 48xA800 --model qwen3-14b --workload swe-longtail|TRACE.parquet
        [--staleness N] [--gpu-budget N] [--top N] [--mixed-margin F] [--capped-path] [--json]

The plan task of the flow uses the same search (libra_core.planner). Exit 2 on an unknown
hardware/model/workload name or an unreadable trace, with the valid names in the message; exit 1
when no plan fits the cluster (the report says so), so a script can tell it from a plan.
"""

from __future__ import annotations

import argparse
import json
import sys

from flows.cli_common import fail, input_path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan training/rollout GPUs and layouts for a cluster and workload",
        epilog="exit status: 0 with at least one plan, 1 when no plan fits the cluster, 2 on bad input",
    )
    p.add_argument(
        "--hardware",
        required=True,
        help="COUNTxGPU, e.g. 48xA800 or 16xH100; GPU: a name or a hardware spec YAML file",
    )
    p.add_argument(
        "--model",
        required=True,
        help="model spec name, e.g. qwen3-14b, or a Hugging Face config.json or model spec YAML file",
    )
    p.add_argument("--workload", required=True, type=input_path, help="preset name or a trace Parquet file")
    p.add_argument("--staleness", type=int, default=0, help="policy lag allowed (0: synchronous)")
    p.add_argument("--gpu-budget", type=int, default=None, help="use at most this many GPUs")
    p.add_argument("--top", type=int, default=4, help="plans to show (best first)")
    p.add_argument(
        "--mixed-margin",
        type=float,
        default=0.05,
        help="a mixed-TP layout ranks first only if priced this share faster than one degree "
        "(planner.mixed_margin; 0: by price alone)",
    )
    p.add_argument(
        "--capped-path",
        action="store_true",
        help="price the rollout's critical path at the KV-capped batch for its whole life, the price "
        "before 2026-12-04 (planner.two_phase_path: false); default: two phases, loaded then alone",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from libra_core.planner import format_plain, plan_cluster, render_rich

    for flag, value, least in (
        ("--staleness", args.staleness, 0),
        ("--gpu-budget", args.gpu_budget, 1),
        ("--top", args.top, 1),
    ):
        if value is not None and value < least:
            return fail(f"{flag} must be >= {least}, got {value}")
    if not 0.0 <= args.mixed_margin < 1.0:
        return fail(f"--mixed-margin must be in [0, 1), got {args.mixed_margin}")
    try:
        report = plan_cluster(
            args.hardware,
            args.model,
            args.workload,
            staleness=args.staleness,
            gpu_budget=args.gpu_budget,
            top_k=args.top,
            mixed_margin=args.mixed_margin,
            two_phase_path=not args.capped_path,
        )
    except (ValueError, FileNotFoundError, KeyError) as err:
        return fail(str(err))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif sys.stdout.isatty():  # markup off: names from spec files and traces are shown as they are
        Console(markup=False).print(render_rich(report))
    else:  # a pipe or a log file: one plain line per plan, never cut to a terminal's width
        print(format_plain(report))
    return 0 if report.plans else 1
