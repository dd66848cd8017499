"""The default experiment with `pipeline.mode: sync` and `async`, one after the other, compared.

    .venv/bin/python benchmarks/async_vs_sync.py [--iterations 70] [--modes sync,async] [--set KEY=VALUE ...]

Each mode runs through `libra run stages.yaml` (a subprocess, so each has its own engines) with the
same seed and the same cached warm-up; the script then reads both histories and prints, per mode:
wall time of the run (first iteration start to last iteration end, from the history), optimizer
steps (= policy versions), mean training reward of the first and last 10 iterations, the greedy
evaluation curve, the staleness actually seen, and what the staleness bound dropped. Run it on an
otherwise idle machine: both modes share the same 2 cores with anything else running.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.perf_counter() - start
    runs = sorted(out_dir.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1], wall


def _summary(run_dir: Path, wall_s: float) -> dict[str, object]:
    from libra_core.data.history import read_history

    h = read_history(run_dir)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=70)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(ROOT / "runs"), help="output folder for both runs")
    parser.add_argument("--modes", default="sync,async", help="comma-separated modes to run")
    parser.add_argument(
        "--summarize", nargs="*", default=[], metavar="MODE=RUN_DIR", help="add finished runs to the table"
    )
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for item in args.summarize:  # runs made earlier (process wall time unknown: reported as 0)
        mode, run_dir = item.split("=", 1)
        rows.append((mode, _summary(Path(run_dir), 0.0)))
    for mode in [m for m in args.modes.split(",") if m]:
        run_dir, wall = _run(mode, args.iterations, args.extra, out)
        rows.append((mode, _summary(run_dir, wall)))
    keys = list(rows[0][1])
    print("| mode | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for mode, s in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in s.values()]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print("command: " + " ".join([sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
