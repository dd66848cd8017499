"""What the control room's views cost per iteration: timeline PNG, curves PNG, the HTML report.

.venv/bin/python benchmarks/artifact_cost.py RUN_DIR [--repeat 5]

Renders from a finished run folder (no Prefect, no engines); prints the median seconds of each,
and the time between one iteration's last span and the next one's first (record, artifacts and
subflow start-up, as the run measured it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from libra_core.data.history import read_history
from libra_core.observability.plots import curves_png, gantt_png
from libra_core.observability.report import build_report
from libra_core.observability.timeline import read_timeline

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem, positive_int  # noqa: E402


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--repeat", type=positive_int, default=5, help="timings per view (the median is shown)")
    args = ap.parse_args(argv)
    problem = folder_problem(args.run_dir, what="run folder")
    if problem:
        ap.error(problem)
    try:  # a damaged timeline or history file is named, not a traceback
        spans = read_timeline(args.run_dir)
        history = read_history(args.run_dir)
    except ValueError as err:
        ap.error(f"{args.run_dir}: {err}")
    if not spans:
        ap.error(f"{args.run_dir}: no timeline recorded")
    if not history:  # the curves view draws the history
        ap.error(f"{args.run_dir}: no history recorded (history.parquet)")
    last = [s for s in spans if s.iteration == max(s.iteration for s in spans)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rows = [
            ("timeline PNG, one iteration", _median_s(lambda: gantt_png(last, out / "t.png"), args.repeat)),
            ("curves PNG, whole run", _median_s(lambda: curves_png(history, out / "c.png"), args.repeat)),
            ("report.html", _median_s(lambda: build_report(args.run_dir, out / "r.html"), args.repeat)),
        ]
    by_iteration: dict[int, list[float]] = {}
    for s in spans:
        by_iteration.setdefault(s.iteration, []).extend((s.start, s.end))
    its = sorted(by_iteration)
    gaps = [min(by_iteration[b]) - max(by_iteration[a]) for a, b in zip(its, its[1:], strict=False)]
    print(f"run: {args.run_dir} ({len(history)} iterations, {len(last)} spans in the last)")
    if gaps:
        print(f"between iterations: median {statistics.median(gaps):.3f} s, total {sum(gaps):.1f} s")
    print("| view | median s |")
    print("|---|---:|")
    for name, s in rows:
        print(f"| {name} | {s:.3f} |")


if __name__ == "__main__":
    main()
