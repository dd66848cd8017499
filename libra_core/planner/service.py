"""The Global Resource Planner as the plan stage uses it during a run.

The plan stage builds one `LibraPlanner` per run (`LibraPlanner.from_config(cfg)`) and, each
iteration, calls `observe(...)` with the finished iteration's trajectories and measured stage
times, then `step(iteration)`, which returns the plan to run and a `ReplanDecision` when a replan
was due (every `planner.replan_every` iterations, never when it is 0; and at once when the running
plan, re-priced on the window, cannot run it). The planner mutates only
its own state: the trajectory window, the stage corrections, the current plan and the audit of
the last applied move (audit.py): when the throughput measured after a move fell, `step` returns
the plan before it with a `revert` decision, and later replans skip the reverted plan's resources.

That state lives in the process. A resumed run builds a fresh planner and calls `catch_up`, which
repeats the calls the run made (observe the previous iteration, step the next) on the recorded
iterations, so the resumed run continues with the plan, corrections and audit it had.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from libra_core.config import LibraConfig
from libra_core.planner.audit import AuditPolicy, MoveAudit
from libra_core.planner.calibration import StageCorrection
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import (
    ReplanDecision,
    ReplanPolicy,
    TrajectoryWindow,
    audit_decision,
    initial_decision,
)
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import Plan, SearchSettings, search_plans
from libra_core.planner.specs import ClusterSpec, ModelSpec, get_model, model_spec_from_tiny, parse_cluster
from libra_core.planner.train_cost import TrainShape, estimate_train
from libra_core.planner.workload import Workload, workload_from_trajectory_table

log = logging.getLogger(__name__)


class NoFeasiblePlan(ValueError):
    """No plan on the cluster holds the workload (the model does not fit, or its sequences fit no
    layout): raised by the first plan, logged by a replan (the run goes on with its plan)."""


class LibraPlanner:
    def __init__(
        self,
        cluster: ClusterSpec,
        model: ModelSpec,
        prior: Workload,
        policy: ReplanPolicy,
        window_iterations: int,
        replan_every: int,
        staleness: int,
        gpu_budget: int = 0,
        plan_for_spread: bool = False,
        audit_window: int = 0,
        mixed_margin: float = 0.0,
        two_phase_path: bool = True,
        total_iterations: int | None = None,
        reprefill_fraction: float | None = None,
        max_num_seqs: int = 256,
        ref_forward: bool = False,
    ) -> None:
        self.cluster = cluster
        self.total_iterations = total_iterations  # the run's length: a move amortises over what is left
        self.model = model
        self.policy = policy
        self.replan_every = replan_every
        self.staleness = staleness
        self.plan_for_spread = plan_for_spread
        self.mixed_margin = mixed_margin
        self.two_phase_path = two_phase_path
        # Set on the measured trajectories' workloads (None: the default of Workload); a Workload
        # given to `observe` keeps its own.
        self.reprefill_fraction = reprefill_fraction
        # Search settings from the run's config: the engines' sequence cap, the reference forward
        self.max_num_seqs = max_num_seqs
        self.ref_forward = ref_forward
        self.num_gpus = min(gpu_budget, cluster.num_gpus) if gpu_budget else cluster.num_gpus
        self.window = TrajectoryWindow(window_iterations)
        self.corrections = StageCorrection()
        self._prior = prior
        self._plan: Plan | None = None
        self.audit = MoveAudit(
            AuditPolicy(audit_window, policy.min_gain_fraction, policy.expected_iterations)
        )

    @staticmethod
    def resolve_specs(cfg: LibraConfig) -> tuple[ClusterSpec, ModelSpec, Workload]:
        """The cluster, model and initial workload `cfg.planner` names. Raises ValueError naming
        the setting: `libra config validate` and `libra run` call it before a run starts, so a
        spec file that is missing or wrong fails there rather than at the first plan stage."""
        p = cfg.planner
        problems = []
        model = cluster = workload = None
        try:
            if p.model_spec is not None:
                model = get_model(p.model_spec)
            elif cfg.model.type == "tiny_qwen2":
                model = model_spec_from_tiny(cfg.model, vocab_size=cfg.tokenizer.vocab_size)
            else:
                raise ValueError("required for model.type hf_local (e.g. qwen3-8b)")
        except ValueError as e:
            problems.append(f"planner.model_spec: {e}")
        try:
            cluster = parse_cluster(p.hardware)
        except ValueError as e:
            problems.append(f"planner.hardware: {e}")
        try:
            workload = workload_preset(p.initial_workload, cfg.experiment.seed)
        except ValueError as e:
            problems.append(f"planner.initial_workload: {e}")
        if problems:
            raise ValueError("\n".join(problems))
        assert cluster is not None and model is not None and workload is not None
        return cluster, model, workload

    @classmethod
    def from_config(cls, cfg: LibraConfig) -> LibraPlanner:
        p = cfg.planner
        cluster, model, initial = cls.resolve_specs(cfg)
        prior = replace(
            initial,
            prompts_per_iteration=cfg.rollout.prompts_per_iteration,
            group_size=cfg.training.grpo.group_size,
            minibatches=cfg.training.grpo.minibatches,
            reprefill_fraction=p.reprefill_fraction,
        )
        policy = ReplanPolicy(p.min_gain_fraction, p.expected_iterations, p.move_cost_s)
        return cls(
            cluster,
            model,
            prior,
            policy,
            p.window_iterations,
            p.replan_every,
            p.staleness,
            p.gpu_budget,
            p.plan_for_spread,
            p.audit_window,
            p.mixed_margin,
            p.two_phase_path,
            cfg.experiment.iterations,
            p.reprefill_fraction,
            cfg.rollout.engine.max_num_seqs,
            cfg.training.grpo.kl_coef > 0,
        )

    @property
    def plan(self) -> Plan | None:
        return self._plan

    def settings(self) -> SearchSettings:
        factors = {s: self.corrections.factor(s) for s in ("rollout", "update")}
        return SearchSettings(
            staleness=self.staleness,
            corrections=factors,
            plan_for_spread=self.plan_for_spread,
            mixed_margin=self.mixed_margin,
            two_phase_path=self.two_phase_path,
            max_num_seqs=self.max_num_seqs,
            ref_forward=self.ref_forward,
        )

    def _search(self, workload: Workload, iteration: int = 0) -> Plan:
        plans = search_plans(self.model, self.cluster.hardware, self.num_gpus, workload, self.settings())
        allowed = [p for p in plans if not self.audit.refuses(p, iteration)]
        plans = allowed or plans  # every candidate refused: the search's best, rather than none
        if not plans:
            raise NoFeasiblePlan(
                f"no feasible plan for {self.model.name} on {self.num_gpus}x{self.cluster.hardware.name}"
            )
        return plans[0]

    def observe(
        self,
        trajectories: pa.Table | Workload,
        group_size: int,
        measured_s: dict[str, float],
        iteration: int | None = None,
        period_s: float | None = None,
        train_share: float | None = None,
    ) -> None:
        """Feed one finished iteration: its trajectories and measured seconds per stage. With its
        `iteration` number, its throughput feeds the move audit: tokens over `period_s`, the
        iteration's wall time (in async mode about max(rollout, update), not their sum), or over the
        stages' seconds summed when no period is given. `train_share`: the share of the sampled
        tokens the update trained (`Workload.train_share`; None: the workload's own, 1 for a table)."""
        if isinstance(trajectories, Workload):
            w = trajectories
        else:
            w = workload_from_trajectory_table(trajectories, group_size)
            # What the table cannot say comes from the config, as in the prior: the optimizer
            # steps per iteration (4, Workload's default, priced every replan until 2026-12-06)
            w = replace(w, minibatches=self._prior.minibatches)
            if self.reprefill_fraction is not None:
                w = replace(w, reprefill_fraction=self.reprefill_fraction)
        if train_share is not None:
            w = replace(w, train_share=train_share)
        self.window.add(w)
        if iteration is not None:
            tokens = float(w.total_tokens.sum()) * w.weight
            if period_s is None or not period_s > 0:
                period_s = sum(s for s in measured_s.values() if s > 0)
            self.audit.record(iteration, tokens, period_s)
        if self._plan is None:
            return
        if not any(seconds > 0 for seconds in measured_s.values()):
            return
        # The model's own prediction of what ran: the running plan re-priced on this iteration's
        # workload, without correction factors (with them, the correction would feed back into
        # itself between replans). The plan's own times were priced on the workload it was planned
        # for (the preset, an older window): compared with those, drift and a preset unlike the
        # task were learned as model error and applied again on top of the next window's prices
        # (until 2026-12-06; the simulator re-priced already, sim/pipeline.py).
        settings = replace(self.settings(), corrections={})
        now = evaluate_plan(self._plan, self.model, self.cluster.hardware, w, settings)
        # The update ran on the plan's own layout (its ZeRO stage, recompute and micro-batch change
        # only when a plan is applied): priced by `evaluate_plan`'s fastest layout on the same groups
        # instead, the difference between two layouts was learned as model error (until 2026-12-07).
        shape = TrainShape.from_workload(w, settings.ref_forward)
        ran = estimate_train(self.model, self.cluster.hardware, self._plan.train.layout, shape)
        predicted = {"rollout": now.t_rollout_s, "update": ran.time_s if ran.feasible else now.t_train_s}
        for stage, seconds in measured_s.items():
            if stage in predicted and seconds > 0 and 0 < predicted[stage] < math.inf:
                self.corrections.observe(stage, predicted[stage], seconds)

    def catch_up(self, iteration: int, feed: Callable[[int], None], first: int = 1) -> list[ReplanDecision]:
        """Bring a fresh planner to the state the run had when it was about to plan `iteration`.

        Called once by the plan stage of a resumed run, before `step(iteration)`. It makes the calls
        the run made, in order: `step(first)`, then for every later iteration k < `iteration`,
        `feed(k - 1)` and `step(k)`; finally `feed(iteration - 1)`. `feed(k)` must call `observe`
        with iteration k's recorded trajectories and stage times (or nothing, when k was not
        recorded), exactly as the running plan stage did. Returns the decisions the replayed steps
        made, which the caller may compare with the ones the run logged (they match when the
        recorded data and the config are unchanged: the planner is deterministic).
        """
        assert self._plan is None and not len(self.window), "catch_up needs a fresh planner"
        decisions = []
        for k in range(first, iteration):
            if k > first:
                feed(k - 1)
            _, decision = self.step(k)
            if decision is not None:
                decisions.append(decision)
        if iteration > first:
            feed(iteration - 1)
        return decisions

    def step(self, iteration: int) -> tuple[Plan, ReplanDecision | None]:
        """The plan for `iteration`; a decision record when a (re)plan happened."""
        if self._plan is None:
            workload = self.window.pooled() if len(self.window) else self._prior
            self._plan = self._search(workload)
            return self._plan, initial_decision(iteration, self._plan, workload, self.policy)
        if not len(self.window):
            return self._plan, None
        window = self.window.pooled()
        due = bool(self.replan_every) and iteration % self.replan_every == 0
        if self.replan_every and not due:
            # The window's workload no longer fits the running plan (memory): waiting for the next
            # due replan would run updates the cost model says cannot run (until 2026-12-07).
            # `replan_every: 0` means never, this too.
            current_now = self._reprice(self._plan, window)
            if not math.isfinite(current_now.t_iter_s):
                return self._replan(iteration, window, current_now, forced=True)
        verdict = self.audit.verdict(iteration)
        if verdict is not None:
            decision = audit_decision(iteration, verdict, window, self.policy, self.policy.move_cost_s)
            if verdict.action == "revert":
                if math.isfinite(self._reprice(verdict.previous, window).t_iter_s):
                    self._plan = verdict.previous  # the plan as it ran (the next replan re-prices it)
                    return self._plan, decision
                # The plan before the move cannot run the window: going back would only force a
                # move again; the move stays, and its plan is not refused (until 2026-12-07 the
                # revert ran a plan priced at inf until the next replan).
                self.audit.keep_reverted(verdict)
                reason = f"{decision.reason}; kept: the plan before the move cannot run the window (memory)"
                decision = replace(decision, action="confirm", reason=reason)
            if not due:
                return self._plan, decision
            log.info("iteration %d: %s; the replan due now follows", iteration, decision.reason)
        if not due:
            return self._plan, None
        current_now = self._reprice(self._plan, window)
        if self.audit.pending and math.isfinite(current_now.t_iter_s):
            # e.g. replan_every < audit_window + 2, or a pipelined run's lag
            log.info("iteration %d: the last move awaits its audit; no replan before it", iteration)
            return self._plan, None
        return self._replan(iteration, window, current_now)

    def _reprice(self, plan: Plan | None, window: Workload) -> Plan:
        assert plan is not None
        return evaluate_plan(plan, self.model, self.cluster.hardware, window, self.settings())

    def _replan(
        self, iteration: int, window: Workload, current_now: Plan, forced: bool = False
    ) -> tuple[Plan, ReplanDecision | None]:
        """Search on `window` and let the policy decide against `current_now` (the running plan
        re-priced on it). A running plan that cannot run the window (`t_iter_s` inf) is replaced at
        once, due or not (`forced` when not), and a move awaiting its audit is dropped unjudged:
        going back could only be to a plan older than a workload the running one no longer holds.
        When no plan holds the window, the plan stays (logged; no decision)."""
        assert self._plan is not None
        try:
            proposed = self._search(window, iteration)
        except NoFeasiblePlan as err:
            log.warning("iteration %d: no replan, the running plan stays: %s", iteration, err)
            return self._plan, None
        if not math.isfinite(current_now.t_iter_s):
            self.audit.drop()
        margin = self.audit.extra_margin(iteration)
        left = None if self.total_iterations is None else self.total_iterations - iteration + 1
        decision = self.policy.decide(
            iteration, self._plan, current_now, proposed, window, extra_gain_fraction=margin,
            iterations_left=left,
        )  # fmt: skip
        if forced:
            reason = f"replanned before it was due: {decision.reason}"
            decision = replace(decision, reason=reason)
        if decision.action == "apply" and decision.move_cost_s > 0 and math.isfinite(current_now.t_iter_s):
            gain = decision.saving_per_iter_s / current_now.t_iter_s
            self.audit.moved(iteration, self._plan, proposed, gain)
        if decision.action == "apply":
            self._plan = proposed
        elif current_now.same_gpu_groups(self._plan):
            # Re-priced on the window, nothing moves; its ZeRO stage, recompute or micro-batch may
            # differ (the old settings may no longer fit in memory): the next update runs with these.
            self._plan = current_now
        # else: the re-pricing left a degree's instances idle (evaluate_plan keeps every degree's
        # count but may give one no lengths); keeping means the running instances, so the plan stays.
        return self._plan, decision
