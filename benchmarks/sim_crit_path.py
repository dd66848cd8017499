"""Where the planner's critical-path price for a rollout differs from the simulator's rollout time.

    .venv/bin/python benchmarks/sim_crit_path.py [--scenario r2e-gym] [--tp 8 --instances 4] [--capped-path]

For iteration 0 of a scenario on 48xA800, with `+planning`'s split: the simulated rollout time of
the homogeneous layout (`+planning`) and of the planner's hetero plan under perfect routing
(`oracle-routing`); the segment table's homogeneous price max(critical path, work / instances);
the exact slowest trajectory at the range's full-concurrency decode step, split into its decode,
prefill (payloads plus the planner's re-prefill share) and tool parts; and the bound the table
uses (gen, prefill and tool maxima taken independently); and the decode step at the table's active
batch, the per-instance share, the whole range on one instance and one sequence.

The segment table prices the critical path as the planner does (`SearchSettings.two_phase_path`,
on by default since 2026-12-04: loaded, then alone); `--capped-path` prices it at the KV-capped
batch for its whole life, the price before then.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table, instance_tp_degrees
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.workloads import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", help="a scenario name or a trace .parquet path")
    ap.add_argument("--tp", type=positive_int, default=8, help="TP degree of the priced instances")
    ap.add_argument("--instances", type=positive_int, default=4, help="instances of that degree")
    ap.add_argument(
        "--capped-path",
        action="store_true",
        help="price the critical path at the KV-capped batch for its whole life, not in two phases "
        "as the planner does by default (SearchSettings.two_phase_path)",
    )
    args = ap.parse_args(argv)
    cluster = parse_cluster("48xA800")
    try:
        wl = load_scenario(args.scenario, 100, 0)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    model = get_model(wl.model)
    degrees = instance_tp_degrees(model, cluster.hardware)
    if args.tp not in degrees:
        ap.error(
            f"--tp {args.tp}: {model.name} on {cluster.hardware.name} shards over TP {list(degrees)} only"
        )
    if args.tp * args.instances > cluster.num_gpus:  # was priced, "work/instances 0 s" on 800 GPUs
        ap.error(
            f"--instances {args.instances}: {args.instances} TP{args.tp} instances need "
            f"{args.tp * args.instances} GPUs; the cluster has {cluster.num_gpus}"
        )
    sims = {}
    for name in ("+planning", "oracle-routing"):
        sim = Simulator(resolve_policies([name])[0], wl, model, cluster.hardware, cluster.num_gpus, 1)
        rec = sim.run().records[0]
        sims[name] = sim
        print(
            f"{name:15s} {sim.dep.label()}: simulated rollout {rec.rollout_end_s - rec.rollout_start_s:.0f} s"
        )
    sim = sims["+planning"]
    w = sim.workload_of(0)
    cost = RolloutCostModel(model, cluster.hardware, sim.search.max_num_seqs)
    tp, n = args.tp, args.instances
    two_phase = sim.search.two_phase_path and not args.capped_path  # the planner's price by default
    table = build_segment_table(cost, w, (tp,), sim.search.num_bins, tp * n, two_phase=two_phase)
    k, m = table.num_bins, min(n, table.max_instances) - 1
    crit, work = float(table.crit_s[0, m, 0, k]), float(table.work_s[0, m, 0, k]) / n
    print(
        f"segment table ({'two-phase' if two_phase else 'capped'} path), TP{tp} x{n} for every length: "
        f"critical path {crit:.0f} s, "
        f"work/instances {work:.0f} s"
    )
    g, pre, lat = w.gen_tokens, w.prefill_tokens, w.tool_latency_s
    life_ctx = w.prompt_tokens + (g + w.payload_tokens) / 2
    dec_ctx = float((g * life_ctx).sum() / g.sum())
    batch = cost.concurrency(tp, float(life_ctx.mean()), len(g) * w.weight / n)
    step = float(cost.decode_step_s(tp, np.asarray(batch), np.asarray(dec_ctx)))
    per_tok = float(cost.prefill_s_per_token(tp, np.asarray(dec_ctx)))
    path = step * g + per_tok * pre + lat
    i = int(np.argmax(path))
    print(
        f"exact slowest trajectory at batch {float(batch):.0f} per instance "
        f"(decode step {step * 1e3:.1f} ms): "
        f"{path[i]:.0f} s = "
        f"decode {step * g[i]:.0f} s ({g[i]:.0f} tokens) + prefill {per_tok * pre[i]:.0f} s "
        f"({pre[i]:,.0f} tokens) + tools {lat[i]:.0f} s"
    )
    bound = step * g.max() + per_tok * pre.max() + lat.max()
    print(f"independent maxima (gen, prefill, tools): {bound:.0f} s")
    # The decode step at the batch the table prices the range with on n instances (the share of
    # each instance's trajectories not waiting on a tool), at the whole per-instance share, at the
    # whole range on one instance (what the table used before 2026-12), and at one sequence.
    r = len(g) * w.weight
    active = cost.active_batch(tp, r / n, g.mean(), pre.mean(), lat.mean(), dec_ctx, float(life_ctx.mean()))
    whole = cost.concurrency(tp, float(life_ctx.mean()), r)
    rows = (
        ("active per instance (table)", active),
        ("in flight per instance", batch),
        ("whole range on one instance", whole),
        ("one sequence", 1.0),
    )
    for label, b in rows:
        ms = float(cost.decode_step_s(tp, np.asarray(b), np.asarray(dec_ctx))) * 1e3
        print(f"decode step at {label} batch {float(b):.0f}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
