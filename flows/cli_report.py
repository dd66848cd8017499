"""`libra report`: a self-contained report of a run folder (timeline, curves, timing tables).

    libra report RUN_DIR [--format html|md] [--out PATH]

All logic lives in libra_core.observability.report; this prints the written path. Exit 2, with a
one-line message, when RUN_DIR is missing, is not a run folder or has no iterations yet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli_common import fail, output_problem


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML or Markdown report of a run (timeline, curves, tables)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, e.g. runs/arith-grpo-20250101-120000")
    p.add_argument("--format", dest="fmt", choices=("html", "md"), default="html", help="default: html")
    p.add_argument("--out", default=None, metavar="PATH", help="report file (default: RUN_DIR/report.FORMAT)")


def cmd_report(args: argparse.Namespace) -> int:
    from libra_core.config.loader import RESOLVED_CONFIG_NAME, ConfigError

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        return fail(f"{run_dir}: no such folder")
    if not (run_dir / RESOLVED_CONFIG_NAME).is_file():
        return fail(f"{run_dir}: not a run folder (no {RESOLVED_CONFIG_NAME})")
    problem = args.out is not None and output_problem(args.out, run_dir=run_dir)
    if problem:
        return fail(problem)
    from libra_core.observability.report import build_report

    try:
        path = build_report(run_dir, args.out, args.fmt)
    except (ValueError, FileNotFoundError, ConfigError) as err:
        return fail(" ".join(str(err).split()))
    print(path)
    return 0
