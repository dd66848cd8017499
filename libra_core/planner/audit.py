"""Hindsight audit of applied plans: keep a move only if the measured throughput did not fall.

A replan is applied on the cost model's word (replan.py): the proposal's predicted iteration time
beat the current plan's by the hysteresis margin. The model can be wrong in ways its online
correction does not see, because that correction is one factor per stage, measured on the plan
that ran: a proposal of another shape (a different TP degree, fewer rollout GPUs) can be priced
too well and still be chosen. The audit checks the move against what the run measures.

Who calls it: the plan stage's planner (service.py) and the simulator's replanning (sim/pipeline.py).
After every finished iteration they call `record(iteration, tokens, seconds)`; when a replan is
applied, `moved(iteration, previous, applied)`; before each iteration, `verdict(iteration)`. While a
move is `pending`, they skip the replans that fall due (a second move would replace its audit).
Throughput is tokens per second of iteration, so a workload that grows slowly (drift) does not
read as a regression. With `window` finished iterations on each side of the move (the iteration
that paid the move and the one before it are skipped: in a pipelined run the update of the one
before runs on the new plan), the verdict is:

    after < before x (1 - max_loss_fraction)  -> "revert": go back to the previous plan
    otherwise                                 -> "confirm"

A revert teaches two things for the next `refuse_iterations` iterations. `refuses(plan,
iteration)` is True for a plan with the reverted plan's resources (split, training layout,
instance multiset): the replanner skips it. And `extra_margin(iteration)` is the model's error on
that move, the saving it predicted plus the loss that was measured (predicted 8%, measured -6%:
0.14): the replanner adds it to its hysteresis, so a proposal of the same kind (the same TP degree
on one GPU fewer, say) must promise that much more before it moves workers again. A drift large
enough still moves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from libra_core.planner.search import Plan


@dataclass(frozen=True)
class AuditPolicy:
    window: int = 3  # finished iterations measured on each side of a move; 0 turns the audit off
    max_loss_fraction: float = 0.05  # a throughput drop beyond this reverts the move
    # How long a revert's lessons last: callers pass the replanner's expected_iterations, the life
    # a plan is amortised over.
    refuse_iterations: int = 50

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ValueError(f"audit window must be >= 0 iterations, got {self.window}")
        if not 0.0 <= self.max_loss_fraction < 1.0:
            raise ValueError(f"max_loss_fraction must be in [0, 1), got {self.max_loss_fraction}")
        if self.refuse_iterations < 0:
            raise ValueError(f"refuse_iterations must be >= 0, got {self.refuse_iterations}")


@dataclass(frozen=True)
class AuditVerdict:
    """The audit of the move applied at `moved_at`; `previous` is the plan to go back to."""

    moved_at: int
    action: Literal["revert", "confirm"]
    before_tokens_per_s: float
    after_tokens_per_s: float
    previous: Plan
    applied: Plan

    @property
    def change_fraction(self) -> float:
        return self.after_tokens_per_s / self.before_tokens_per_s - 1.0


class MoveAudit:
    """Measured throughput around the last applied move, and the plans it refused."""

    def __init__(self, policy: AuditPolicy) -> None:
        self.policy = policy
        self._throughput: dict[int, float] = {}  # iteration -> tokens per second
        # (iteration moved at, previous, applied, saving the model predicted as a share of T_iter)
        self._pending: tuple[int, Plan, Plan, float] | None = None
        self._refused: list[tuple[Plan, int]] = []  # (plan, refused until this iteration)
        self._margins: list[tuple[float, int]] = []  # (model error on a reverted move, until)

    def record(self, iteration: int, tokens: float, seconds: float) -> None:
        """One finished iteration: the tokens it trained on and its wall seconds (its period)."""
        if seconds > 0 and tokens > 0:
            self._throughput[iteration] = tokens / seconds

    def moved(self, iteration: int, previous: Plan, applied: Plan, predicted_gain_fraction: float) -> None:
        """A plan was applied before `iteration`, predicted to save `predicted_gain_fraction` of the
        iteration time; the move is audited once enough has run."""
        if self.policy.window > 0:
            self._pending = (iteration, previous, applied, max(0.0, predicted_gain_fraction))

    @property
    def pending(self) -> bool:
        """A move awaits its verdict. Callers hold the next move until it is judged: `moved` keeps
        one move, so a second move before the verdict would leave the first never audited."""
        return self._pending is not None

    def drop(self) -> None:
        """Forget the pending move unjudged: the running plan cannot run the workload any more, and
        the replan that must follow at once (planner/service.py, sim/pipeline.py) may not wait
        for the verdict, nor go back to the plan before that move."""
        self._pending = None

    def keep_reverted(self, verdict: AuditVerdict) -> None:
        """The caller keeps the move `verdict` said to revert (the plan before it cannot run the
        workload any more): its plan is not refused, nor its model error added to the margin."""
        assert verdict.action == "revert", verdict
        self._refused = [(p, until) for p, until in self._refused if p is not verdict.applied]
        if self._margins:
            self._margins.pop()

    def verdict(self, iteration: int) -> AuditVerdict | None:
        """The pending move's verdict once `window` iterations after it have finished, else None.
        An iteration after the move that was never recorded (no lake rows, a zero period) does not
        hold the verdict back for good: once the window has passed (and one more iteration, for a
        pipelined run's last record), the move is judged on the iterations that were recorded, and
        dropped unjudged when none were (until 2026-12-06 it stayed pending, so a bad move was
        never reverted)."""
        if self._pending is None:
            return None
        at, previous, applied, predicted = self._pending
        w = self.policy.window
        before = [self._throughput.get(i) for i in range(at - 1 - w, at - 1)]
        after = [x for i in range(at + 1, at + 1 + w) if (x := self._throughput.get(i)) is not None]
        if len(after) < w and iteration <= at + w + 1:
            return None
        self._pending = None
        known = [x for x in before if x is not None]
        if not known or not after:  # nothing measured on one side of the move: nothing to compare
            return None
        b = sum(known) / len(known)
        a = sum(after) / len(after)
        action: Literal["revert", "confirm"] = (
            "revert" if a < b * (1.0 - self.policy.max_loss_fraction) else "confirm"
        )
        if action == "revert":
            until = iteration + self.policy.refuse_iterations
            self._refused.append((applied, until))
            self._margins.append((predicted + (1.0 - a / b), until))
        return AuditVerdict(at, action, b, a, previous, applied)

    def extra_margin(self, iteration: int) -> float:
        """Share of T_iter a proposal must save on top of the hysteresis: the largest model error
        on a move reverted within the last `refuse_iterations` iterations (0 when none)."""
        self._margins = [(m, until) for m, until in self._margins if iteration < until]
        return max((m for m, _ in self._margins), default=0.0)

    def refuses(self, plan: Plan, iteration: int) -> bool:
        """True while `plan` has the resources of a reverted plan whose refusal still lasts."""
        self._refused = [(p, until) for p, until in self._refused if iteration < until]
        return any(plan.same_resources(p) for p, _ in self._refused)
