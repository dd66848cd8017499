"""The default experiment with `pipeline.mode: sync` and `async`, one after the other, compared.

    .venv/bin/python benchmarks/async_vs_sync.py [--iterations 70] [--modes sync,async] [--set KEY=VALUE ...]

Each mode runs through `libra run stages.yaml` (a subprocess, so each has its own engines) with the
same seed and the same cached warm-up; the script then reads both histories and prints, per mode:
the `libra run` process's wall time (0 for a `--summarize` run), the iterations' summed wall time
(the history's `iteration_s`; in async mode an iteration's includes the next one's overlapped
rollout, so the sum counts no second twice), the median iteration, optimizer steps (= policy
versions), mean training reward of the first and last 10 iterations, the greedy evaluation curve,
the staleness actually seen, and what the staleness bound dropped. Run it on an otherwise idle
machine: both modes share the same 2 cores with anything else running.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sync", "async")  # pipeline.mode
OWN_KEYS = ("pipeline.mode", "experiment.iterations", "experiment.name", "experiment.output_dir")


def _run(mode: str, iterations: int, extra: list[str], out_dir: Path) -> tuple[Path, float]:
    name = f"bench-{mode}"
    cmd = [
        str(ROOT / ".venv" / "bin" / "libra"),
        "run",
        "stages.yaml",
        "--set",
        f"pipeline.mode={mode}",
        "--set",
        f"experiment.iterations={iterations}",
        "--set",
        f"experiment.name={name}",
        "--set",
        f"experiment.output_dir={out_dir}",
    ]
    for item in extra:
        cmd += ["--set", item]
    before = set(out_dir.glob(f"{name}-*"))
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, check=False)
    wall = time.perf_counter() - start
    # the folder this run made (the newest one could be an older run's: until 2026-12-06 a `--set`
    # of the output folder or name sent the run elsewhere and an old run was reported)
    made = sorted(set(out_dir.glob(f"{name}-*")) - before, key=lambda p: p.stat().st_mtime)
    if done.returncode != 0 or not made:
        raise RunFailed(f"the {mode} run failed (libra run exit {done.returncode}); see its output above")
    return made[-1], wall


class RunFailed(RuntimeError):
    pass


def _summary(run_dir: Path, wall_s: float) -> dict[str, object] | None:
    """The run's figures (None: its history has no rows)."""
    from libra_core.data.history import read_history

    h = read_history(run_dir)
    if not h:
        return None
    k = min(10, len(h))
    evals = [(r["iteration"], r["eval_accuracy"]) for r in h if r["eval_accuracy"] is not None]
    return {
        "run": run_dir.name,
        "process_wall_s": wall_s,
        "iterations_wall_s": sum(r["iteration_s"] for r in h),
        "optimizer_steps": h[-1]["policy_version"],
        "reward_first10": sum(r["reward_mean"] for r in h[:k]) / k,
        "reward_last10": sum(r["reward_mean"] for r in h[-k:]) / k,
        "eval_first": evals[0][1] if evals else None,
        "eval_last": evals[-1][1] if evals else None,
        "eval_max": max(a for _, a in evals) if evals else None,
        "max_staleness_seen": max(r["max_staleness_seen"] for r in h),
        "stale_dropped": sum(r["stale_dropped"] for r in h),
        "median_iteration_s": sorted(r["iteration_s"] for r in h)[len(h) // 2],
    }


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str], list[tuple[str, Path]]]:
    """(args, modes to run, finished runs to summarize), checked before any run starts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=positive_int, default=70)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(ROOT / "runs"), help="output folder for both runs")
    parser.add_argument(
        "--modes", default="sync,async", help="comma-separated modes to run ('' with --summarize: none)"
    )
    parser.add_argument(
        "--summarize",
        nargs="+",
        action="extend",
        default=[],
        metavar="MODE=RUN_DIR",
        help="add finished runs to the table (repeatable)",
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"--modes {args.modes!r}: unknown {bad}; valid: {', '.join(MODES)}")
    finished = []
    for item in args.summarize:
        mode, sep, run_dir = item.partition("=")
        if not sep or not mode or not run_dir:
            parser.error(f"--summarize {item!r}: expected MODE=RUN_DIR")
        if not (Path(run_dir) / "history.parquet").is_file():
            problem = folder_problem(Path(run_dir), ["history.parquet"], "run folder")
            parser.error(f"--summarize {problem}")
        finished.append((mode, Path(run_dir)))
    if not modes and not finished:
        parser.error(f"--modes {args.modes!r} names no mode and no --summarize run was given: nothing to do")
    for item in args.extra:
        key, sep, _ = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        if key.strip() in OWN_KEYS:  # the last --set wins: the run would land where none looks
            parser.error(f"--set {item!r}: this script sets {key.strip()} itself (use --out/--iterations)")
    if modes:
        sys.path.insert(0, str(ROOT))
        from flows.cli_common import output_problem

        problem = output_problem(args.out, folder=True)
        if problem:
            parser.error(f"--out {problem}")
    return args, modes, finished


def main(argv: list[str] | None = None) -> None:
    args, modes, finished = parse_args(argv)
    out = Path(args.out).expanduser().resolve()  # libra run resolves it from the repository root
    rows = []
    for mode, run_dir in finished:  # runs made earlier (process wall time unknown: reported as 0)
        summary = _summary(run_dir, 0.0)
        if summary is None:
            raise SystemExit(f"error: --summarize {run_dir}: its history has no iterations")
        rows.append((mode, summary))
    failed = None
    for mode in modes:
        try:
            run_dir, wall = _run(mode, args.iterations, args.extra, out)
        except RunFailed as err:  # the rows of the runs that finished are still printed
            failed = str(err)
            break
        summary = _summary(run_dir, wall)
        if summary is None:
            failed = f"{run_dir}: the {mode} run recorded no iterations"
            break
        rows.append((mode, summary))
    if rows:
        _print_table(rows)
    if failed is not None:
        raise SystemExit(f"error: {failed}")


def _print_table(rows: list[tuple[str, dict[str, object]]]) -> None:
    keys = list(rows[0][1])
    print("| mode | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for mode, s in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in s.values()]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print("command: " + " ".join([sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
