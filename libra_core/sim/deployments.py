"""The simulator's deployment: the layout it runs, the plans it may move to, and the GPU-time books.

`SimDeployments` is the base of `Simulator` (engine.py; `SimTurns`, turns.py, in between). It
declares the state the simulator's parts share, which `Simulator.__init__` sets, and holds what
touches a deployment: the planner's view of simulated iterations (`workload_of`), the candidates
`rerank_plans` simulates (`rerank_candidates`, `rerank_alternatives`), applying a deployment
(`deploy`: instances, router and scheduler rebuilt; a C-MLFQ tree survives), the wait of a move
for the running update (`update_wait_s`), and the ledger of GPU-seconds per side (`_account`,
`harvest`). The pipeline (pipeline.py) calls `deploy` when a replan, audit or re-split moves
workers; the engine's parts call `_account` before the split of GPUs between the sides changes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from libra_core.config.models import SchedulerConfig
from libra_core.planner.replan import ReplanPolicy
from libra_core.planner.search import Plan, SearchSettings, search_plans
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.workload import Turns, Workload, workload_from_turns
from libra_core.scheduling.base import Scheduler
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.registry import build_scheduler
from libra_core.sim import pipeline
from libra_core.sim.cmlfq import SimCMLFQScheduler
from libra_core.sim.events import EventQueue
from libra_core.sim.instance import CostTables, Instance
from libra_core.sim.policies import Deployment, PolicySpec
from libra_core.sim.router import Router
from libra_core.sim.settings import SimSettings
from libra_core.sim.stats import IterationRecord, RunStats
from libra_core.sim.training import Trainer
from libra_core.sim.trajectory import SimTrajectory
from libra_core.sim.tree import SimPrefixTree

if TYPE_CHECKING:
    from libra_core.sim.engine import Simulator


class SimDeployments:
    """The deployment half of `Simulator`; the annotations below are the state `Simulator.__init__`
    sets and the engine's parts read and write (single-threaded: one event at a time)."""

    s: SimSettings
    p: PolicySpec
    wl: Any  # the workload: `trajectories(j)` per iteration (workloads.load_scenario)
    model: ModelSpec
    hw: HardwareSpec
    G: int  # GPUs in the cluster
    search: SearchSettings  # the planner's settings for this policy (every plan and price)
    tables: CostTables
    q: EventQueue
    stats: RunStats
    replanner: ReplanPolicy
    trajs: dict[int, list[SimTrajectory]]  # generated iterations not yet replayed, and the current
    sched: Scheduler | None
    dep: Deployment | None
    instances: list[Instance]  # the rollout instances of `dep` (and training hybrids serving rollout)
    router: Router
    trainer: Trainer
    bucket_flights: list[int]  # unfinished trajectories per bucket
    cur: IterationRecord | None  # the iteration whose rollout runs or ran last
    version: int
    rollout_running: bool
    unfinished: int  # trajectories of the current rollout not yet finished
    lent: list[Instance]
    hybrids: list[Instance]
    lent_ready: set[int]
    move_after_update: int | None
    moving_until_s: float
    _ledger_s: float
    _next_id: int

    def rerank_candidates(self, w: Workload) -> list[Plan]:
        """Every split's best plan for workload `w`, best priced first (what `rerank` draws from)."""
        return search_plans(self.model, self.hw, self.G, w, replace(self.search, top_k=self.G))

    def rerank_alternatives(self, w: Workload) -> list[list[Plan]]:
        """Candidate lists `rerank` also simulates: for a heterogeneous policy, with
        `rerank_one_degree`, every split's best one-degree plan (what +planning would run)."""
        if not (self.p.hetero and self.s.rerank_one_degree):
            return []
        one = replace(self.search, top_k=self.G, homogeneous=True, promote=False)
        return [search_plans(self.model, self.hw, self.G, w, one)]

    def workload_of(self, j: int) -> Workload:
        ts = self.trajs.get(j) or self.wl.trajectories(j)
        self.trajs[j] = ts
        return self.workload_of_trajectories(ts, f"iter{j}")

    def workload_of_trajectories(self, ts: list[SimTrajectory], name: str = "sample") -> Workload:
        """The planner's view of simulated trajectories (one iteration's)."""
        turns = Turns(
            [t.prompt_tokens for t in ts],
            [[x.gen_tokens for x in t.turns] for t in ts],
            [[x.payload_tokens for x in t.turns] for t in ts],
            [sum(t.tool_latency_s) for t in ts],
        )
        # A simulated instance keeps a trajectory's prefix cached across its tool calls (only a
        # move to another instance prefills the context again), so the planner prices no re-prefill.
        ids, groups = np.unique([t.prompt_id for t in ts], return_inverse=True)  # one prompt, one group
        # Prompts x group must be the trajectories given, or the workload's weight would scale the
        # update's tokens (a trace of 24 per iteration was priced as 16).
        prompts, group = (len(ids), len(ts) // len(ids)) if len(ts) % len(ids) == 0 else (len(ts), 1)
        return workload_from_turns(name, turns, prompts, group, reprefill_fraction=0.0, group_index=groups)

    def update_wait_s(self, dep: Deployment) -> float | None:
        """How long a move to `dep` waits for the running update, None if it need not: the update
        keeps the GPUs it started on, so a layout with fewer training GPUs waits for its end."""
        tr = self.trainer
        if not (tr.busy and dep.train_gpus < tr.train_gpus):
            return None
        return max(0.0, tr.done_s() - self.q.now_s)

    def harvest(self, instances: list[Instance]) -> None:
        """Collect busy GPU-seconds of instances that are about to be dropped."""
        for inst in instances:
            inst.advance(self.q.now_s)
            self.stats.roll_busy_gpu_s += inst.busy_s * inst.tp
            inst.busy_s = 0.0

    def deploy(self, dep: Deployment) -> None:
        self._account()
        self.harvest(getattr(self, "instances", []))
        self.dep = dep
        self.instances = []
        for tp, bucket in dep.instances:
            self.instances.append(
                Instance(
                    self._next_id, tp, bucket, self.tables, self.tables.kv_capacity[tp], last_s=self.q.now_s
                )
            )
            self._next_id += 1
        self.router = Router(self.instances, dep.num_buckets, self.p.placement, self.s.spill_factor)
        self.bucket_flights = [0] * dep.num_buckets
        cfg = SchedulerConfig(
            type=self.p.scheduler,
            buckets=dep.bucket_bounds,  # type: ignore[arg-type]
            prefill_decode_cost_ratio=self.s.cmlfq_cost_ratio,
        )
        if isinstance(self.sched, CMLFQScheduler):
            self.sched = SimCMLFQScheduler(cfg, tree=self.sched.tree)  # the tree survives a replan
        elif self.p.scheduler == "cmlfq":
            self.sched = SimCMLFQScheduler(cfg, tree=SimPrefixTree.from_config(cfg))
        else:
            self.sched = build_scheduler(cfg, allow_oracle=self.p.scheduler == "oracle")
        self.stats.deployments.append(dep.label())
        # A running update keeps the layout (and GPUs) it started on; the next one starts on the
        # new layout (`try_start_train` sets it).
        if hasattr(self, "trainer") and not self.trainer.busy:
            self.trainer.train_gpus = dep.train_gpus

    def _account(self) -> None:
        """Integrate GPUs per side over time (for idle shares)."""
        now = self.q.now_s
        dt = now - self._ledger_s
        if dt > 0 and self.dep is not None:
            if self.p.colocated:
                side = self.rollout_running
                self.stats.roll_gpu_s += dt * self.G * side
                self.stats.train_gpu_s += dt * self.G * (not side)
            else:
                lent = sum(i.tp for i in self.lent) - sum(i.tp for i in self.hybrids if i.active)
                # The GPUs a running update holds past a move are the first of the spare ones
                # (`pipeline.held_gpus`; both were booked, twice, until 2026-12-06).
                sim = cast("Simulator", self)  # this mixin's one subclass
                moved = lent + max(pipeline.spare_gpus(sim), pipeline.held_gpus(sim))
                self.stats.roll_gpu_s += dt * (self.dep.rollout_gpus - moved)
                self.stats.train_gpu_s += dt * (self.dep.train_gpus + moved)
        self._ledger_s = now
