"""How a running mixed-TP plan is re-priced on new windows: with its own instances (what runs) and
with the counts the assignment DP would choose anew on the same degrees (the re-price until
2026-12-07).

Usage: python benchmarks/planner_reprice.py [--cluster 48xA800] [--model qwen3-14b]
       [--plan-on swe-longtail] [--windows search-medium math-short swe-longtail] [--staleness 0]

Plans on the preset `--plan-on` (seed 0), then re-prices that plan on each window preset (seed 1)
and prints, per window, the instances and rollout seconds both ways.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra_core.planner import workload_preset  # noqa: E402
from libra_core.planner.assignment import solve  # noqa: E402
from libra_core.planner.reprice import evaluate_plan  # noqa: E402
from libra_core.planner.rollout_cost import RolloutCostModel  # noqa: E402
from libra_core.planner.search import (  # noqa: E402
    DEFAULT_MIXED_MARGIN,
    SearchSettings,
    search_plans,
    segment_table,
)
from libra_core.planner.specs import get_model, parse_cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import non_negative_int  # noqa: E402


def _multiset(tps: dict[int, int]) -> str:
    return " ".join(f"{n}xTP{tp}" for tp, n in sorted(tps.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="48xA800")
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--plan-on", default="swe-longtail")
    ap.add_argument("--windows", nargs="+", default=["search-medium", "math-short", "swe-longtail"])
    ap.add_argument("--staleness", type=non_negative_int, default=0)
    args = ap.parse_args(argv)
    try:
        cluster, model = parse_cluster(args.cluster), get_model(args.model)
        for name in (args.plan_on, *args.windows):
            workload_preset(name)
    except (ValueError, KeyError) as err:
        ap.error(str(err))
    hw = cluster.hardware
    s = SearchSettings(staleness=args.staleness, mixed_margin=DEFAULT_MIXED_MARGIN)
    plans = search_plans(model, hw, cluster.num_gpus, workload_preset(args.plan_on, seed=0), s)
    if not plans:
        ap.error(f"no plan fits {args.model} on {args.cluster}")
    plan = plans[0]
    print(f"{args.cluster} {args.model} staleness {args.staleness}: planned on {args.plan_on} (seed 0)")
    print(
        f"running rollout: {plan.rollout_gpus} GPUs, {_multiset(plan.instance_tps)}, {plan.t_rollout_s:.1f} s"
    )
    print(
        "| window (seed 1) | re-priced: running instances | rollout s "
        "| DP's own counts (until 2026-12-07) | rollout s |"
    )
    print("|---|---|---:|---|---:|")
    tps = tuple(sorted(plan.instance_tps))
    for name in args.windows:
        w = workload_preset(name, seed=1)
        now = evaluate_plan(plan, model, hw, w, s)
        table = segment_table(RolloutCostModel(model, hw, s.max_num_seqs), w, tps, plan.rollout_gpus, s)
        free = solve(table, plan.rollout_gpus, s.rel_tol, s.monotone_tp, s.one_range_per_degree)
        free_s = f"{free.makespan_s:.1f}" if free else "inf"
        free_tps = _multiset(free.instance_tps()) if free else "-"
        print(
            f"| {name} | {_multiset(now.instance_tps)} | {now.rollout.makespan_s:.1f} "
            f"| {free_tps} | {free_s} |"
        )


if __name__ == "__main__":
    main()
