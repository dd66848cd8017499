"""Simulator tests: event order, determinism, golden trace, lower bound, every policy, real scheduler."""

from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from libra_core.planner.assignment import Assignment, Group
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.sim import POLICIES, pipeline, simulate
from libra_core.sim.engine import STEPS_PER_UPDATE, Simulator
from libra_core.sim.events import EventQueue, Kind
from libra_core.sim.instance import Instance
from libra_core.sim.policies import GREEDY_RESPLIT_AT, deployment_from_plan, measured_split
from libra_core.sim.settings import SimSettings
from libra_core.sim.stats import IterationRecord
from libra_core.sim.workloads import SCENARIOS, ScenarioWorkload, long_tail_share
from tests.sim.builders import OLD_PRICES, OLD_SHAPES, build_sim


def _sim(policy: str, iterations: int = 2, record: bool = False, gpus: str = "8xA800") -> Simulator:
    return build_sim("tiny", policy, iterations, gpus=gpus, record_events=record)


def test_event_order_is_time_then_priority_then_sequence() -> None:
    q = EventQueue()
    q.push(2.0, Kind.DECODE_DONE, "late")
    q.push(1.0, Kind.DECODE_DONE, "a")
    q.push(1.0, Kind.TRAIN_DONE, "b")
    q.push(1.0, Kind.DECODE_DONE, "c")
    order = []
    while (ev := q.pop()) is not None:
        order.append(ev.target)
    assert order == ["b", "a", "c", "late"]


def test_event_in_the_past_is_rejected() -> None:
    q = EventQueue()
    q.push(5.0, Kind.TOOL_RETURN)
    q.pop()
    with pytest.raises(AssertionError, match="before now"):
        q.push(1.0, Kind.TOOL_RETURN)


# Golden trace of `tiny` x 2 iterations on 8xA800 under `greedy`; regenerate only on purpose.
GOLDEN_HEAD = [
    (0.0, "ROLLOUT_START:0"),
    (0.21241, "DECODE_DONE:3"),
    (0.232756, "DECODE_DONE:0"),
    (0.239538, "DECODE_DONE:2"),
    (0.286908, "DECODE_DONE:3"),
    (0.314029, "DECODE_DONE:0"),
]
GOLDEN_EVENTS = 257
GOLDEN_SHA = "42ca5574438d4105"


def _trace_digest(log: list[tuple[float, str]]) -> str:
    return hashlib.sha256(repr(log).encode()).hexdigest()[:16]


def test_golden_trace() -> None:
    """Pinned values unchanged by the router's cross-bucket stickiness (greedy has one bucket), the
    tuple events (same `(time, priority, sequence)` key) and calibrated replanning (greedy never
    replans); regenerate only when the engine's timing model changes on purpose. Last regenerated
    when the segment table began pricing each instance's share of a range: greedy's homogeneous
    TP for `tiny` went from 1xTP4 to 4xTP1; the digest changed when a DP rank came to do at least its
    longest sequence's work (`train_cost.longest_sequence_flops`): the last update ends 9 ms later
    (TRAIN_DONE:1 29.877479 -> 29.886593 s, WEIGHTS_READY:1 after it), every other event the same;
    and again when each optimizer step came to be floored at its own longest sequence, not the
    iteration's (`step_longest.StepLongest`): TRAIN_DONE:1 29.886593 -> 29.879993 s, WEIGHTS_READY:1
    after it, every other event the same; and when a rank's micro-batch tokens (and their TP
    traffic) came to follow the step's longest too (`train_cost.estimate_train`, 2026-12-07):
    TRAIN_DONE:1 29.879993 -> 29.879758 s, WEIGHTS_READY:1 after it, every other event the same."""
    sim = _sim("greedy", record=True)
    sim.run()
    log = sim.q.log
    assert log is not None
    assert log[: len(GOLDEN_HEAD)] == GOLDEN_HEAD
    assert len(log) == GOLDEN_EVENTS
    assert _trace_digest(log) == GOLDEN_SHA


def test_same_seed_same_result_and_seed_matters() -> None:
    a = simulate("tiny", "8xA800", 2, ["greedy", "+cmlfq"], seed=3)
    b = simulate("tiny", "8xA800", 2, ["greedy", "+cmlfq"], seed=3)
    c = simulate("tiny", "8xA800", 2, ["greedy"], seed=4)
    assert [r.makespan_s for r in a.results] == [r.makespan_s for r in b.results]
    assert [r.iteration_s for r in a.results] == [r.iteration_s for r in b.results]
    assert c.results[0].makespan_s != a.results[0].makespan_s


@pytest.mark.parametrize("policy", list(POLICIES))
def test_each_policy_runs_and_respects_the_lower_bound(policy: str) -> None:
    report = simulate("tiny", "8xA800", 2, [policy], seed=0)
    r = report.results[0]
    assert len(r.iteration_s) == 2 and all(t > 0 for t in r.iteration_s)
    assert 0.0 <= r.rollout_idle_share <= 1.0 and 0.0 <= r.train_idle_share <= 1.0
    assert report.lower_bound_s <= r.makespan_s
    assert r.tokens_per_s <= report.lower_bound_tokens_per_s


@pytest.mark.parametrize("policy", list(POLICIES))
def test_run_creates_no_cyclic_garbage(policy: str) -> None:
    """`Simulator.run` turns the cyclic garbage collector off, which keeps memory bounded only while
    everything a run drops is freed by reference counting: a reference cycle in an event handler
    would leak once per event. Other threads of the test process (servers started by earlier tests)
    may drop a few cycles of their own meanwhile, so the check is that the garbage found does not
    scale with the run: a per-event cycle leaves at least one unreachable object per event."""
    sim = _sim(policy, iterations=8)
    gc.collect()
    enabled = gc.isenabled()
    sim.run()
    assert gc.isenabled() == enabled  # the collector's state is restored
    assert sim.stats.events >= 1000
    assert gc.collect() < sim.stats.events // 10


def test_cmlfq_router_uses_the_real_tree() -> None:
    sim = _sim("+cmlfq", iterations=3)
    sim.run()
    assert isinstance(sim.sched, CMLFQScheduler)
    assert sim.sched.tree.num_nodes() > 10  # the tree grew from the finished trajectories
    assert sim.sched.counters.decisions > 0
    # Its clock counts optimizer steps, as a live run's: rollout 2 ran on the weights of one or two
    # updates of STEPS_PER_UPDATE steps each (it counted updates before, aging 4x slower).
    assert STEPS_PER_UPDATE == 4
    assert sim.sched.tree.version in (4, 8)


def test_unknown_policy_and_scenario_raise() -> None:
    with pytest.raises(ValueError, match="valid"):
        simulate("tiny", "8xA800", 1, ["nope"])
    with pytest.raises(ValueError, match="valid"):
        simulate("nope", "8xA800", 1, ["greedy"])


def test_r2e_workload_is_long_tailed_and_drifts() -> None:
    wl = ScenarioWorkload(SCENARIOS["r2e-gym"], 100, seed=0)
    first, last = wl.trajectories(0), wl.trajectories(99)
    assert len(first) == 512
    sizes = [t.total_tokens for t in first]
    assert long_tail_share(sizes) > 0.15  # by tokens; the paper's >50% is by rollout time (test_sim_ordering)
    mean = lambda ts: sum(t.total_tokens for t in ts) / len(ts)  # noqa: E731
    assert mean(last) > 1.15 * mean(first)


def test_sim_cmlfq_is_the_real_scheduler_decision_for_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's fused C-MLFQ decision and lazy tree lookup (sim/tree.py) change speed only:
    the same run with the library's CMLFQScheduler and PrefixTree gives identical results."""
    import libra_core.sim.deployments as deployments
    from libra_core.scheduling.prefix_tree import PrefixTree

    def run() -> tuple[list[float], tuple[int, ...]]:
        sim = _sim("+cmlfq", iterations=4)
        sim.run()
        assert isinstance(sim.sched, CMLFQScheduler)
        c = sim.sched.counters
        ends = [r.train_end_s for r in sim.stats.records]
        return ends, (c.decisions, c.low_support, c.disagree, c.too_costly, c.moves)

    fast = run()
    monkeypatch.setattr(deployments, "SimCMLFQScheduler", CMLFQScheduler)
    monkeypatch.setattr(deployments, "SimPrefixTree", PrefixTree)
    assert run() == fast
    assert fast[1][0] > 0 and fast[1][0] > fast[1][2]  # decisions were made, not all low-support


def test_lower_bound_is_the_larger_of_work_and_path() -> None:
    report = simulate("tiny", "8xA800", 2, ["greedy"], seed=0)
    assert report.lower_bound_path_s > 0 and report.lower_bound_work_s > 0
    assert report.lower_bound_s == max(report.lower_bound_work_s, report.lower_bound_path_s)
    r = report.results[0]
    assert 0.0 <= r.tail_time_share <= 1.0 and 0.0 < r.long_tail_share <= 1.0


def test_write_produces_valid_pngs(tmp_path: Path) -> None:
    report = simulate("tiny", "8xA800", 2, ["greedy", "+cmlfq"], seed=0)
    paths = report.write(tmp_path)
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {p.name for p in pngs} == {"throughput.png", "iterations.png"}
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert (tmp_path / "summary.json").exists()


def test_simulate_writes_to_a_folder_given_as_text(tmp_path: Path) -> None:
    report = simulate("tiny", "8xA800", 2, ["greedy"], seed=0, out_dir=str(tmp_path / "out"))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["results"][0]["policy"] == "greedy"
    assert summary["results"][0]["tokens_per_s"] == pytest.approx(report.result("greedy").tokens_per_s)


def test_move_reprefill_and_spill_factor_settings_change_a_run_with_moves() -> None:
    def run(settings: SimSettings) -> tuple[int, float]:
        shape = OLD_SHAPES["search-r1"]  # the case was found on the generator's earlier shape
        report = simulate(
            "search-r1", "24xA800", 2, ["+hetero-tp"], seed=0, settings=settings, spec_overrides=shape
        )
        r = report.results[0]
        return r.moves, r.makespan_s

    # By price alone (no mixed margin), with one-degree layouts at the one-range price, the planner
    # runs a mixed layout here, whose buckets move turns.
    by_price = replace(OLD_PRICES, mixed_margin=0.0)
    moves, base = run(by_price)
    assert moves > 0
    free_moves, free = run(replace(by_price, move_reprefill=False))
    assert free_moves == moves and free < base  # the same moves, without prefilling the context again
    assert run(replace(by_price, spill_factor=0.5))[1] != base


def test_sticky_turns_wait_for_their_instance() -> None:
    # dapo-math on 8 GPUs fills its instances: a returning turn either waits for the instance that
    # holds its prefix (the rollout router's rule) or re-prefills elsewhere; the runs differ.
    sticky = simulate("dapo-math", "8xA800", 1, ["greedy"], seed=0).results[0]
    moving = simulate("dapo-math", "8xA800", 1, ["greedy"], seed=0, settings=SimSettings(sticky_turns=False))
    assert sticky.makespan_s != moving.results[0].makespan_s


def _lendable(sim: Simulator) -> Instance:
    """Put `sim` in a rollout tail with an update running; return an idle instance of a shared bucket."""
    by_bucket: dict[int, list[Instance]] = {}
    for inst in sim.instances:
        by_bucket.setdefault(inst.bucket, []).append(inst)
    group = next(g for g in by_bucket.values() if len(g) >= 2)
    sim.rollout_running = True
    sim.unfinished = 1
    sim.bucket_flights = [0] * len(sim.bucket_flights)
    sim.trainer.start(0.0, 0, 100.0, sim.trainer.train_gpus)
    return group[0]


def test_elastic_lends_only_an_instance_whose_loan_pays_for_its_wake() -> None:
    sim = _sim("+elastic", gpus="32xA800")
    inst = _lendable(sim)  # the update runs from 0 s to 100 s
    sim.q.now_s = 100.0 - sim.join_s  # the update ends exactly when a replica would be ready
    pipeline.maybe_lend(sim, inst)
    assert inst.active and not sim.lent
    # It would train for switch_s, saving the update less than the wake costs the next rollout.
    sim.q.now_s = 100.0 - sim.join_s - sim.switch_s
    assert not pipeline.loan_pays(sim, inst.tp)
    pipeline.maybe_lend(sim, inst)
    assert inst.active and not sim.lent
    sim.q.now_s = 0.0  # from the start it would save more than the wake
    assert pipeline.loan_pays(sim, inst.tp)
    sim.unfinished = 0  # but the last trajectory just ended (the next rollout may start now)
    pipeline.maybe_lend(sim, inst)
    assert inst.active and not sim.lent
    sim.unfinished = 1
    pipeline.maybe_lend(sim, inst)
    assert not inst.active and sim.lent == [inst]


def test_a_loan_pays_only_for_the_update_work_it_speeds_up() -> None:
    # An update whose work starts later (a forced move: pipeline.try_start_train) saves nothing
    # while its GPUs move. Its work here is `switch_s` at the core's rate: one replica more saves
    # less than the wake, however long the move, which loan_pays counted as update time left.
    sim = _sim("+elastic", gpus="32xA800")
    inst = _lendable(sim)
    tr = sim.trainer
    tr.iteration = -1
    move_s = 10 * (sim.join_s + sim.switch_s)
    tr.start(0.0, 0, sim.switch_s, tr.train_gpus, setup_s=move_s)
    sim.q.now_s = 0.0
    assert tr.done_s() == pytest.approx(move_s + sim.switch_s)
    assert not pipeline.loan_pays(sim, inst.tp)
    pipeline.maybe_lend(sim, inst)
    assert inst.active and not sim.lent
    tr.iteration = -1  # the same update with no move: its work starts at once, ...
    tr.start(0.0, 0, move_s + sim.switch_s, tr.train_gpus)
    assert pipeline.loan_pays(sim, inst.tp)  # ... and a replica saves more than the wake


def test_lent_instances_wake_for_the_tail_when_the_update_ends() -> None:
    sim = _sim("+elastic", gpus="32xA800")
    inst = _lendable(sim)
    pipeline.maybe_lend(sim, inst)
    assert sim.lent == [inst]
    sim.q.now_s = 50.0
    sim.stats.records.append(IterationRecord(0))
    pipeline.on_train_done(sim)  # no update is waiting: the lent instance serves rollout again
    assert inst.active and not sim.lent
    assert inst.stall_until_s == pytest.approx(50.0 + sim.switch_s)


def test_training_hybrids_serve_rollout_only_when_turns_wait_for_room() -> None:
    # An update ends during a rollout and none follows. With no turn waiting in a bucket queue the
    # hybrids would only idle there (turns stay with the instance holding their prefix) and return
    # late for the next update, so they stay; with a turn waiting, they become rollout instances.
    sim = _sim("+elastic", gpus="32xA800")
    assert sim.dep is not None
    # Twice the planned data parallelism, so the replicas beyond the core half fill a TP8 instance.
    lay = sim.dep.train_layout
    sim.dep = replace(sim.dep, train_gpus=2 * sim.dep.train_gpus, train_layout=replace(lay, dp=2 * lay.dp))
    for queued in (False, True):
        _lendable(sim)
        sim.stats.records.append(IterationRecord(0))
        if queued:
            sim.router.queues[0].append(object())
        before = len(sim.instances)
        pipeline.on_train_done(sim)
        assert bool(sim.hybrids) == queued
        assert len(sim.instances) == before + len(sim.hybrids)
        assert all(not i.active and i.bucket == sim.dep.num_buckets - 1 for i in sim.hybrids)


@pytest.mark.parametrize("policy", ["static-optimal", "+planning"])
def test_single_degree_policies_plan_one_degree_on_every_rollout_gpu(policy: str) -> None:
    sim = _sim(policy, gpus="16xA800")
    dep = sim.dep
    assert dep is not None and dep.plan is not None and sim.search.homogeneous
    (tp,) = {tp for tp, _ in dep.instances}
    assert dep.plan.rollout.groups[0].tp == tp and dep.num_buckets == 1
    assert sum(t for t, _ in dep.instances) == dep.rollout_gpus - dep.rollout_gpus % tp
    assert dep.rollout_gpus + dep.train_gpus == 16


def test_groups_past_the_longest_length_share_its_bucket() -> None:
    # Three groups whose first two bins end at the longest length (trajectories cut at the context
    # cap): length cannot tell the last group's trajectories from the second's, so the second
    # group's bucket is open and takes the third group's instances.
    sim = _sim("oracle-routing", gpus="32xA800")
    assert sim.dep is not None and sim.dep.plan is not None
    groups = (Group(1, 2, 0, 1, 1.0), Group(4, 1, 1, 2, 1.0), Group(8, 1, 2, 3, 1.0))
    plan = replace(sim.dep.plan, rollout=Assignment(1.0, 14, groups), bin_max_len=(1000.0, 2048.0, 2048.0))
    dep = deployment_from_plan(sim.p, plan, sim.model, sim.hw, sim.search)
    assert dep.bucket_bounds == (1000,)
    assert dep.instances == ((1, 0), (1, 0), (4, 1), (8, 1))
    distinct = replace(plan, bin_max_len=(1000.0, 1500.0, 2048.0))
    dep = deployment_from_plan(sim.p, distinct, sim.model, sim.hw, sim.search)
    assert dep.bucket_bounds == (1000, 1500) and dep.instances[-1] == (8, 2)


def test_planning_workloads_carry_their_grpo_groups() -> None:
    # The planner estimates an iteration's spread from its GRPO groups (planner/spread.py), so the
    # simulator hands it one group per prompt of the iteration, and the settings ask for it.
    sim = _sim("+planning", iterations=2, gpus="16xA800")
    w = sim.workload_of(0)
    trajs = sim.trajs[0]
    assert w.group_index is not None and len(w.group_index) == len(trajs)
    assert len(set(w.group_index.tolist())) == len({t.prompt_id for t in trajs}) == w.prompts_per_iteration
    prompt_of: dict[int, str] = {}
    for t, g in zip(trajs, w.group_index.tolist(), strict=True):  # same group, same prompt
        assert prompt_of.setdefault(g, t.prompt_id) == t.prompt_id
    assert sim.search.plan_for_spread and not _sim("+planning", gpus="16xA800").search.one_range_per_degree


def test_bucket_end_times_end_with_the_rollout() -> None:
    # The last trajectory of an iteration ends its rollout, so the latest bucket end is the
    # rollout's end; every bucket named is one the deployment has.
    sim = _sim("oracle-routing", iterations=2, gpus="32xA800")
    assert sim.dep is not None
    st = sim.run()
    for rec in st.records:
        assert rec.bucket_end_s and max(rec.bucket_end_s.values()) == pytest.approx(rec.rollout_end_s)
        assert set(rec.bucket_end_s) <= set(range(sim.dep.num_buckets))
        assert all(rec.rollout_start_s < t <= rec.rollout_end_s for t in rec.bucket_end_s.values())


def test_measured_split_gives_each_stage_gpus_in_proportion_to_its_gpu_seconds() -> None:
    sim = _sim("greedy", gpus="48xA800")
    w = sim.workload_of(0)
    for roll, train, want in ((3.0, 1.0, 12), (1.0, 1.0, 24), (1.0, 3.0, 36)):
        dep = measured_split(sim.model, sim.hw, 48, w, sim.search, roll, train)
        # The nearest count the model trains on (the tiny scenario's model trains on any count).
        assert dep.train_gpus == want and dep.rollout_gpus == 48 - want
        (tp,) = {tp for tp, _ in dep.instances}
        assert len(dep.instances) == dep.rollout_gpus // tp


def test_greedy_resplits_once_from_measured_stage_times() -> None:
    # greedy starts on the half split; at rollout GREEDY_RESPLIT_AT it splits the GPUs in proportion
    # to the GPU-seconds it measured (rollouts 0-1, update 0), pays the move, and keeps that split.
    sim = build_sim("dapo-math", "greedy", iterations=GREEDY_RESPLIT_AT + 2)
    assert sim.dep is not None and sim.dep.train_gpus == 24
    st = sim.run()
    (decision,) = st.replans
    assert decision["iteration"] == GREEDY_RESPLIT_AT and decision["action"] == "apply"
    measured = st.records[:GREEDY_RESPLIT_AT]
    rollout_s = sum(r.rollout_end_s - r.rollout_start_s for r in measured) / len(measured)
    train_s = measured[0].train_s
    assert decision["current_t_iter_s"] == pytest.approx(max(rollout_s, train_s))
    want = 48 * train_s * 24 / (train_s * 24 + rollout_s * 24)
    assert sim.dep is not None and abs(sim.dep.train_gpus - want) < 1.5
    assert sim.dep.train_gpus < 24  # dapo-math's update is short next to its rollout
    assert len(st.deployments) == 2 and st.deployments[-1] == decision["proposed_split"]
    # The rollout after the re-split started only when the workers had moved.
    start = st.records[GREEDY_RESPLIT_AT].rollout_start_s
    assert start >= st.records[GREEDY_RESPLIT_AT - 1].rollout_end_s + sim.replanner.move_cost_s


@pytest.mark.parametrize(
    ("update_s", "training", "weights_of", "lends"),
    [
        (1000.0, 0, 0, True),  # rollout 2 waits for update 0, which runs: lend
        (1000.0, 1, 1, False),  # update 0's weights are in: rollout 2 starts now
        (1000.0, 1, 0, False),  # update 0 has ended, rollout 2 waits only for its weights
        (None, 0, 0, False),  # update 0 ends too soon to pay for the wake
    ],
)
def test_elastic_lends_idle_instances_while_the_next_rollout_waits(
    update_s: float | None, training: int, weights_of: int, lends: bool
) -> None:
    # Rollout 1 ends. If rollout 2 must wait for the running update (or none follows), every idle
    # instance joins the update, provided the time it saves pays for waking it again later.
    sim = _sim("+elastic", iterations=3, gpus="32xA800")
    update_s = update_s if update_s is not None else sim.join_s + sim.switch_s  # saves < switch_s
    sim.trainer.start(0.0, training, update_s, sim.trainer.train_gpus)
    sim.version = weights_of  # rollout 2 needs version 1 (update 0's weights; staleness 1)
    sim.rollout_running, sim.rolled = True, 1
    sim.cur = IterationRecord(1)
    sim.stats.records.append(sim.cur)
    instances = list(sim.instances)
    pipeline.on_rollout_done(sim)
    assert sim.rollout_running == (weights_of == 1)
    assert sim.lent == (instances if lends else [])
    assert all(i.active != lends for i in instances)
    if lends:  # the update speeds up once they have loaded the snapshot
        before = sim.trainer.done_s()
        sim.q.now_s = sim.join_s
        for inst in instances:
            pipeline.on_hybrid_ready(sim, inst)
        assert sim.trainer.done_s() < before - sim.switch_s


def test_elastic_lends_idle_instances_to_the_last_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every rollout has run; update 0 ends and update 1 starts: no rollout needs the instances, so
    # they join it (the check runs when an update starts, not only when a rollout ends).
    monkeypatch.setattr(pipeline, "update_time_s", lambda *args: 1000.0)
    sim = _sim("+elastic", iterations=2, gpus="32xA800")
    sim.stats.records.extend([IterationRecord(0), IterationRecord(1)])
    sim.rolled, sim.pending_train = 2, [1]
    sim.trainer.start(0.0, 0, 10.0, sim.trainer.train_gpus)
    sim.q.now_s = 10.0
    instances = list(sim.instances)
    pipeline.on_train_done(sim)
    assert sim.trainer.iteration == 1 and sim.lent == instances
    assert not any(i.active for i in instances)


@pytest.mark.parametrize(("rolled", "wakes"), [(2, True), (3, False)])
def test_lent_instances_wake_during_the_weight_sync_the_next_rollout_waits_for(
    monkeypatch: pytest.MonkeyPatch, rolled: int, wakes: bool
) -> None:
    # Update 0 ends with every rollout instance lent to it, and update 1 is waiting. If rollout 2
    # waits for update 0's weights, the instances start waking now (ready switch_s from now, the
    # sync overlapping) instead of training update 1 until the rollout starts; if every rollout has
    # run, they stay with update 1.
    monkeypatch.setattr(pipeline, "update_time_s", lambda *args: 1000.0)
    sim = _sim("+elastic", iterations=3, gpus="32xA800")
    sim.stats.records.extend([IterationRecord(0), IterationRecord(1)])
    sim.rolled, sim.pending_train, sim.version = rolled, [1], 0
    sim.trainer.start(0.0, 0, 10.0, sim.trainer.train_gpus)
    instances = list(sim.instances)
    for inst in instances:
        pipeline._lend(sim, inst)
        sim.lent_ready.add(inst.instance_id)
    sim.q.now_s = 10.0
    pipeline.on_train_done(sim)
    assert sim.trainer.iteration == 1
    assert sim.lent == ([] if wakes else instances)
    assert all(i.active == wakes for i in instances)
    lent_gpus = sum(i.tp for i in instances)
    assert sim.trainer.gpus == sim.trainer.train_gpus + (0 if wakes else lent_gpus)
    if wakes:
        assert all(i.stall_until_s == pytest.approx(10.0 + sim.switch_s) for i in instances)


def test_serving_overhead_setting_reaches_the_instances_the_planner_and_the_bound() -> None:
    """The what-if's CPU time per decode step is seen by the simulated instances, by the planner the
    policy calls (it prices on the same hardware) and by the lower bound."""
    setting = SimSettings(serving_step_overhead_us=5_000.0, serving_seq_overhead_us=200.0)
    base = build_sim("tiny", "static-optimal", 2)
    slow = build_sim("tiny", "static-optimal", 2, settings=setting)
    assert slow.hw.serving_seq_overhead_us == 200.0 and base.hw.serving_seq_overhead_us == 0.0
    assert float(slow.tables.cost.decode_step_s(1, 4, 500)) == pytest.approx(
        float(base.tables.cost.decode_step_s(1, 4, 500)) + 5e-3 + 4 * 200e-6
    )
    a, b = base.run(), slow.run()
    assert base.dep is not None and slow.dep is not None
    assert base.dep.plan is not None and slow.dep.plan is not None
    assert slow.dep.plan.t_rollout_s > base.dep.plan.t_rollout_s  # the planner priced the overhead
    assert sum(r.rollout_end_s - r.rollout_start_s for r in b.records) > sum(
        r.rollout_end_s - r.rollout_start_s for r in a.records
    )
    fast_rep = simulate("tiny", "8xA800", 2, ["static-optimal"], seed=0)
    slow_rep = simulate("tiny", "8xA800", 2, ["static-optimal"], seed=0, settings=setting)
    assert slow_rep.lower_bound_s > fast_rep.lower_bound_s
    # summary.json says what was simulated: the hardware with the overheads, and the settings
    # (it held the cluster's spec without them, and no settings at all)
    summary = slow_rep.to_dict()
    assert summary["hardware_spec"]["serving_step_overhead_us"] == 5_000.0
    assert summary["settings"]["serving_seq_overhead_us"] == 200.0
    assert summary["settings"]["max_num_seqs"] == SimSettings().max_num_seqs
    assert fast_rep.to_dict()["hardware_spec"]["serving_step_overhead_us"] == 0.0
    with pytest.raises(ValueError, match="serving_seq_overhead_us"):
        SimSettings(serving_seq_overhead_us=-1.0)


def test_a_split_policy_on_one_gpu_is_a_value_error_for_direct_callers() -> None:
    # simulate() refused it up front; a script building the Simulator itself got a ZeroDivisionError
    with pytest.raises(ValueError, match=r"greedy: each splits the cluster .* the cluster has 1"):
        _sim("greedy", gpus="1xH100")
    assert _sim("colocated", iterations=1, gpus="1xH100").G == 1  # colocated time-shares one GPU
