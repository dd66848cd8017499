"""Plan search: split a GPU budget between training and rollout and pick both sides' layouts.

For every candidate split (train GPUs N_t, rollout GPUs N_r = G - N_t):
- rollout: T_rollout(N_r) from the assignment DP's frontier over makespans (assignment.py), which
  chooses the instance TP multiset and the length ranges each group serves; refined exactly by
  bisection for the plans returned (with `SearchSettings.homogeneous`, one TP degree on every
  rollout GPU instead, priced exactly per split and degree);
- training: the fastest memory-feasible layout on N_t GPUs (train_cost.enumerate_layouts), skipped
  without evaluating layouts when even the compute-only lower bound cannot beat the best plan.

The objective is the steady-state iteration time for a staleness bound s (iteration.py).
Stage correction factors (calibration.StageCorrection) multiply T_rollout and T_train.
`SearchSettings.promote` prices the routing that promotes requests as they grow (rollout_cost.py)
and `one_range_per_degree` gives each TP degree one length range (assignment.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from libra_core.planner.assignment import (
    Assignment,
    SegmentTable,
    frontier,
    homogeneous,
    homogeneous_dp,
    one_degree,
    solve,
)
from libra_core.planner.iteration import iteration_time_s, weight_sync_s
from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table, instance_tp_degrees
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.spread import Spread, balanced_groups_factor, estimate_spread
from libra_core.planner.train_cost import (
    TrainEstimate,
    TrainLayout,
    TrainShape,
    enumerate_layouts,
    estimate_train,
    train_lower_bound_s,
)
from libra_core.planner.workload import Workload

log = logging.getLogger(__name__)


# The mixed-layout margin the run's planner (planner.mixed_margin), the simulator and `libra plan`
# use by default; a bare SearchSettings ranks by price alone (see SearchSettings.mixed_margin).
DEFAULT_MIXED_MARGIN = 0.05


@dataclass(frozen=True)
class SearchSettings:
    staleness: int = 0
    max_num_seqs: int = 256
    # The update also runs a frozen reference model's forward (GRPO with kl_coef > 0): +1/3 of the
    # training FLOPs (train_cost.iteration_flops), and its bf16 weights to each GPU's memory
    # (memory.train_memory).
    ref_forward: bool = False
    num_bins: int = 48
    top_k: int = 4  # plans returned (best first)
    rel_tol: float = 1e-3
    corrections: dict[str, float] = field(default_factory=dict)  # stage -> factor
    monotone_tp: bool = True  # longer length ranges never get a smaller TP degree (assignment.py)
    # Each TP degree serves one contiguous length range, i.e. one router bucket per degree (how the
    # simulator deploys a plan: neighbouring groups of one degree merge). Off, the DP may price
    # several ranges of one degree apart, each at its own batch, which one bucket does not run.
    one_range_per_degree: bool = False
    # One TP degree on every rollout GPU, every length in one bucket (assignment.homogeneous): the
    # layouts a system without heterogeneous instances can deploy (verl, AReaL). The search then
    # prices each (split, TP) exactly instead of running the DP.
    homogeneous: bool = False
    # With `homogeneous`: price each degree's layout by the DP restricted to that degree (several
    # length ranges in one bucket, `assignment.homogeneous_dp`) instead of as one range.
    one_degree_dp: bool = False
    # Price the routing that promotes requests from the shortest bucket as their context grows
    # (mlfq; C-MLFQ when its tree is unsure) instead of admitting each to the range of its final
    # length (`build_segment_table(promote=...)`). Off: the planner's documented figures assume
    # length-aware admission.
    promote: bool = False
    # Plan for the expected iteration under the workload's iteration-to-iteration spread
    # (spread.py; needs `Workload.group_index`), not for the mean workload: a balanced plan then
    # pays for the iterations that run long. Off: the planner's documented figures plan for the mean.
    plan_for_spread: bool = False
    # Price the wait of a range's slowest trajectory queued behind others when the KV cache holds
    # fewer than an instance is given (`build_segment_table(queue_wait=...)`); a what-if, off.
    queue_wait: bool = False
    # Price the critical path in two phases: at the loaded pace (batch, others' prefills, the KV
    # cache's queue) while an instance works through its share, then at one sequence's pace
    # (`build_segment_table(two_phase=...)`). Off: the whole path at the KV-capped batch, the
    # planner's price until the fifteenth session (2026-12-04), flat in the instance count under load.
    two_phase_path: bool = True
    # A layout of several router buckets (mixed TP degrees) ranks ahead of a one-bucket layout only
    # when it is priced faster by more than this share. The mixed price is the less reliable one
    # (the router's spill and migrations run differently from the ranges the DP prices), and the
    # one-bucket layout migrates nothing; within the planner's error the simpler plan is the safer
    # bet, as the replan hysteresis treats a move. 0: rank by price alone. Plan times are unchanged.
    mixed_margin: float = 0.0
    # The weight sync overlaps the rollout (iteration.py): the simulator's pipeline. Off: the
    # runtime's, whose engines pause to reload the weights (`T_rollout + T_sync` on that side).
    sync_overlaps: bool = False


@dataclass(frozen=True)
class Plan:
    """One candidate: the split, both sides' layouts and the predicted times."""

    num_gpus: int
    train_gpus: int
    rollout_gpus: int
    train: TrainEstimate
    rollout: Assignment
    t_train_s: float
    t_rollout_s: float
    t_sync_s: float
    t_iter_s: float
    staleness: int
    tokens_per_iteration: float
    colocated: bool = False
    bin_max_len: tuple[float, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iteration / self.t_iter_s

    @property
    def idle_rollout_gpus(self) -> int:
        """Rollout GPUs the assignment leaves unused (the long tail bounds the makespan)."""
        return self.rollout_gpus - self.rollout.gpus if not self.colocated else 0

    @property
    def instance_tps(self) -> dict[int, int]:
        return self.rollout.instance_tps()

    def same_resources(self, other: Plan) -> bool:
        """Same split, training layout and instance multiset: the same plan but for its prices."""
        return (
            self.train_gpus == other.train_gpus
            and self.train.layout == other.train.layout
            and self.instance_tps == other.instance_tps
        )

    def same_gpu_groups(self, other: Plan) -> bool:
        """Same split, training parallel groups (TP/PP/DP/EP) and instance multiset: switching moves
        no worker. ZeRO stage, recompute and micro-batch size may differ: the next update just runs
        with the other settings."""
        a, b = self.train.layout, other.train.layout
        return (
            self.train_gpus == other.train_gpus
            and (a.tp, a.pp, a.dp, a.ep) == (b.tp, b.pp, b.dp, b.ep)
            and self.instance_tps == other.instance_tps
        )


# Among plans with (nearly) equal T_iter prefer less busy time, so GPUs a side cannot use go to the
# other side instead of idling behind the bottleneck.
TIE_BREAK = 1e-3


def plan_rank(plan: Plan) -> float:
    return plan.t_iter_s + TIE_BREAK * (plan.t_rollout_s + plan.t_train_s)


def best_train(model: ModelSpec, hw: HardwareSpec, num_gpus: int, shape: TrainShape) -> TrainEstimate | None:
    best: TrainEstimate | None = None
    for layout in enumerate_layouts(model, hw, num_gpus):
        est = estimate_train(model, hw, layout, shape)
        if est.feasible and (best is None or est.time_s < best.time_s):
            best = est
    return best


def _split_candidates(total: int, gpus_per_node: int) -> list[int]:
    step = 1 if total <= 64 else max(1, min(gpus_per_node, 2 ** int(math.log2(total / 64))))
    return list(range(step, total, step))


def search_plans(
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    workload: Workload,
    settings: SearchSettings | None = None,
) -> list[Plan]:
    """Best plans for `num_gpus` devices, fastest first ([] when nothing fits)."""
    s = settings or SearchSettings()
    cost = RolloutCostModel(model, hw, s.max_num_seqs)
    tps = instance_tp_degrees(model, hw)
    table = segment_table(cost, workload, tps, num_gpus, s)
    shape = TrainShape.from_workload(workload, s.ref_forward)
    spread = rollout_spread(cost, workload, tps, s)
    colocated = num_gpus == 1
    t_sync = weight_sync_s(model, hw, colocated)
    if colocated:
        f_r, f_t = s.corrections.get("rollout", 1.0), s.corrections.get("update", 1.0)
        single = _colocated_plan(model, hw, workload, shape, table, t_sync, f_r, f_t, s)
        return [single] if single else []
    if not np.isfinite(table.crit_s).any():
        return []
    # The heterogeneous search returns mixed layouts only (below), so it refines the best splits
    # whose DP layout is mixed, not the best splits and then drops their one-degree layouts: when
    # the DP's top splits were all one degree, no mixed plan was priced at all (until 2026-12-07).
    mixed_only = None if s.homogeneous else _is_mixed
    plans = _search_splits(model, hw, num_gpus, s, table, shape, t_sync, spread, mixed_only)
    if not s.homogeneous:
        # Balanced groups end with the slowest of them (balanced_groups_factor), so a one-degree
        # layout may be expected faster; the split ranking by the DP's price need not surface its
        # best split, so search the one-degree layouts too (same spread). The margin needs them
        # too: it compares the mixed layouts with the best one-bucket one.
        one = one_bucket_settings(s)
        # A one-bucket layout is priced by the one-bucket search alone: the DP's several ranges on
        # one degree run as one least-load bucket (the router merges them), and priced it cheaper
        # (until 2026-12-06; evaluate_plan re-prices such a plan as one range too).
        if s.promote:
            # A one-bucket layout has no longer bucket to promote to: it runs as admission by
            # final length does, so price it (and only the one-bucket search) without promotion.
            table = segment_table(cost, workload, tps, num_gpus, one)
        plans += _search_splits(model, hw, num_gpus, one, table, shape, t_sync, spread)
    assert 0.0 <= s.mixed_margin < 1.0, f"mixed_margin must be in [0, 1), got {s.mixed_margin}"
    plans.sort(key=lambda p: _margin_rank(p, s.mixed_margin))
    # The DP and the one-bucket search can both return one plan's resources (priced apart): list
    # each once, at its better rank.
    return [p for i, p in enumerate(plans) if not any(p.same_resources(q) for q in plans[:i])]


def segment_table(
    cost: RolloutCostModel, workload: Workload, tps: tuple[int, ...], max_gpus: int, s: SearchSettings
) -> SegmentTable:
    """The segment table the settings price rollout with (`rollout_cost.build_segment_table`)."""
    return build_segment_table(
        cost,
        workload,
        tps,
        s.num_bins,
        max_gpus,
        promote=s.promote,
        queue_wait=s.queue_wait,
        two_phase=s.two_phase_path,
    )


def one_bucket_settings(s: SearchSettings) -> SearchSettings:
    """The settings a heterogeneous search prices its one-bucket (one TP degree) layouts with."""
    return replace(s, homogeneous=True, promote=False)


def _margin_rank(plan: Plan, mixed_margin: float) -> float:
    """`plan_rank`, with a layout of several buckets ranked as if `mixed_margin` slower."""
    return plan_rank(plan) / (1.0 - mixed_margin) if bucket_count(plan.rollout) > 1 else plan_rank(plan)


def _search_splits(
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    s: SearchSettings,
    table: SegmentTable,
    shape: TrainShape,
    t_sync: float,
    spread: Spread | None,
    keep: Callable[[Assignment], bool] | None = None,
) -> list[Plan]:
    """The plans of the `s.top_k` best splits (unsorted) whose rollout layout, by `assign_rollout`
    on `table`, passes `keep` (every layout when None). Splits are refined in order of a lower
    bound on their objective and the walk stops once no later split can enter the top `top_k`; the
    objective prices rollout by the DP's frontier, a lower bound on any layout `keep` passes."""
    f_r, f_t = s.corrections.get("rollout", 1.0), s.corrections.get("update", 1.0)
    rollout_s = _rollout_frontier(table, s)
    bounds: list[tuple[float, int, float]] = []
    for n_train in _split_candidates(num_gpus, hw.gpus_per_node):
        t_r = rollout_s(num_gpus - n_train) * f_r
        if not math.isfinite(t_r):
            continue
        bound = train_lower_bound_s(model, hw, n_train, shape) * f_t
        # E[max] grows with either mean (each spread is relative), so the bound still prunes.
        lower = iteration_time_s(
            t_r, bound, t_sync, s.staleness, spread=spread, sync_overlaps=s.sync_overlaps
        ) + TIE_BREAK * (t_r + bound)
        bounds.append((lower, n_train, t_r))
    bounds.sort(key=lambda b: (b[0], b[1]))
    kept: list[tuple[float, int, TrainEstimate, Assignment]] = []
    searched = 0
    for lower, n_train, t_r in bounds:
        if len(kept) >= s.top_k and lower >= kept[s.top_k - 1][0]:
            break  # sorted by the bound: no later split beats the top_k-th kept one
        est = best_train(model, hw, n_train, shape)
        if est is None:
            continue
        searched += 1
        obj = iteration_time_s(
            t_r, est.time_s * f_t, t_sync, s.staleness, spread=spread, sync_overlaps=s.sync_overlaps
        ) + TIE_BREAK * (t_r + est.time_s * f_t)
        if len(kept) >= s.top_k and obj >= kept[s.top_k - 1][0]:
            continue
        assignment = assign_rollout(table, num_gpus - n_train, s)
        if assignment is None or (keep is not None and not keep(assignment)):
            continue
        kept.append((obj, n_train, est, assignment))
        kept.sort(key=lambda c: (c[0], c[1]))
    plans = []
    for _, n_train, est, assignment in kept[: s.top_k]:
        t_r = assignment.makespan_s * f_r * balanced_groups_factor(bucket_count(assignment), spread)
        t_t = est.time_s * f_t
        plans.append(_plan(num_gpus, n_train, est, assignment, t_r, t_t, t_sync, spread, s, shape, table))
    log.debug("searched %d splits for %d GPUs", searched, num_gpus)
    return plans


def _is_mixed(a: Assignment) -> bool:
    return bucket_count(a) > 1


def mixed_gap(plans: list[Plan]) -> float | None:
    """How much slower the best mixed-TP plan in `plans` is priced than the best one-degree plan
    (`plan_rank`, before the mixed margin): 0.02 = 2% slower, -0.01 = 1% faster. None when `plans`
    lacks either kind. Why a heterogeneous search kept one degree, as `libra simulate` reports it."""
    mixed = [plan_rank(p) for p in plans if bucket_count(p.rollout) > 1]
    one = [plan_rank(p) for p in plans if bucket_count(p.rollout) == 1]
    return min(mixed) / min(one) - 1.0 if mixed and one and min(one) > 0 else None


def bucket_count(a: Assignment) -> int:
    """Router buckets the assignment deploys: runs of groups with one TP degree merge into one."""
    return 1 + sum(1 for x, y in zip(a.groups, a.groups[1:], strict=False) if x.tp != y.tp)


def _plan(
    num_gpus: int,
    n_train: int,
    est: TrainEstimate,
    assignment: Assignment,
    t_r: float,
    t_t: float,
    t_sync: float,
    spread: Spread | None,
    s: SearchSettings,
    shape: TrainShape,
    table: SegmentTable,
) -> Plan:
    return Plan(
        num_gpus,
        n_train,
        num_gpus - n_train,
        est,
        assignment,
        t_t,
        t_r,
        t_sync,
        iteration_time_s(t_r, t_t, t_sync, s.staleness, spread=spread, sync_overlaps=s.sync_overlaps),
        s.staleness,
        shape.tokens,
        False,
        tuple(float(x) for x in table.bin_max_len),
    )


def iteration_spread(model: ModelSpec, hw: HardwareSpec, w: Workload, s: SearchSettings) -> Spread | None:
    """The spread `search_plans` prices `w` with (None when the settings plan for the mean)."""
    return rollout_spread(RolloutCostModel(model, hw, s.max_num_seqs), w, instance_tp_degrees(model, hw), s)


def rollout_spread(
    cost: RolloutCostModel, w: Workload, tps: tuple[int, ...], s: SearchSettings
) -> Spread | None:
    """The workload's iteration spread when the settings plan for it (None: plan for the mean)."""
    return estimate_spread(w, cost, tps) if s.plan_for_spread else None


def assign_rollout(table: SegmentTable, gpus: int, s: SearchSettings) -> Assignment | None:
    """The rollout layout on `gpus` GPUs: the DP's (heterogeneous) or one TP degree's."""
    if s.homogeneous:
        return homogeneous_dp(table, gpus, s.rel_tol) if s.one_degree_dp else homogeneous(table, gpus)
    return solve(table, gpus, s.rel_tol, s.monotone_tp, s.one_range_per_degree)


def _rollout_frontier(table: SegmentTable, s: SearchSettings) -> Callable[[int], float]:
    """Predicted rollout seconds (uncorrected) on n rollout GPUs, inf where nothing fits; the
    heterogeneous one reads the DP's frontier over a grid of makespans, evaluated once."""
    if s.homogeneous and not s.one_degree_dp:

        def one_tp(n: int) -> float:
            a = homogeneous(table, n)
            return a.makespan_s if a else math.inf

        return one_tp
    k = table.num_bins
    finite = table.crit_s[np.isfinite(table.crit_s)]
    one = table.work_s[:, 0, 0, k]  # the whole range on a single instance
    hi = max(float(np.nanmax(np.where(np.isfinite(one), one, 0))), float(finite.max()))
    grid = np.geomspace(max(float(finite.min()) * 0.5, 1e-6), hi * 1.01, 1500)
    if s.homogeneous:  # one degree at a time, every instance that fits deployed
        needs = [frontier(one_degree(table, ti), grid) for ti in range(len(table.tps))]

        def one_tp_dp(n: int) -> float:
            best = math.inf
            for tp, need in zip(table.tps, needs, strict=True):
                ok = need <= (n // tp) * tp
                if ok.any():
                    best = min(best, float(grid[int(np.argmax(ok))]))
            return best

        return one_tp_dp
    need = frontier(table, grid, s.monotone_tp, s.one_range_per_degree)

    def dp(n: int) -> float:
        ok = need <= n
        return float(grid[int(np.argmax(ok))]) if ok.any() else math.inf

    return dp


def _colocated_plan(
    model: ModelSpec,
    hw: HardwareSpec,
    w: Workload,
    shape: TrainShape,
    table,
    t_sync: float,
    f_r: float,
    f_t: float,
    s: SearchSettings,
) -> Plan | None:
    assignment = assign_rollout(table, 1, s)
    est = best_train(model, hw, 1, shape)
    if assignment is None or est is None:
        return None
    t_r, t_t = assignment.makespan_s * f_r, est.time_s * f_t
    t_iter = iteration_time_s(t_r, t_t, t_sync, s.staleness, True)
    return Plan(
        1,
        1,
        1,
        est,
        assignment,
        t_t,
        t_r,
        t_sync,
        t_iter,
        s.staleness,
        shape.tokens,
        True,
        tuple(float(x) for x in table.bin_max_len),
    )


__all__ = ["Plan", "SearchSettings", "TrainLayout", "iteration_time_s", "search_plans"]
