"""Scheduler comparison on a real exported trace and on the synthetic presets (docs/scheduling.md).

    .venv/bin/python benchmarks/trace_eval_table.py --run RUN_DIR [--out DIR]

`--run` is a run folder with a trajectory lake (the tables in docs/scheduling.md came from
`runs/arith-grpo-20261130-234855`, a local run); `--out` defaults to `/tmp/libra-traces`. Both are
checked before anything is written.

Exports the run's trajectory lake to `OUT/real.parquet`, writes the synthetic presets (seed 0) to
`OUT/<preset>.parquet`, picks buckets at the 50th and 90th percentiles of each trace's trajectory
size (nearest rank, `quantile_buckets`; the header's p50/p90 are the same), and prints one table
per trace with the equivalent `libra trace-eval` command, C-MLFQ's decision counters, and a sweep
of its re-prefill cost ratio (1e9 = never move).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from flows.cli_common import output_problem
from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.registry import scheduler_names
from libra_core.traces.evaluate import evaluate_schedulers, quantile_buckets, replay
from libra_core.traces.export import export_trace
from libra_core.traces.report import format_plain
from libra_core.traces.schema import read_trace, write_trace
from libra_core.traces.synthetic import PRESETS, synthetic_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import run_folder_problem  # noqa: E402


def table_for(name: str, path: Path) -> None:
    trace = read_trace(path)
    bounds = quantile_buckets(trace, (0.5, 0.9))
    # the header's percentiles by the buckets' own definition (nearest rank): p50/p90 are the bounds
    (p50,), (p90,) = quantile_buckets(trace, (0.5,)), quantile_buckets(trace, (0.9,))
    largest = max(t.size for t in trace)
    print(f"\n### {name}: {len(trace)} trajectories, {len({t.iteration for t in trace})} iterations, "
          f"{len({t.prompt_id for t in trace})} prompts, size p50/p90/max {p50}/{p90}/{largest}")  # fmt: skip
    print(
        f"command: libra trace-eval --trace {path} --scheduler all --buckets {','.join(map(str, bounds))}\n"
    )
    cfg = SchedulerConfig(buckets=bounds)
    print(format_plain([m.as_record() for m in evaluate_schedulers(trace, scheduler_names(), cfg)]))
    sched = CMLFQScheduler(cfg)
    replay(trace, sched, bounds, name="cmlfq")
    print(f"\ncmlfq decisions: {sched.counters}")
    sweep = []
    for ratio in (0.0, 0.1, 0.33, 1.0, 1e9):  # 1e9: no moves (admission only)
        s = CMLFQScheduler(cfg.model_copy(update={"prefill_decode_cost_ratio": ratio}))
        m = replay(trace, s, bounds, name="cmlfq")
        sweep.append(
            f"{ratio}: class {m.class_accuracy:.3f} migr {m.migration_token_ratio:.3f} score {m.score:.3f}"
        )
    print("cmlfq prefill_decode_cost_ratio sweep: " + "; ".join(sweep))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder with a trajectory lake")
    parser.add_argument(
        "--out", type=Path, default=Path("/tmp/libra-traces"), help="folder for the trace files"
    )
    args = parser.parse_args(argv)
    problem = run_folder_problem(args.run, needs=())
    if problem:
        parser.error(f"--run {problem}")
    problem = output_problem(args.out, folder=True, run_dir=args.run)
    if problem:
        parser.error(f"--out {problem}")
    args.out.mkdir(parents=True, exist_ok=True)
    traces = {f"real ({args.run.name})": export_trace(args.run, args.out / "real.parquet")}
    for preset in PRESETS:
        traces[f"synthetic {preset} (seed 0)"] = write_trace(
            synthetic_trace(random.Random(0), preset), args.out / f"{preset}.parquet"
        )
    for name, path in traces.items():
        table_for(name, path)


if __name__ == "__main__":
    main()
