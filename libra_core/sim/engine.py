"""The simulator: one policy, one cluster, N iterations of an agentic RL pipeline, event by event.

`Simulator` builds the run's state, picks its first deployment and runs the event loop; its event
handlers here admit a rollout's trajectories and finish them. Its bases hold the rest: the turn path
between events (`SimTurns`, turns.py) and the deployment and its GPU-time books (`SimDeployments`,
deployments.py); the iteration hand-offs, replanning and elastic pool are pipeline.py's.

Pipeline (staleness s; s = 1 for disaggregated policies, 0 = sequential for `colocated`): rollout j
starts when rollout j-1 is done and policy version `j - s` has reached the rollout side; update j
starts when rollout j is done and update j-1 is done; its weights reach rollout `t_sync` later
(`weight_sync_s`). Colocated runs rollout, then training, on the same GPUs, paying a sleep/wake
switch (`wake_s` + moving the weights through HBM) each way.

Per trajectory: admission (scheduler `admit`), per turn prefill + decode on an instance
(instance.py), then the tool call (its latency), `on_tool_return` (may move the trajectory to another
bucket: the whole context is prefilled again there), the next turn; the last turn ends the trajectory
(`on_finish`). Replanning (policies with `replan`): every `replan_every` iterations, at a rollout
start, the planner re-prices the running plan on the last `window_iterations` iterations and searches
a new one; `ReplanPolicy` decides; an applied plan stalls that rollout start by `move_cost_s`. An
update that fits no layout on the training GPUs replans at once (pipeline.try_start_train): it and
the next rollout start wait `move_cost_s` for the move.

Elastic hybrid pool (`elastic`): (1) a rollout instance that is idle in the tail of an iteration (no
queued turn in its bucket, at most one unfinished trajectory per other instance of the bucket) is lent
to the running update as a data-parallel replica after `join_s` (snapshot load), if the update's
time it saves exceeds the wake it costs later (`switch_s`) and the rollout's last trajectory has
not ended; lent instances come back
(`wake_s` + moving the weights) when the update ends while rollout runs and no update follows, or
when it ends and the next rollout waits only for its weights (the wake overlaps the sync), else
at the next rollout start. (2) When an update ends and rollout still runs, the
training GPUs beyond the core half become rollout instances of the longest bucket after `wake_s`
and serve the turns that follow; at rollout end they rejoin training `join_s` later. (3) When a
rollout ends, or an update starts with no rollout running, and the next rollout must wait for that
update (or none follows), every idle rollout instance joins it on the same condition.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

from libra_core.planner.audit import AuditPolicy, MoveAudit
from libra_core.planner.calibration import StageCorrection
from libra_core.planner.iteration import weight_sync_s
from libra_core.planner.replan import ReplanPolicy
from libra_core.planner.search import SearchSettings
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.workload import Workload
from libra_core.scheduling.base import FinishedTrajectory, SchedRequest
from libra_core.sim import pipeline
from libra_core.sim.events import EventQueue, Kind
from libra_core.sim.instance import CostTables, Instance
from libra_core.sim.policies import (
    GREEDY_RESPLIT_AT,
    PROMOTING,
    Deployment,
    PolicySpec,
    build_deployment,
    check_cluster_size,
)
from libra_core.sim.rerank import rerank
from libra_core.sim.settings import SimSettings
from libra_core.sim.stats import IterationRecord, RunStats
from libra_core.sim.training import Trainer
from libra_core.sim.trajectory import SimTrajectory
from libra_core.sim.turns import Flight, SimTurns

# Optimizer steps per simulated update: the update is priced as the planner's Workload, that many
# steps. The scheduler's clock counts them, one policy version per step as in a live run (C-MLFQ's
# half-life is in versions); until 2026-12-07 it counted updates, aging 4x slower than a live run.
STEPS_PER_UPDATE = Workload.minibatches

__all__ = ["Flight", "Simulator"]  # `Flight` lived here before turns.py (benchmarks import it from here)


class Simulator(SimTurns):
    """One policy's run: built with its inputs, then `run()` once, which returns its `RunStats`."""

    def __init__(
        self,
        policy: PolicySpec,
        workload: Any,
        model: ModelSpec,
        hw: HardwareSpec,
        num_gpus: int,
        iterations: int,
        settings: SimSettings | None = None,
        record_events: bool = False,
        deployment: Deployment | None = None,
        on_iteration: Callable[[int], None] | None = None,
    ) -> None:
        """`on_iteration(k)` is called as the k-th update ends (k = 1..iterations), on this thread;
        progress reporting only, it must not touch the simulator."""
        check_cluster_size([policy], num_gpus)  # simulate() checks first; direct callers get it here
        self.s = settings or SimSettings()
        self.on_iteration = on_iteration
        hw = self.s.hardware(hw)
        self.p, self.wl, self.model, self.hw, self.G = policy, workload, model, hw, num_gpus
        self.iterations = iterations
        self.staleness = 0 if policy.colocated else 1
        self.search = SearchSettings(
            staleness=self.staleness,
            max_num_seqs=self.s.max_num_seqs,
            num_bins=self.s.num_bins,
            homogeneous=not policy.hetero,
            promote=policy.hetero and policy.scheduler in PROMOTING,
            one_range_per_degree=self.s.one_range_per_degree,
            one_degree_dp=self.s.one_degree_dp,
            plan_for_spread=self.s.plan_for_spread,
            queue_wait=self.s.queue_wait,
            two_phase_path=self.s.two_phase_path,
            mixed_margin=self.s.mixed_margin,
            sync_overlaps=self.s.sync_overlaps,
        )
        from libra_core.planner.rollout_cost import RolloutCostModel, instance_tp_degrees

        self.tables = CostTables(
            RolloutCostModel(model, hw, self.s.max_num_seqs), instance_tp_degrees(model, hw)
        )
        self.t_sync = weight_sync_s(model, hw, policy.colocated)
        self.join_s = 8.0 * weight_sync_s(model, hw, False)  # bf16 weights + fp32 optimizer states
        self.switch_s = self.s.wake_s + weight_sync_s(model, hw, True)
        self.q = EventQueue(record_events)
        self.stats = RunStats()
        self.correction = StageCorrection()  # measured / predicted rollout time, fed at replans
        self.replanner = ReplanPolicy(self.s.min_gain_fraction, 50, self.s.engine_restart_s + self.join_s)
        self.audit = MoveAudit(
            AuditPolicy(self.s.audit_window, self.s.min_gain_fraction, self.replanner.expected_iterations)
        )
        self.before_move: Deployment | None = None  # the deployment an audited move would go back to
        self.trajs = {j: workload.trajectories(j) for j in range(min(1, iterations))}
        self.windows: list[Workload] = []
        self.sample: list[SimTrajectory] = []  # the last finished rollout's trajectories (rerank_plans)
        self.sched = None
        self.dep = None
        self.version = 0  # policy versions on the rollout side
        self.rolled = 0  # rollouts completed
        self.rollout_running = False
        self.pending_train: list[int] = []
        self.unfinished = 0
        self.lent = []
        self.hybrids = []
        self.lent_ready = set()
        self.returning_gpus = 0
        # An applied move that takes GPUs from a running update: the next rollout's start (its
        # ROLLOUT_START target) waits for that update to end, then for the move (`on_train_done`).
        self.move_after_update = None
        self.moving_until_s = 0.0  # a forced move's GPUs are in place (pipeline.try_start_train)
        self.bucket_flights = []
        self._ledger_s = 0.0
        self._next_id = 0
        self.cur = None
        self.deploy(deployment or self._first_deployment())
        self.trainer = Trainer(self.dep.train_gpus if self.dep else 1)
        self.stats.mixed_gap = self.dep.mixed_gap if self.dep else None

    @property
    def policy_clock(self) -> int:
        """The scheduler's policy version: optimizer steps of the updates on the rollout side."""
        return self.version * STEPS_PER_UPDATE

    # -- first deployment ------------------------------------------------------------------------------
    def _first_deployment(self) -> Deployment:
        w0 = self.workload_of(0)
        if self.s.rerank_plans and self.p.split == "planner":
            ranked = rerank(self, self.rerank_candidates(w0), self.trajs[0], self.rerank_alternatives(w0))
            if not ranked:
                raise ValueError(
                    f"the planner found no plan for {self.model.name} on {self.G}x{self.hw.name}"
                )
            return ranked[0][1]
        return build_deployment(self.p, self.model, self.hw, self.G, w0, self.search)

    # -- main loop -------------------------------------------------------------------------------------
    def run(self) -> RunStats:
        """Process events until none is left. The cyclic garbage collector is off meanwhile: the run
        creates no reference cycles (everything it drops is freed by reference counting; a test
        checks it), while its full collections kept rescanning every C-MLFQ tree node and cached
        statistic, ~18% of a 100-iteration `+cmlfq` run. The collector's state is restored after."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> RunStats:
        q = self.q
        q.push(0.0, Kind.ROLLOUT_START, 0)
        by_kind: dict[Kind, Callable[[Any], None]] = {
            Kind.ROLLOUT_START: self.on_rollout_start,
            Kind.TOOL_RETURN: self.on_tool_return,
            Kind.DECODE_DONE: self.on_decode_done,
            Kind.TRAIN_DONE: lambda t: pipeline.on_train_done(self, t),
            Kind.WEIGHTS_READY: lambda t: pipeline.on_weights_ready(self, t),
            Kind.HYBRID_READY: lambda t: pipeline.on_hybrid_ready(self, t),
        }
        handlers = [by_kind[kind] for kind in sorted(Kind)]  # indexed by the event's priority
        decode_done, train_done = int(Kind.DECODE_DONE), int(Kind.TRAIN_DONE)
        hybrid_ready = int(Kind.HYBRID_READY)
        recording = q.log is not None
        last_s, stale = 0.0, 0
        for ev in q.drain():
            time_s, priority, _, _, tgt, version = ev
            if priority == decode_done:
                if version != tgt.version:
                    stale += 1
                    continue
            elif priority == train_done and version != self.trainer.version:
                stale += 1
                continue
            elif priority == hybrid_ready and isinstance(tgt, Instance) and version != tgt.loans:
                stale += 1  # the ready of a loan that was given back before it joined
                continue
            last_s = time_s
            if recording:  # the label is only for the trace
                label = (
                    str(tgt.instance_id)
                    if isinstance(tgt, Instance)
                    else (tgt.traj.trajectory_id if isinstance(tgt, Flight) else str(tgt))
                )
                q.record(ev, label)
            handlers[priority](tgt)
        # The books close at the last event handled: an outdated prediction popped after it (an
        # update the elastic pool shortened) must not book idle time past the run's end. Nor may
        # an event handled after the last weights are ready (a hybrid's wake or return that the
        # run's end made moot; until 2026-12-07 they booked idle time up to them).
        end = self.stats.makespan_s
        q.now_s = min(last_s, end) if end > 0 else last_s
        self._account()
        self.harvest(self.instances)
        self.stats.train_busy_gpu_s = self.trainer.busy_gpu_s
        self.stats.events = q.processed - stale
        return self.stats

    # -- rollout start, decode ends and finished trajectories (they hand off to pipeline.py) ---------
    def on_rollout_start(self, j: int) -> None:
        replanned = (
            self.p.replan
            and j > 0
            and self.dep
            and self.dep.plan
            and (pipeline.audit_move(self, j) or (j % self.s.replan_every == 0 and pipeline.replan(self, j)))
        )
        if replanned or (self.p.split == "measured" and j == GREEDY_RESPLIT_AT and pipeline.resplit(self, j)):
            assert self.dep is not None
            if self.update_wait_s(self.dep) is not None:
                self.move_after_update = -j - 1  # its GPUs move once the running update frees them
            else:
                self.q.push(self.q.now_s + self.replanner.move_cost_s, Kind.ROLLOUT_START, -j - 1)
            return
        j = -j - 1 if j < 0 else j
        self._account()
        self.rollout_running = True
        lent = self.lent
        for inst in lent:  # hybrids come back to rollout
            pipeline.wake(self, inst)
        self.lent = []
        self.lent_ready.clear()
        if lent and self.trainer.busy:
            self.trainer.set_gpus(self.q.now_s, pipeline._train_gpus_now(self))
            pipeline.schedule_train(self)
        assert self.sched is not None
        self.sched.on_policy_version(self.policy_clock)
        trajs = self.trajs.pop(j, None) or self.wl.trajectories(j)
        self.trajs[j] = trajs
        self.cur = IterationRecord(
            j,
            rollout_start_s=self.q.now_s,
            trajectories=len(trajs),
            tokens=sum(t.total_tokens for t in trajs),
        )
        self.stats.records.append(self.cur)
        self.unfinished = len(trajs)
        for t in trajs:
            req = SchedRequest(
                t.trajectory_id,
                t.prompt_id,
                t.prompt_tokens,
                j,
                t.turns if self.p.scheduler == "oracle" else None,
            )
            f = Flight(
                t,
                req,
                self.router.clamp(self.sched.admit(req)),
                float(t.prompt_tokens),
                self.q.now_s,
                new_tokens=float(t.prompt_tokens),
            )
            self.bucket_flights[f.bucket] += 1
            if self.p.placement == "round_robin":
                f.pinned = self.router.pin()
            self.route(f)

    def on_decode_done(self, inst: Instance) -> None:
        q = self.q
        now = q.now_s
        for f in inst.pop_done(now):  # each turn's context is released there
            traj, k = f.traj, f.turn
            turns = traj.turns
            turn = turns[k]
            f.ctx += turn.gen_tokens
            f.last = inst
            if turn.tool is None or k == len(turns) - 1:
                self.finish(f)
            else:
                q.push(now + traj.tool_latency_s[k], Kind.TOOL_RETURN, f)
        self._drain(inst)
        self._schedule(inst)
        if self.p.elastic and not inst.heap:
            if inst in self.hybrids:
                pipeline.hybrid_idle(self, inst)
            else:
                pipeline.maybe_lend(self, inst)

    def finish(self, f: Flight) -> None:
        assert self.sched is not None
        tr = f.traj
        self.sched.on_finish(
            FinishedTrajectory(
                tr.trajectory_id, tr.prompt_id, tr.prompt_tokens, tr.iteration, self.policy_clock, tr.turns
            )
        )
        self.stats.latencies_s.append(self.q.now_s - f.admit_s)
        if self.cur:
            served = f.last.bucket if f.last is not None else f.bucket
            self.cur.bucket_end_s[served] = self.q.now_s
        self.unfinished -= 1
        self.bucket_flights[f.bucket] -= 1
        if self.cur and self.cur.trajectories - self.unfinished == math.ceil(0.9 * self.cur.trajectories):
            self.cur.t90_s = self.q.now_s
        if self.unfinished == 0:
            pipeline.on_rollout_done(self)
