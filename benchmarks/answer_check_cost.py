"""What the math reward's worker process costs: seconds per check, in-process vs the worker.

.venv/bin/python benchmarks/answer_check_cost.py [--data ../shared/data] [--file math/math500_test.jsonl]
    [--n 500] [--timeout-s 10] [--slow]

Checks each record's reference answer, boxed after a line of reasoning, against itself and against
a wrong value, first in-process (`answer_check.math_equivalent`), then through the worker
(`answer_worker.AnswerCheckWorker`, started before the timing); prints the mean milliseconds per
check of each, whether both gave the same verdicts, and the worker's start-up time. `--slow` also
times one answer the lexical screen lets through but sympy takes long over (SLOW_ANSWER), in-process
and through the worker with its deadline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from libra_core.envs.answer_check import math_equivalent
from libra_core.envs.answer_worker import AnswerCheckWorker
from libra_core.envs.datasets import load_math

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem, positive_float, positive_int, summary  # noqa: E402

SLOW_ANSWER = "\\boxed{\\tan(\\tan(\\tan(\\tan(x+1)+2)+3)+4)}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=summary(__doc__))
    ap.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    ap.add_argument("--file", default="math/math500_test.jsonl", help="a math JSONL file under --data")
    ap.add_argument("--n", type=positive_int, default=500, help="records checked (each twice)")
    ap.add_argument("--timeout-s", type=positive_float, default=10.0, help="the worker's deadline")
    ap.add_argument("--slow", action="store_true", help="also time SLOW_ANSWER both ways")
    args = ap.parse_args(argv)
    problem = folder_problem(args.data, needs=[args.file], what="data folder")
    if not problem and not (args.data / args.file).is_file():
        problem = f"--file {args.file}: {args.data / args.file} is not a file"
    if problem:
        ap.error(problem)
    try:
        records = load_math(str(args.data), (args.file,))[: args.n]
    except (ValueError, OSError) as err:  # not JSON lines, or a record without its answer
        ap.error(f"--file {args.file}: {err}")
    if not records:
        ap.error(f"--file {args.file}: {args.data / args.file} holds no record")
    pairs = []
    for r in records:
        pairs.append((r.answer, f"Adding the two parts gives the result. \\boxed{{{r.answer}}}"))
        pairs.append((r.answer, "Adding the two parts gives the result. \\boxed{12345}"))

    t0 = time.perf_counter()
    local = [math_equivalent(ref, ans) for ref, ans in pairs]
    local_s = time.perf_counter() - t0

    worker = AnswerCheckWorker(args.timeout_s)
    try:
        t0 = time.perf_counter()
        worker.math_equivalent("1", "\\boxed{1}")  # starts the process
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        remote = [worker.math_equivalent(ref, ans) for ref, ans in pairs]
        remote_s = time.perf_counter() - t0
    finally:
        worker.close()

    n = len(pairs)
    print(f"{n} checks of {len(records)} records from {args.data / args.file}")
    print(f"verdicts equal: {local == remote}; correct self-checks: {sum(v is True for v in local[::2])}")
    print("| where | ms per check | total s |")
    print("|---|---:|---:|")
    print(f"| in-process | {1000 * local_s / n:.2f} | {local_s:.2f} |")
    print(f"| worker process | {1000 * remote_s / n:.2f} | {remote_s:.2f} |")
    print(f"worker start-up: {start_s:.2f} s; restarts: {worker.restarts}")
    if args.slow:
        _time_slow_answer(args.timeout_s)


def _time_slow_answer(timeout_s: float) -> None:
    worker = AnswerCheckWorker(timeout_s)
    try:
        t0 = time.perf_counter()
        verdict = worker.math_equivalent("1", SLOW_ANSWER)
        worker_s = time.perf_counter() - t0
    finally:
        worker.close()
    t0 = time.perf_counter()
    local = math_equivalent("1", SLOW_ANSWER)
    local_s = time.perf_counter() - t0
    print(f"{SLOW_ANSWER}: in-process {local_s:.1f} s ({local})")
    print(f"  worker: {worker_s:.1f} s ({verdict}; deadline {timeout_s:g} s, restarts {worker.restarts})")


if __name__ == "__main__":
    main()
