"""What the planner chooses as the workload's length distribution drifts longer.

Usage: python benchmarks/planner_drift.py [--cluster 48xA800] [--model qwen3-14b]
       [--workload search-medium] [--staleness 1] [--mixed-margin 0.05]

Scales the generated and tool-reply lengths of a preset (x0.25 ... x4, same seed) and prints, per
step, the mean/p90 trajectory length, the split, the rollout instance TP multiset and the predicted
times. A last column replays the replanning policy (defaults of stages.yaml: 5% hysteresis, 50
iterations, 60 s move cost) from the previous row's plan. The search ranks mixed-TP layouts with
stages.yaml's `planner.mixed_margin` unless `--mixed-margin` says otherwise (0: by price alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from libra_core.planner import workload_preset  # noqa: E402
from libra_core.planner.replan import ReplanPolicy  # noqa: E402
from libra_core.planner.reprice import evaluate_plan  # noqa: E402
from libra_core.planner.search import (  # noqa: E402
    DEFAULT_MIXED_MARGIN,
    SearchSettings,
    search_plans,
)
from libra_core.planner.specs import get_model, parse_cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import non_negative_int  # noqa: E402

SCALES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="48xA800")
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--workload", default="search-medium")
    parser.add_argument("--staleness", type=non_negative_int, default=1)
    parser.add_argument("--mixed-margin", type=float, default=DEFAULT_MIXED_MARGIN)
    args = parser.parse_args(argv)
    if not 0.0 <= args.mixed_margin < 1.0:
        parser.error(f"--mixed-margin must be in [0, 1), got {args.mixed_margin}")
    try:
        cluster, model = parse_cluster(args.cluster), get_model(args.model)
        workload_preset(args.workload)
    except (ValueError, KeyError) as err:
        parser.error(str(err))
    settings = SearchSettings(staleness=args.staleness, mixed_margin=args.mixed_margin)
    policy = ReplanPolicy()
    base = workload_preset(args.workload)
    print(f"{cluster.label} {model.name} {args.workload} staleness {args.staleness}")
    print(
        "| scale | mean len | p90 len | train GPUs (layout) | rollout GPUs | instances | T_train s | "
        "T_rollout s | T_iter s | tok/s | replan from previous row |"
    )
    print("|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|")
    previous = None
    for scale in SCALES:
        w = base.scaled(scale)
        st = w.stats()
        plans = search_plans(model, cluster.hardware, cluster.num_gpus, w, settings)
        if not plans:
            print(f"| x{scale:g} | {st['mean_len']:.0f} | {st['p90_len']:.0f} | no feasible plan |")
            continue
        p = plans[0]
        decision = "-"
        if previous is not None:
            now = evaluate_plan(previous, model, cluster.hardware, w, settings)
            d = policy.decide(0, previous, now, p, w)
            decision = f"{d.action}: {d.reason}"
            previous = p if d.action == "apply" else now
        else:
            previous = p
        tps = " ".join(f"{n}xTP{t}" for t, n in p.instance_tps.items())
        idle = f" ({p.idle_rollout_gpus} idle)" if p.idle_rollout_gpus else ""
        print(
            f"| x{scale:g} | {st['mean_len']:.0f} | {st['p90_len']:.0f} "
            f"| {p.train_gpus} ({p.train.layout.label()}) "
            f"| {p.rollout_gpus}{idle} | {tps} | {p.t_train_s:.1f} | {p.t_rollout_s:.1f} | {p.t_iter_s:.1f} "
            f"| {p.tokens_per_s:,.0f} | {decision} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
