"""Scheduler comparison on a real exported trace and on the synthetic presets (docs/scheduling.md).

    .venv/bin/python benchmarks/trace_eval_table.py [--run RUN_DIR] [--out DIR]

Defaults: `--run runs/arith-grpo-20261130-234855 --out /tmp/libra-traces`.

Exports the run's trajectory lake to `OUT/real.parquet`, writes the synthetic presets (seed 0) to
`OUT/<preset>.parquet`, picks buckets at the 50th and 90th percentiles of each trace's trajectory
size, and prints one table per trace with the equivalent `libra trace-eval` command, C-MLFQ's
decision counters, and a sweep of its re-prefill cost ratio (1e9 = never move).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.registry import scheduler_names
from libra_core.traces.evaluate import evaluate_schedulers, quantile_buckets, replay
from libra_core.traces.export import export_trace
from libra_core.traces.report import format_plain
from libra_core.traces.schema import read_trace, write_trace
from libra_core.traces.synthetic import PRESETS, synthetic_trace


def table_for(name: str, path: Path) -> None:
    trace = read_trace(path)
    bounds = quantile_buckets(trace, (0.5, 0.9))
    sizes = sorted(t.size for t in trace)
    print(f"\n### {name}: {len(trace)} trajectories, {len({t.iteration for t in trace})} iterations, "
          f"{len({t.prompt_id for t in trace})} prompts, size p50/p90/max {sizes[len(sizes) // 2]}/"
          f"{sizes[int(0.9 * len(sizes))]}/{sizes[-1]}")  # fmt: skip
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=Path, default=Path("runs/arith-grpo-20261130-234855"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/libra-traces"))
    args = parser.parse_args()
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
