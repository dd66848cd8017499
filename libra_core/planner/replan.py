"""Replanning policy: move GPUs only when the amortised saving beats the cost of moving.

Called by the plan stage every `replan_every` iterations with a window of recent trajectory
statistics. It re-prices the current plan on that window (same split, layout and instances; the
router re-assigns lengths for free), searches a fresh plan, and applies the proposal only if

    saving_s = T_iter(current) - T_iter(proposed)
    saving_s >= min_gain_fraction x T_iter(current)                (hysteresis: no flapping)
    saving_s x expected_iterations > move_cost_s                   (amortised over the plan's life)

A proposal with the same resources (split, TP/PP/DP/EP groups, instance multiset) moves nothing,
so it needs only a positive saving; if the current plan no longer fits the window (e.g. longer
sequences exhaust training memory), the proposal is applied. Every call returns a
`ReplanDecision` with the numbers, for the run history.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from libra_core.planner.audit import AuditVerdict
from libra_core.planner.search import Plan
from libra_core.planner.workload import Workload, concat

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplanDecision:
    """One replanning decision; `action` is what happened to the running plan."""

    iteration: int
    # initial: the first plan; keep / apply: a replan; confirm / revert: the audit of an applied
    # move (audit.py), revert going back to the plan before it
    action: Literal["initial", "keep", "apply", "confirm", "revert"]
    reason: str
    current_t_iter_s: float
    proposed_t_iter_s: float
    saving_per_iter_s: float
    expected_iterations: int
    move_cost_s: float
    amortised_gain_s: float
    min_gain_fraction: float
    window_trajectories: int
    window_mean_len: float
    window_p90_len: float
    current_split: str
    proposed_split: str

    def as_record(self) -> dict[str, object]:
        """The decision as a JSON-safe dict: a price of inf (the running plan no longer fits the
        window's memory; `reason` says so) or nan is null, which strict JSON readers (jq, a
        browser) accept; Python's json wrote `Infinity` until 2026-12-06."""
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in self.__dict__.items()
        }


def split_label(plan: Plan) -> str:
    tps = " ".join(f"{n}xTP{t}" for t, n in plan.instance_tps.items())
    return f"train {plan.train_gpus} ({plan.train.layout.label()}) | rollout {plan.rollout_gpus} ({tps})"


class TrajectoryWindow:
    """The last `size` iterations' workloads, pooled for the next replan."""

    def __init__(self, size: int) -> None:
        assert size >= 1, "window size must be >= 1"
        self._items: deque[Workload] = deque(maxlen=size)

    def add(self, workload: Workload) -> None:
        self._items.append(workload)

    def __len__(self) -> int:
        return len(self._items)

    def pooled(self) -> Workload:
        assert self._items, "the window is empty"
        return concat(list(self._items), name=f"window[{len(self._items)}]")


@dataclass(frozen=True)
class ReplanPolicy:
    min_gain_fraction: float = 0.05
    expected_iterations: int = 50
    move_cost_s: float = 60.0

    def decide(
        self,
        iteration: int,
        current: Plan,
        current_now: Plan,
        proposed: Plan,
        window: Workload,
        move_cost_s: float | None = None,
        extra_gain_fraction: float = 0.0,
        iterations_left: int | None = None,
    ) -> ReplanDecision:
        """`current_now` is `current` re-priced on `window`; `proposed` the fresh search's best.
        `extra_gain_fraction` raises the hysteresis for moves (the audit's margin, audit.py).
        `iterations_left`: the iterations the run has left, including this one; a move's saving is
        amortised over at most that many (a move ten iterations before the end earns ten
        iterations' saving, not `expected_iterations`')."""
        cost = self.move_cost_s if move_cost_s is None else move_cost_s
        horizon = self.expected_iterations
        if iterations_left is not None:
            horizon = max(0, min(horizon, iterations_left))
        free = proposed.same_gpu_groups(current)
        if free:
            cost = 0.0
        saving = current_now.t_iter_s - proposed.t_iter_s
        gain = saving * horizon
        threshold = (self.min_gain_fraction + extra_gain_fraction) * current_now.t_iter_s
        if not math.isfinite(current_now.t_iter_s):
            apply, why = True, "the current plan cannot run the window's workload (memory)"
        elif free:
            apply, why = (
                saving > 0,
                "same GPU groups, new length ranges or memory settings" if saving > 0 else "no saving",
            )
        elif saving < threshold:
            apply, why = False, f"saving {saving:.2f}s/iter below hysteresis {threshold:.2f}s"
        elif gain <= cost:
            apply, why = False, f"amortised gain {gain:.1f}s does not cover move cost {cost:.1f}s"
        else:
            apply, why = True, f"amortised gain {gain:.1f}s exceeds move cost {cost:.1f}s"
        stats = window.stats()
        decision = ReplanDecision(
            iteration=iteration,
            action="apply" if apply else "keep",
            reason=why,
            current_t_iter_s=current_now.t_iter_s,
            proposed_t_iter_s=proposed.t_iter_s,
            saving_per_iter_s=saving,
            expected_iterations=horizon,
            move_cost_s=cost,
            amortised_gain_s=gain,
            min_gain_fraction=self.min_gain_fraction + extra_gain_fraction,
            window_trajectories=window.num_samples,
            window_mean_len=stats["mean_len"],
            window_p90_len=stats["p90_len"],
            current_split=split_label(current),
            proposed_split=split_label(proposed),
        )
        log.info("replan at iteration %d: %s (%s)", iteration, decision.action, why)
        return decision


def initial_decision(iteration: int, plan: Plan, window: Workload, policy: ReplanPolicy) -> ReplanDecision:
    stats = window.stats()
    label = split_label(plan)
    return ReplanDecision(
        iteration,
        "initial",
        "first plan",
        plan.t_iter_s,
        plan.t_iter_s,
        0.0,
        policy.expected_iterations,
        0.0,
        0.0,
        policy.min_gain_fraction,
        window.num_samples,
        stats["mean_len"],
        stats["p90_len"],
        label,
        label,
    )


def audit_decision(
    iteration: int, verdict: AuditVerdict, window: Workload, policy: ReplanPolicy, move_cost_s: float
) -> ReplanDecision:
    """The record of a move's audit. The seconds fields are seconds per iteration of the window's
    size (its tokens per iteration) at the measured throughput: `current_t_iter_s` after the move,
    `proposed_t_iter_s` at the plan the decision runs next (before the move's for a revert), and
    `saving_per_iter_s` what going back saves (> 0 for a revert, 0 for a confirm). The throughputs
    themselves are in `reason`. Before 2026-12-06 these fields held seconds per million tokens
    (1e6 / tokens per second), which the run report showed beside real seconds; logs written then
    still load (same fields), their audit rows in those units."""
    stats = window.stats()
    tokens = stats["tokens_per_iteration"]
    before_s = tokens / verdict.before_tokens_per_s
    after_s = tokens / verdict.after_tokens_per_s
    reverted = verdict.action == "revert"
    why = (
        f"the move at iteration {verdict.moved_at} changed measured throughput by "
        f"{verdict.change_fraction:+.1%} ({verdict.before_tokens_per_s:,.0f} -> "
        f"{verdict.after_tokens_per_s:,.0f} tok/s; {tokens:,.0f} tokens/iteration: "
        f"{before_s:,.1f} -> {after_s:,.1f} s)"
    )
    return ReplanDecision(
        iteration=iteration,
        action=verdict.action,
        reason=why,
        current_t_iter_s=after_s,
        proposed_t_iter_s=before_s if reverted else after_s,
        saving_per_iter_s=(after_s - before_s) if reverted else 0.0,
        expected_iterations=policy.expected_iterations,
        move_cost_s=move_cost_s if reverted else 0.0,
        amortised_gain_s=0.0,
        min_gain_fraction=policy.min_gain_fraction,
        window_trajectories=window.num_samples,
        window_mean_len=stats["mean_len"],
        window_p90_len=stats["p90_len"],
        current_split=split_label(verdict.applied),
        proposed_split=split_label(verdict.previous if reverted else verdict.applied),
    )
