"""Iteration pipeline of the simulator: rollout/update hand-offs, weight sync, replanning, elastic pool.

Functions over a `Simulator` (engine.py and turns.py hold the per-token rollout path; this file the
per-iteration path); the rules are in engine.py's module docstring.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from libra_core.planner.replan import audit_decision
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import Plan, SearchSettings, search_plans
from libra_core.planner.train_cost import TrainShape
from libra_core.planner.workload import concat
from libra_core.sim.events import Kind
from libra_core.sim.instance import Instance
from libra_core.sim.policies import Deployment, deployment_from_plan, measured_split
from libra_core.sim.rerank import rerank, resimulated, sample_spread
from libra_core.sim.training import HYBRID_EFFICIENCY, UpdateDoesNotFit, update_time_s

if TYPE_CHECKING:
    from libra_core.sim.engine import Simulator


class HybridReturn:
    """HYBRID_READY target: `gpus` of training hybrids back from rollout (`join_s` after leaving it)."""

    __slots__ = ("gpus",)

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus

    def __str__(self) -> str:  # the event trace's label
        return "return"


def on_rollout_done(sim: Simulator) -> None:
    sim._account()
    sim.rollout_running = False
    rec = sim.cur
    assert rec is not None
    rec.rollout_end_s = sim.q.now_s
    if sim.p.replan:
        sim.windows.append(sim.workload_of(rec.iteration))
        del sim.windows[: -sim.s.window_iterations]
    sim.pending_train.append(rec.iteration)
    sim.sample = sim.trajs.get(rec.iteration, [])
    sim.rolled = rec.iteration + 1
    if sim.hybrids:  # training hybrids that served rollout go back (idle now: every trajectory ended)
        _hybrids_to_training(sim, list(sim.hybrids))
    try_start_train(sim)
    try_start_rollout(sim)
    if sim.p.elastic and not sim.rollout_running:
        _lend_while_rollout_waits(sim)


def _lend_while_rollout_waits(sim: Simulator) -> None:
    """The next rollout waits for an update (or none follows): every idle rollout instance joins
    the update as a replica, if the time it saves the update pays for waking it again (`switch_s`).
    They come back at the next rollout start, as instances lent in the tail do. Checked when a
    rollout ends and when an update starts with no rollout running."""
    tr = sim.trainer
    if not tr.busy:
        return
    # Rollout n needs update n - 1 - staleness (version n - staleness); waiting only for the
    # weights of an update that has ended, it starts within the sync: nothing to gain.
    if sim.rolled < sim.iterations and tr.iteration >= sim.rolled - sim.staleness:
        return
    idle = [i for i in sim.instances if i.active and i not in sim.hybrids]
    if not idle or not loan_pays(sim, sum(i.tp for i in idle)):
        return
    sim._account()
    for inst in idle:
        _lend(sim, inst)


def loan_pays(sim: Simulator, gpus: int) -> bool:
    """Whether `gpus` more replicas, ready `join_s` from now, save the running update more time
    than the wake (`switch_s`) they will cost at the next rollout start."""
    tr = sim.trainer
    # The update's work left once they join. Its work may start later (a forced move's GPUs are
    # still moving): that wait is no work they speed up (it was counted, until 2026-12-07).
    left_s = tr.done_s() - max(sim.q.now_s + sim.join_s, tr.started_s)
    attached = spare_gpus(sim) + sum(i.tp for i in sim.lent)  # ready or on their way
    extra = HYBRID_EFFICIENCY * (replica_gpus(sim, attached + gpus) - replica_gpus(sim, attached))
    return left_s * extra / (tr.rate() * tr.core_time_s * tr.train_gpus + extra) > sim.switch_s


def _lend(sim: Simulator, inst: Instance) -> None:
    inst.active = False
    inst.loans += 1  # a loan given back before it joined leaves its ready behind: it is dropped
    sim.lent.append(inst)
    sim.q.push(sim.q.now_s + sim.join_s, Kind.HYBRID_READY, inst, inst.loans)


def try_start_rollout(sim: Simulator) -> None:
    j = sim.rolled
    if j >= sim.iterations or sim.rollout_running or sim.version < j - sim.staleness:
        return
    if sim.p.colocated and (sim.trainer.busy or sim.pending_train):
        return
    sim._account()
    sim.rollout_running = True
    # A forced move (try_start_train) is still moving GPUs: the rollout starts on the new layout.
    sim.q.push(max(sim.q.now_s, sim.moving_until_s), Kind.ROLLOUT_START, j)


def replica_gpus(sim: Simulator, gpus: int) -> int:
    """The GPUs of `gpus` extra ones (spare or lent, beyond the core) that train: whole data-parallel
    replicas of the training layout (tp x pp GPUs each), as hybrids join (DESIGN.md). Until
    2026-12-06 every GPU counted, 1 lent GPU as 1/8 of a TP8 replica."""
    assert sim.dep is not None
    replica = sim.dep.train_layout.tp * sim.dep.train_layout.pp
    return gpus - gpus % replica


def lent_ready_gpus(sim: Simulator) -> int:
    return sum(i.tp for i in sim.lent if i.instance_id in sim.lent_ready)


def spare_gpus(sim: Simulator) -> int:
    """Elastic: rollout GPUs no instance holds, which train as replicas (`_train_gpus_now`)."""
    assert sim.dep is not None
    return sim.dep.spare_gpus if sim.p.elastic else 0


def held_gpus(sim: Simulator) -> int:
    """GPUs a running update keeps beyond the deployment's training side: it keeps the core it
    started on (`trainer.train_gpus`) until it ends, and a move that gave some of them to rollout
    waits for it. No instance holds them, so they are the first of the layout's spare GPUs."""
    assert sim.dep is not None
    return max(0, sim.trainer.train_gpus - sim.dep.train_gpus) if sim.trainer.busy else 0


def _train_gpus_now(sim: Simulator) -> float:
    """GPUs on the update: its core (the one it started on, less training hybrids on their way
    back), plus whole replicas of the spare GPUs it does not already hold and of the lent instances
    that joined. Until 2026-12-06 the core was the current deployment's, so a replan to fewer
    training GPUs shrank a running update, and a replan kept the old spare GPUs in it."""
    extra = replica_gpus(sim, max(0, spare_gpus(sim) - held_gpus(sim)) + lent_ready_gpus(sim))
    return sim.trainer.train_gpus - sim.returning_gpus + extra


def try_start_train(sim: Simulator) -> None:
    if sim.trainer.busy or not sim.pending_train:
        return
    assert sim.dep is not None
    j = sim.pending_train[0]
    shape = TrainShape.from_workload(sim.workload_of(j))
    who = f"{sim.p.name}, iteration {j}'s update"
    # Colocated: rollout engines sleep, training states come back to HBM, before the update's work
    # (until 2026-12-07 that switch was booked as training busy, and the wake after it as idle).
    setup_s = sim.switch_s if sim.p.colocated else 0.0
    try:
        t = update_time_s(sim.model, sim.hw, sim.dep.train_layout, shape, who)
    except UpdateDoesNotFit as err:
        if not (sim.p.replan and sim.dep.plan is not None):
            raise
        if sim.rollout_running:
            return  # no move under a running rollout: the update waits for its end (on_rollout_done)
        if not replan(sim, j, forced=True):
            found = f"replanning at once found no plan on {sim.G} GPUs that does"
            raise UpdateDoesNotFit(f"{err}; {found}") from err
        t = update_time_s(sim.model, sim.hw, sim.dep.train_layout, shape, who)
        setup_s = sim.replanner.move_cost_s  # the update (and the next rollout) wait for the move
        sim.moving_until_s = sim.q.now_s + setup_s
    sim.pending_train.pop(0)
    sim._account()  # the ledger books a running update's GPUs (engine._account): close the interval
    sim.trainer.train_gpus = sim.dep.train_gpus
    sim.trainer.start(sim.q.now_s, j, t, _train_gpus_now(sim), setup_s)
    schedule_train(sim)


def schedule_train(sim: Simulator) -> None:
    if sim.trainer.busy:
        t = sim.trainer.done_s()
        if math.isfinite(t):
            sim.q.push(t, Kind.TRAIN_DONE, sim.trainer.iteration, sim.trainer.version)


def on_train_done(sim: Simulator, _: object = None) -> None:
    now = sim.q.now_s
    sim._account()
    j = sim.trainer.finish(now)
    if sim.move_after_update is not None:  # the move waited for these GPUs; the rollout for the move
        sim.q.push(now + sim.replanner.move_cost_s, Kind.ROLLOUT_START, sim.move_after_update)
        sim.move_after_update = None
    delay = sim.t_sync + (sim.switch_s if sim.p.colocated else 0.0)
    records = sim.stats.records
    records[j].train_end_s = now + delay
    records[j].train_s = now - sim.trainer.started_s
    if j > 0 and records[j - 1].train_end_s > 0:  # one iteration's period of the pipeline
        sim.audit.record(j, records[j].tokens, records[j].train_end_s - records[j - 1].train_end_s)
    sim.q.push(now + delay, Kind.WEIGHTS_READY, j)
    sim.trajs.pop(j, None)
    if sim.on_iteration is not None:
        sim.on_iteration(j + 1)
    if sim.p.elastic and not sim.rollout_running and _rollout_waits_for(sim, j):
        # The next rollout starts when these weights are synced: lent instances start their wake
        # now, overlapping the sync, instead of training the next update for the sync's length
        # and waking at the rollout start.
        _lent_back_to_rollout(sim)
    if sim.p.elastic and sim.rollout_running and not sim.pending_train:
        _lent_back_to_rollout(sim)
        # Hybrids take only new, moved or waiting turns (a turn stays with the instance holding
        # its prefix): with none waiting they would idle there and rejoin the next update late.
        if not sim.hybrids and any(sim.router.queues):
            _hybrids_to_rollout(sim)
    try_start_train(sim)
    if sim.p.elastic and not sim.rollout_running:  # the update just started may be worth a loan
        _lend_while_rollout_waits(sim)


def _rollout_waits_for(sim: Simulator, j: int) -> bool:
    """Whether the next rollout can start once update `j`'s weights are synced (and not before)."""
    return sim.rolled < sim.iterations and j + 1 >= sim.rolled - sim.staleness > sim.version


def _lent_back_to_rollout(sim: Simulator) -> None:
    """Lent instances wake now, ready `switch_s` later: when no update follows during a rollout (they
    serve its rest and start the next one ready), or when the next rollout waits only for the
    weights of the update that just ended (the wake overlaps the sync)."""
    if not sim.lent:
        return
    sim._account()
    for inst in sim.lent:
        wake(sim, inst)
        sim._drain(inst)
        sim._schedule(inst)
    sim.lent = []
    sim.lent_ready.clear()


def wake(sim: Simulator, inst: Instance) -> None:
    """A lent instance serves rollout again after the switch (`wake_s` + moving the weights)."""
    now = sim.q.now_s
    inst.active = True
    inst.advance(now)
    inst.stall_until_s = max(inst.stall_until_s, now + sim.switch_s)


def _hybrids_to_rollout(sim: Simulator) -> None:
    """The training GPUs beyond the core half serve the rest of the rollout (longest bucket's TP)."""
    assert sim.dep is not None
    lay = sim.dep.train_layout
    replica = lay.tp * lay.pp
    hybrid_gpus = sim.dep.train_gpus - replica * math.ceil(lay.dp / 2)
    bucket = max(b for _, b in sim.dep.instances)
    tp = max(tp for tp, b in sim.dep.instances if b == bucket)
    for _ in range(hybrid_gpus // tp):
        inst = Instance(sim._next_id, tp, bucket, sim.tables, sim.tables.kv_capacity[tp], last_s=sim.q.now_s)
        sim._next_id += 1
        inst.active = False
        sim.instances.append(inst)
        sim.router.by_bucket[bucket].append(inst)
        sim.hybrids.append(inst)
        sim.q.push(sim.q.now_s + sim.switch_s, Kind.HYBRID_READY, inst)


def _hybrids_to_training(sim: Simulator, hybrids: list[Instance]) -> None:
    """Training hybrids leave rollout now; their GPUs rejoin the update `join_s` later."""
    sim.harvest(hybrids)
    for inst in hybrids:
        # Retired: a turn whose prefix it held is re-prefilled elsewhere (`Router.holder` keeps a
        # turn only on an active instance); before 2026-12-06 it stayed active, and such turns
        # ran on it after it had left, its busy time unbooked and its GPUs counted on both sides.
        inst.active = False
        sim.router.by_bucket[inst.bucket].remove(inst)
        sim.instances.remove(inst)
        sim.hybrids.remove(inst)
    gpus = sum(i.tp for i in hybrids)
    sim.returning_gpus += gpus
    sim.q.push(sim.q.now_s + sim.join_s, Kind.HYBRID_READY, HybridReturn(gpus))


def hybrid_idle(sim: Simulator, inst: Instance) -> None:
    """A training hybrid with nothing to serve (no turn running, none waiting for it or its bucket)
    goes back to training now rather than at the rollout's end: idle until then, it would rejoin
    the next update `join_s` late. Turns whose prefix it held are re-prefilled elsewhere."""
    if inst.heap or sim.router.pinned_queues[inst.instance_id] or sim.router.queues[inst.bucket]:
        return
    sim._account()
    _hybrids_to_training(sim, [inst])
    sim.stats.hybrid_early_returns += 1


def on_weights_ready(sim: Simulator, _: object = None) -> None:
    sim.version += 1
    try_start_rollout(sim)


def on_hybrid_ready(sim: Simulator, target: object) -> None:
    now = sim.q.now_s
    if isinstance(target, HybridReturn):
        sim.returning_gpus -= target.gpus
        if sim.trainer.busy:
            sim.trainer.set_gpus(now, _train_gpus_now(sim))
            schedule_train(sim)
        return
    assert isinstance(target, Instance)
    if target in sim.lent:  # an idle rollout instance joins the update as a replica
        sim.lent_ready.add(target.instance_id)
        if sim.trainer.busy:
            sim.trainer.set_gpus(now, _train_gpus_now(sim))
            schedule_train(sim)
            sim.stats.lent_joins += 1
    elif target in sim.hybrids and sim.rollout_running:  # a training hybrid starts serving rollout
        sim._account()
        target.active = True
        sim.stats.hybrid_rollouts += 1
        sim._drain(target)
        sim._schedule(target)
        hybrid_idle(sim, target)  # the turns it was made for were served meanwhile


def maybe_lend(sim: Simulator, inst: Instance) -> None:
    """Lend an idle instance in the rollout's tail to the running update (elastic pool)."""
    b = inst.bucket
    if not (sim.rollout_running and sim.trainer.busy and inst.active) or inst in sim.hybrids:
        return
    if sim.unfinished == 0:  # the rollout just ended (the next one may be starting this instant)
        return
    others = sim.router.active_in(b) - 1
    if others < 1 or sim.router.queues[b] or sim.bucket_flights[b] > others:
        return
    if not loan_pays(sim, inst.tp):
        return  # the update ends too soon after a replica could join to pay for its wake
    sim._account()
    _lend(sim, inst)


def resplit(sim: Simulator, j: int) -> bool:
    """greedy's one re-split from measured stage times (policies.measured_split); True if it moved
    workers (the rollout start then waits for the move, as after a replan)."""
    dep = sim.dep
    assert dep is not None
    done = [r for r in sim.stats.records if r.rollout_end_s > 0]
    trained = [r for r in done if r.train_s > 0]
    if not done or not trained:
        return False
    rollout_s = sum(r.rollout_end_s - r.rollout_start_s for r in done) / len(done)
    train_s = sum(r.train_s for r in trained) / len(trained)
    window = concat([sim.workload_of(r.iteration) for r in done], name=f"measured@{j}")
    roll_gpu_s, train_gpu_s = rollout_s * dep.rollout_gpus, train_s * dep.train_gpus
    new = measured_split(sim.model, sim.hw, sim.G, window, sim.search, roll_gpu_s, train_gpu_s)
    moves = new.train_gpus != dep.train_gpus
    # The record has the replanner's keys (ReplanDecision), so reports and diagnostics read both.
    guess_s = max(roll_gpu_s / new.rollout_gpus, train_gpu_s / new.train_gpus)  # linear scaling
    sim.stats.replans.append(
        {
            "iteration": j,
            "action": "apply" if moves else "keep",
            "reason": f"greedy re-split: measured rollout {rollout_s:.1f}s, update {train_s:.1f}s",
            "current_t_iter_s": max(rollout_s, train_s),
            "proposed_t_iter_s": guess_s,
            "move_cost_s": sim.replanner.move_cost_s if moves else 0.0,
            "current_split": dep.label(),
            "proposed_split": new.label(),
        }
    )
    if moves:
        _redeploy(sim, new)
    return moves


def replan(sim: Simulator, j: int, forced: bool = False) -> bool:
    """Run the planner on the recent window; True if a plan that moves workers was applied.
    `forced` (try_start_train): iteration `j`'s update fits no layout on the running plan's training
    GPUs, so the replan cannot wait until it is due, nor for a pending move's audit (that move is
    dropped unjudged: going back would be to a plan older than a workload it may not hold either),
    and a plan the audit refuses is still taken when no other is found. Until 2026-12-07 such an
    update stopped the policy ("could not run") unless it fell on a due replan."""
    dep = sim.dep
    assert dep is not None and dep.plan is not None and sim.windows
    if sim.audit.pending and not forced:  # as the plan stage does: a second move would replace its audit
        return False
    if forced:
        sim.audit.drop()
        sim.before_move = None
    window = concat(sim.windows, name=f"window@{j}")

    def ok(plan: Plan) -> bool:  # not the resources of a move the audit reverted
        return not sim.audit.refuses(plan, j)

    # Online calibration, as the plan stage does (planner/service.py): the rollout the running plan
    # was predicted to take on this window vs the rollouts measured over it (routing, queueing and
    # the long tail the segment table only bounds); the factor scales every candidate's T_rollout.
    predicted = evaluate_plan(dep.plan, sim.model, sim.hw, window, sim.search).t_rollout_s
    recent = [r for r in sim.stats.records if r.rollout_end_s > 0][-len(sim.windows) :]
    measured = sum(r.rollout_end_s - r.rollout_start_s for r in recent) / max(1, len(recent))
    if math.isfinite(predicted) and predicted > 0 and measured > 0:
        sim.correction.observe("rollout", predicted, measured)
    settings = replace(sim.search, corrections={"rollout": sim.correction.factor("rollout")})
    now_plan = evaluate_plan(dep.plan, sim.model, sim.hw, window, settings)
    if sim.s.rerank_plans and sim.sample:
        # Simulated prices need no calibration: the candidates and the running plan all run the
        # last rollout's trajectories (sim/rerank.py).
        candidates = rerank(sim, sim.rerank_candidates(window), sim.sample, sim.rerank_alternatives(window))
        ranked = [(p, d) for p, d in candidates if ok(p)] or (candidates if forced else [])
        if math.isfinite(now_plan.t_iter_s):  # a plan that cannot run has no simulation either
            now_plan = resimulated(sim, now_plan, dep, sim.sample, sample_spread(sim, sim.sample))
    else:
        found = search_plans(sim.model, sim.hw, sim.G, window, settings)
        proposed = [p for p in found if ok(p)] or (found if forced else [])
        ranked = [(p, deployment_from_plan(sim.p, p, sim.model, sim.hw, settings)) for p in proposed[:1]]
    if not ranked:
        return False
    best, best_dep = ranked[0]
    margin = sim.audit.extra_margin(j)
    # The move's real cost: a move that takes GPUs from a running update waits for it to end
    # (engine.on_rollout_start); it amortises over the iterations the run has left.
    wait_s = sim.update_wait_s(best_dep) or 0.0
    decision = sim.replanner.decide(
        j,
        dep.plan,
        now_plan,
        best,
        window,
        move_cost_s=sim.replanner.move_cost_s + wait_s,
        extra_gain_fraction=margin,
        iterations_left=sim.iterations - j,
    )
    if forced:
        why = f"iteration {j}'s update does not fit the running plan's training GPUs; {decision.reason}"
        decision = replace(decision, reason=why)
    sim.stats.replans.append(decision.as_record())
    if decision.action != "apply":
        _adopt_repriced(sim, now_plan, settings)
        return False
    if decision.move_cost_s > 0 and math.isfinite(now_plan.t_iter_s):  # never back to a plan that cannot run
        sim.audit.moved(j, dep.plan, best, decision.saving_per_iter_s / now_plan.t_iter_s)
        sim.before_move = dep
    _redeploy(sim, best_dep)
    return decision.move_cost_s > 0


def _adopt_repriced(sim: Simulator, now_plan: Plan, settings: SearchSettings) -> None:
    """A kept plan runs as re-priced on the window, as the live planner keeps it (`PlannerService`):
    the same GPU groups with the window's length ranges and training memory settings. Nothing
    moves; the instances restart with the new buckets as after a free apply. Until 2026-12-07 the
    simulator kept the old ranges and settings while the planner priced the new ones."""
    dep = sim.dep
    assert dep is not None and dep.plan is not None
    if not now_plan.same_gpu_groups(dep.plan):
        return  # a degree left with no lengths: keeping means the running instances
    kept = deployment_from_plan(sim.p, now_plan, sim.model, sim.hw, settings)

    def deployed(d: Deployment) -> tuple[object, ...]:
        return (d.train_layout, d.instances, d.bucket_bounds)

    if deployed(kept) != deployed(dep):
        _redeploy(sim, kept)


def audit_move(sim: Simulator, j: int) -> bool:
    """Audit the last applied move (planner/audit.py); True if it was reverted (workers move back)."""
    verdict = sim.audit.verdict(j)
    if verdict is None:
        return False
    window = concat(sim.windows, name=f"window@{j}")
    record = audit_decision(j, verdict, window, sim.replanner, sim.replanner.move_cost_s)
    back, sim.before_move = sim.before_move, None
    plan = back.plan if verdict.action == "revert" and back is not None else None
    price = evaluate_plan(plan, sim.model, sim.hw, window, sim.search) if plan is not None else None
    if price is not None and not math.isfinite(price.t_iter_s):
        # As the live planner (service.py): the plan before the move cannot run the window any
        # more, so the move stays and its plan is not refused.
        sim.audit.keep_reverted(verdict)
        why = f"{record.reason}; kept: the plan before the move cannot run the window (memory)"
        record, back = replace(record, action="confirm", reason=why), None
    sim.stats.replans.append(record.as_record())
    if verdict.action != "revert" or back is None:
        return False
    _redeploy(sim, back)
    return True


def _redeploy(sim: Simulator, dep: Deployment) -> None:
    sim.lent, sim.hybrids = [], []
    sim.lent_ready.clear()
    sim.deploy(dep)
    if sim.trainer.busy:  # its core stays; lent instances and the old layout's spare GPUs go
        sim.trainer.set_gpus(sim.q.now_s, _train_gpus_now(sim))
    schedule_train(sim)
