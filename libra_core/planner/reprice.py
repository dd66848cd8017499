"""Re-pricing a running plan on a new workload: the price a replan compares a proposal with, and
the prediction the online stage correction learns from.

The plan's resources stay (split, training groups, rollout instances); what moves without
restarting anything is chosen again (length ranges, ZeRO stage, recompute, micro-batch). Called by
the live planner (`service.py`, per observed iteration and per replan) and the simulator's replans.
"""

from __future__ import annotations

import math

from libra_core.planner.fixed_counts import solve_counts
from libra_core.planner.iteration import iteration_time_s
from libra_core.planner.rollout_cost import RolloutCostModel, instance_tp_degrees
from libra_core.planner.search import (
    Plan,
    SearchSettings,
    assign_rollout,
    bucket_count,
    one_bucket_settings,
    rollout_spread,
    segment_table,
)
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.spread import balanced_groups_factor
from libra_core.planner.train_cost import (
    TrainEstimate,
    TrainLayout,
    TrainShape,
    enumerate_layouts,
    estimate_train,
)
from libra_core.planner.workload import Workload


def best_same_topology(
    model: ModelSpec, hw: HardwareSpec, layout: TrainLayout, shape: TrainShape
) -> TrainEstimate:
    """The fastest feasible layout with `layout`'s TP/PP/DP/EP groups (what changes without moving
    a GPU: ZeRO stage, recompute, micro-batch); `layout`'s own estimate when none is feasible."""
    groups = (layout.tp, layout.pp, layout.dp, layout.ep)
    best = estimate_train(model, hw, layout, shape)
    for cand in enumerate_layouts(model, hw, layout.num_gpus):
        if (cand.tp, cand.pp, cand.dp, cand.ep) != groups:
            continue
        est = estimate_train(model, hw, cand, shape)
        if est.feasible and (not best.feasible or est.time_s < best.time_s):
            best = est
    return best


def evaluate_plan(
    plan: Plan, model: ModelSpec, hw: HardwareSpec, workload: Workload, settings: SearchSettings | None = None
) -> Plan:
    """Re-price an existing plan's resources (split, layout, instance multiset) on a new workload.

    Rollout keeps its instances (how many of each TP degree run); the length ranges they serve are
    chosen again (`fixed_counts.solve_counts`; a degree that no length needs is left out of the
    returned assignment, its instances idle), or, with `SearchSettings.homogeneous`, the one degree
    is priced on every length again. The re-chosen ranges are a bound: a kept plan keeps routing
    by its old ranges. Until 2026-12-07 the search's DP re-chose the counts too, so the re-priced
    plan could be another layout (still so with `monotone_tp` off, which the count DP does not
    cover).
    Training keeps its TP/PP/DP/EP groups but may change what needs no GPU to move (ZeRO stage,
    recompute, micro-batch size), e.g. when longer sequences no longer fit; if nothing fits, the
    plan prices at infinity.
    """
    s = settings or SearchSettings()
    if not s.homogeneous and bucket_count(plan.rollout) == 1:
        # Priced as search_plans prices a one-bucket layout: one range, no promotion (what the
        # router runs: groups of one degree merge into one bucket). The DP's several ranges on one
        # degree priced it cheaper than the search had (search-medium, 9xTP4: 137.9 s, not 167.0 s;
        # until 2026-12-06, unless `promote`), so a run measuring exactly the predicted time taught
        # the correction a factor of 1.135 (tests/planner/test_planner_reprice.py on the old code),
        # and replan decisions compared a proposal with a current plan priced too cheaply.
        s = one_bucket_settings(s)
    cost = RolloutCostModel(model, hw, s.max_num_seqs)
    tps = tuple(sorted(plan.instance_tps))
    table = segment_table(cost, workload, tps, plan.rollout_gpus, s)
    if s.homogeneous or not s.monotone_tp:
        assignment = assign_rollout(table, plan.rollout_gpus, s)
    else:  # the running instances: only the length ranges move (fixed_counts.py)
        assignment = solve_counts(table, plan.instance_tps, s.rel_tol, s.one_range_per_degree)
    shape = TrainShape.from_workload(workload, s.ref_forward)
    est = best_same_topology(model, hw, plan.train.layout, shape)
    f_r, f_t = s.corrections.get("rollout", 1.0), s.corrections.get("update", 1.0)
    spread = rollout_spread(cost, workload, instance_tp_degrees(model, hw), s)  # as search_plans prices it
    t_r = (
        assignment.makespan_s * balanced_groups_factor(bucket_count(assignment), spread)
        if assignment
        else math.inf
    ) * f_r
    t_t = est.time_s * f_t if est.feasible else math.inf
    t_iter = iteration_time_s(t_r, t_t, plan.t_sync_s, s.staleness, plan.colocated, spread, s.sync_overlaps)
    return Plan(
        plan.num_gpus,
        plan.train_gpus,
        plan.rollout_gpus,
        est,
        assignment or plan.rollout,
        t_t,
        t_r,
        plan.t_sync_s,
        t_iter,
        s.staleness,
        shape.tokens,
        plan.colocated,
        tuple(float(x) for x in table.bin_max_len),
    )


__all__ = ["best_same_topology", "evaluate_plan"]
