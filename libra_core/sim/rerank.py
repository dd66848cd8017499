"""Re-ranking the planner's candidate plans by simulating their rollout (`SimSettings.rerank_plans`).

The planner prices a rollout layout analytically: per length range, the slower of its critical path and
its work per instance (planner/rollout_cost.py). Where that price is off, the planner ranks its
candidates wrongly. Measured on r2e-gym with 96 prompts per iteration (`benchmarks/sim_rerank.py`): one
TP1 instance's KV cache caps its batch, so the price of every split from 13 to 24 rollout GPUs is the
same 1,098 s while the simulated rollout falls from 1,469 s to 979 s, and the planner gives training 32
of 48 GPUs. With `rerank_plans = k`, a planner-driven policy takes the planner's k best plans, plus the
best-priced plan at rollout-GPU counts spread over the cluster and refined around the fastest
(`rerank`), and simulates one iteration of the planning workload's trajectories on each: the deployment
it would run, with the same router and scheduler, a fresh C-MLFQ tree, no replanning and no elastic
pool. Each candidate's rollout time becomes the simulated one; training, weight sync and the spread stay
as priced; the candidates are ranked by that iteration time. Vidur-Search picks inference configurations
by simulation the same way.

Caveat, stated wherever its numbers appear: inside this simulator the evaluator and the world are one
model, so a re-ranked plan is as good as the simulator is faithful; a real deployment would replay
measured trajectories through it. A fresh C-MLFQ tree knows nothing, so C-MLFQ's routing is valued as it
behaves at the run's first iteration, not with the tree the run has grown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from libra_core.planner.assignment import Assignment, Group
from libra_core.planner.iteration import iteration_time_s
from libra_core.planner.rollout_cost import instance_tp_degrees
from libra_core.planner.search import Plan, iteration_spread
from libra_core.planner.spread import Spread
from libra_core.sim.policies import Deployment, deployment_from_plan
from libra_core.sim.trajectory import SimTrajectory

if TYPE_CHECKING:
    from libra_core.sim.engine import Simulator


class _OneIteration:
    """A workload whose every iteration is the given trajectories (the planner's sample)."""

    def __init__(self, trajectories: list[SimTrajectory], spec: Any) -> None:
        self._trajectories = trajectories
        self.spec = spec

    def trajectories(self, iteration: int) -> list[SimTrajectory]:
        return self._trajectories


def simulated_rollout_s(sim: Simulator, dep: Deployment, trajectories: list[SimTrajectory]) -> float:
    """Seconds one rollout of `trajectories` takes on `dep` under `sim`'s policy and settings."""
    from libra_core.sim.engine import Simulator

    policy = replace(sim.p, replan=False, elastic=False)
    settings = replace(sim.s, rerank_plans=0)
    wl = _OneIteration(trajectories, getattr(sim.wl, "spec", None))
    probe = Simulator(policy, wl, sim.model, sim.hw, sim.G, 1, settings=settings, deployment=dep)
    rec = probe.run().records[0]
    return rec.rollout_end_s - rec.rollout_start_s


def rerank(
    sim: Simulator,
    plans: list[Plan],
    trajectories: list[SimTrajectory],
    alternatives: Sequence[list[Plan]] = (),
) -> list[tuple[Plan, Deployment]]:
    """Simulated candidates from `plans` (every split's, best priced first), each with the
    deployment it runs, fastest iteration first; the planner's first stays first unless another is
    faster by more than `min_gain_fraction` of its time (one sampled iteration is noisy: a 1% win on
    it did not hold over 20 r2e-gym iterations, docs/simulator-notebook.md).

    Candidates (k = `rerank_plans`): the planner's k best; the best-priced plan at k rollout-GPU
    counts spread evenly over the cluster; then, twice, at the counts half the previous spacing
    either side of the fastest so far. Where the price does not change with the split (r2e-gym
    with 96 prompts: 1,098 s on 13 to 24 rollout GPUs), the planner's k best are the splits that
    give training the most, and the split the simulation prefers is not among them.

    `alternatives`: other candidate lists (every split's, best priced first) explored the same way
    and ranked with the planner's own, e.g. the one-degree layouts for a heterogeneous policy
    (`Simulator.rerank_alternatives`): its search prices its mixed layouts optimistically, so a
    mixed layout that runs slower than one degree would otherwise win on price alone.

    With `SimSettings.rerank_degrees`, the two fastest one-degree candidates are also simulated on
    every other TP degree at their split (`degree_variants`)."""
    k, n = sim.s.rerank_plans, sim.G
    assert k >= 1, f"rerank needs SimSettings.rerank_plans >= 1, got {k}"
    spread = sample_spread(sim, trajectories)
    done: dict[tuple[object, ...], tuple[Plan, Deployment]] = {}

    def run(batch: list[Plan]) -> None:
        for plan in batch:
            dep = deployment_from_plan(sim.p, plan, sim.model, sim.hw, sim.search)
            key = (dep.train_gpus, dep.train_layout, dep.instances, dep.bucket_bounds)
            if key not in done:  # a split the search reached twice is simulated once
                done[key] = (resimulated(sim, plan, dep, trajectories, spread), dep)

    def explore(family: list[Plan]) -> None:
        best_at: dict[int, Plan] = {}
        for plan in family:
            best_at.setdefault(plan.rollout_gpus, plan)
        if not best_at:
            return
        counts = sorted(best_at)

        def nearest(target: float) -> Plan:
            return best_at[min(counts, key=lambda c: abs(c - target))]

        run(family[:k])
        spacing = n / (k + 1)
        run([nearest(spacing * i) for i in range(1, k + 1)])
        for _ in range(2):
            spacing /= 2
            centre = _ranked(done.values())[0][0].rollout_gpus
            run([nearest(centre - spacing), nearest(centre + spacing)])

    explore(plans)
    if not done:
        return []
    first = next(iter(done.values()))
    for family in alternatives:
        explore(family)
    if sim.s.rerank_degrees:
        # The searches keep one degree per split (the best priced), and the one-group price is flat
        # in the split under load (module docstring), so the degree the simulation prefers at the
        # fastest splits may never be drawn: try every degree there.
        one_degree = [p for p, _ in _ranked(done.values()) if len(p.rollout.groups) == 1]
        run([v for p in one_degree[:2] for v in degree_variants(p, instance_tp_degrees(sim.model, sim.hw))])
    out = _ranked(done.values())
    if out[0][0].t_iter_s >= first[0].t_iter_s * (1.0 - sim.s.min_gain_fraction):
        out.remove(first)
        out.insert(0, first)
    return out


def degree_variants(plan: Plan, tps: Sequence[int]) -> list[Plan]:
    """One-degree `plan` (one group, every length) on each other degree of `tps` that fits its
    rollout GPUs, as many instances as fit; the rollout price is the original's (`resimulated`
    replaces it)."""
    (g,) = plan.rollout.groups
    out = []
    for tp in tps:
        n = plan.rollout_gpus // tp
        if tp != g.tp and n >= 1:
            group = Group(tp, n, g.start_bin, g.end_bin, g.time_s)
            out.append(replace(plan, rollout=Assignment(plan.rollout.makespan_s, n * tp, (group,))))
    return out


def _ranked(pairs: Iterable[tuple[Plan, Deployment]]) -> list[tuple[Plan, Deployment]]:
    return sorted(pairs, key=lambda pd: (pd[0].t_iter_s, pd[0].t_rollout_s + pd[0].t_train_s))


def sample_spread(sim: Simulator, trajectories: list[SimTrajectory]) -> Spread | None:
    """The spread the planner prices `trajectories` with (None when `sim` plans for the mean)."""
    return iteration_spread(sim.model, sim.hw, sim.workload_of_trajectories(trajectories), sim.search)


def resimulated(
    sim: Simulator, plan: Plan, dep: Deployment, trajectories: list[SimTrajectory], spread: Spread | None
) -> Plan:
    """`plan` with the rollout `dep` takes on `trajectories` in place of the priced one; its iteration
    time under `spread` (`sample_spread` of the same trajectories)."""
    t_r = simulated_rollout_s(sim, dep, trajectories)
    t_iter = iteration_time_s(
        t_r, plan.t_train_s, plan.t_sync_s, plan.staleness, plan.colocated, spread, sim.search.sync_overlaps
    )
    return replace(plan, t_rollout_s=t_r, t_iter_s=t_iter)
