"""The planner's price for one homogeneous rollout layout against the simulated rollout, per TP degree.

    .venv/bin/python benchmarks/sim_homogeneous_price.py [--scenario r2e-gym] [--rollout-gpus 24]
        [--prompts-per-iteration 32] [--queue-wait] [--capped-path] [--setting FIELD=VALUE ...]

For iteration 0 of a scenario on A800s, `greedy`'s half/half split of 2 x `rollout-gpus` GPUs with every
TP degree in turn (`rollout-gpus / tp` instances, one bucket; until 2026-12-02 the simulated layout
always had 24 rollout GPUs, whatever `--rollout-gpus` said): the simulated rollout time, and the segment
table's critical path, work per instance and group time (max of the two) for the same layout, the price
`homogeneous_tp` and the planner compare layouts by. A planner that prices well ranks the degrees as the
simulator does. The last columns price the same instances by the heterogeneous search's DP restricted
to that one degree (`assignment.solve` on a one-degree table: several length ranges, each at its own
batch), which is how the DP prices a one-degree layout that it finds.

The segment table prices the critical path as the planner and the simulator do: in two phases
(`SearchSettings.two_phase_path`, `SimSettings.two_phase_path`, on by default since 2026-12-04).
`--capped-path` (or `--setting two_phase_path=false`) prices it at the KV-capped batch for its whole
life, the price before then. `--two-phase` is accepted for older commands and changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

from libra_core.planner.assignment import solve
from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table, instance_tp_degrees
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim import policies
from libra_core.sim.engine import Simulator
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import SCENARIOS, ScenarioWorkload

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import add_overrides, positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument("--rollout-gpus", type=positive_int, default=24, help="greedy's half of 48 GPUs")
    ap.add_argument("--prompts-per-iteration", type=positive_int, default=None)
    ap.add_argument(
        "--queue-wait", action="store_true", help="price the queue wait (SearchSettings.queue_wait)"
    )
    ap.add_argument(
        "--capped-path",
        action="store_true",
        help="price the critical path at the KV-capped batch for its whole life, not in two phases "
        "as the planner does by default (SearchSettings.two_phase_path)",
    )
    ap.add_argument(
        "--two-phase",
        action="store_true",
        help="no effect: the two-phase critical path is the default (kept so older commands run)",
    )
    add_overrides(ap, spec=False)
    args = ap.parse_args(argv)
    if args.two_phase and args.capped_path:
        ap.error("--two-phase (the default) and --capped-path contradict each other")
    try:
        settings = SimSettings(**parse_overrides(args.setting, SimSettings, "--setting"))
        spec = SCENARIOS[args.scenario]
        if args.prompts_per_iteration is not None:
            spec = replace(spec, prompts_per_iteration=args.prompts_per_iteration)
        wl = ScenarioWorkload(spec, 100, 0)
    except ValueError as err:
        ap.error(str(err))
    cluster = parse_cluster("48xA800")
    model = get_model(wl.model)
    greedy = policies.resolve_policies(["greedy"])[0]
    path = "capped path" if args.capped_path or not settings.two_phase_path else "two-phase path"
    print(f"{args.scenario}, {spec.prompts_per_iteration} prompts x {spec.group_size}, iteration 0, {path}")
    cols = (
        "layout",
        "simulated rollout s",
        "critical path s",
        "work / instances s",
        "group time s",
        "price / sim",
        "one-degree DP s",
        "DP / sim",
    )
    print("| " + " | ".join(cols) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for tp in instance_tp_degrees(model, cluster.hardware):
        n = args.rollout_gpus // tp
        if n < 1:
            continue
        # greedy builds its layout with homogeneous_tp: force the degree under test.
        with mock.patch.object(policies, "homogeneous_tp", lambda *a, tp=tp, **k: tp):
            # greedy gives rollout half the cluster: a cluster of twice `rollout_gpus` gives it those.
            sim = Simulator(greedy, wl, model, cluster.hardware, 2 * args.rollout_gpus, 1, settings)
        rec = sim.run().records[0]
        simulated = rec.rollout_end_s - rec.rollout_start_s
        cost = RolloutCostModel(model, sim.hw, sim.search.max_num_seqs)  # with the settings' overheads
        table = build_segment_table(
            cost,
            sim.workload_of(0),
            (tp,),
            sim.search.num_bins,
            args.rollout_gpus,
            queue_wait=args.queue_wait,
            two_phase=sim.search.two_phase_path and not args.capped_path,  # the planner's price
        )
        k, m = table.num_bins, min(n, table.max_instances) - 1
        crit, work = float(table.crit_s[0, m, 0, k]), float(table.work_s[0, m, 0, k]) / n
        group = table.group_time_s(0, n, 0, k)
        dp = solve(table, n * tp, 1e-3, True, False)
        dp_s = dp.makespan_s if dp is not None else float("inf")
        print(
            f"| {n}xTP{tp} | {simulated:,.0f} | {crit:,.0f} | {work:,.0f} | {group:,.0f} | "
            f"{group / simulated:.2f} | {dp_s:,.0f} | {dp_s / simulated:.2f} |"
        )


if __name__ == "__main__":
    main()
