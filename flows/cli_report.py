"""`libra report`: a self-contained report of a run folder (timeline, curves, timing tables).

    libra report RUN_DIR [--format html|md] [--out PATH]

All logic lives in libra_core.observability.report; this prints the written path. Exit 2, with a
one-line message, when RUN_DIR is missing, is not a run folder or has no iterations yet, or when a
file the report writes (the report; for md, its PNGs next to it) cannot be written there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli_common import fail, input_path, output_path, output_problem


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML or Markdown report of a run (timeline, curves, tables)")
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        type=input_path,
        help="a run folder, e.g. runs/arith-grpo-20250101-120000",
    )
    p.add_argument("--format", dest="fmt", choices=("html", "md"), default="html", help="default: html")
    p.add_argument(
        "--out",
        default=None,
        type=output_path,
        metavar="PATH",
        help="report file (default: RUN_DIR/report.FORMAT)",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from libra_core.config.loader import RESOLVED_CONFIG_NAME, ConfigError

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        return fail(f"{run_dir}: {'is not a folder' if run_dir.exists() else 'no such folder'}")
    if not (run_dir / RESOLVED_CONFIG_NAME).is_file():
        return fail(f"{run_dir}: not a run folder (no {RESOLVED_CONFIG_NAME})")
    # Every file the report writes is checked, the default report path included (a read-only run
    # folder, a folder named report.html), and the Markdown report's PNGs next to it.
    out = Path(args.out) if args.out is not None else run_dir / f"report.{args.fmt}"
    problem = output_problem(args.out if args.out is not None else out, run_dir=run_dir)
    from libra_core.observability.report import FIGURES, build_report, markdown_figure_path

    if not problem and args.fmt == "md":
        pngs = (markdown_figure_path(out, key) for key in FIGURES)
        problem = next((p for p in (output_problem(png, run_dir=run_dir) for png in pngs) if p), None)
    if problem:
        return fail(problem)

    try:
        path = build_report(run_dir, out, args.fmt)
    except (ValueError, FileNotFoundError, ConfigError) as err:
        return fail(" ".join(str(err).split()))
    print(path)
    return 0
