"""Simulator details a second mutation audit found unguarded by the rest of tests/sim.

Guards: events: every kind's priority at one time. instance: a turn that fills the KV cache exactly
fits, a finished turn frees its reservation while others run. router: no spill past max_num_seqs x
the load per GPU, a spill to the least-loaded of this *or* a longer bucket, round-robin in turn.
turns: the turn after a move stays with its new prefix, a returning turn queues behind those waiting
for its instance, a freed instance serves its own queue's head before shorter buckets'. engine: bucket
ends keyed by the serving instance, the event count without stale events. trajectory: payloads count
as tokens. training: a layout that no longer fits is priced on the best that does. pipeline: a
colocated update's time without its switches, the core keeps at least half the replicas, the tail
lend rule (one unfinished trajectory per other *active* instance). deployments: rollout busy time per
GPU, no wait for a move that keeps the training GPUs. policies: an odd cluster's half split, two GPUs.
report/simulate/workloads: the path bound's last update, the work bound's shortest context, the tail
share's count, the mean iteration, a zero mixed gap's wording. generator: the token cap. cmlfq/tree:
the tail quantile met exactly, the tree's ceiling. Expected values follow the documented rules.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.search import best_train
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.train_cost import TrainLayout, TrainShape, estimate_train, train_lower_bound_s
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.sim import pipeline, simulate
from libra_core.sim.cmlfq import SimCMLFQScheduler
from libra_core.sim.engine import Simulator
from libra_core.sim.events import EventQueue, Kind
from libra_core.sim.instance import CostTables, Instance
from libra_core.sim.policies import POLICIES, check_cluster_size
from libra_core.sim.report import PolicyResult, SimReport, format_verdicts, lower_bound_s
from libra_core.sim.router import Router
from libra_core.sim.stats import IterationRecord
from libra_core.sim.training import update_time_s
from libra_core.sim.trajectory import SimTrajectory
from libra_core.sim.tree import SimPrefixTree
from libra_core.sim.turns import Flight
from libra_core.sim.workloads import load_scenario, long_tail_share
from tests.sim.builders import build_sim

TABLES = CostTables(RolloutCostModel(get_model("qwen3-8b"), get_hardware("A800"), max_num_seqs=16), (1, 8))


def _instance(instance_id: int, tp: int, bucket: int) -> Instance:
    return Instance(instance_id, tp, bucket, TABLES, TABLES.kv_capacity[tp])


def _load(inst: Instance, n: int) -> None:
    for k in range(n):
        inst.join(0.0, f"load{inst.instance_id}.{k}", 100, 100, 50)


def test_every_event_kind_has_its_documented_priority() -> None:
    # docs/simulator.md: TRAIN_DONE < WEIGHTS_READY < ROLLOUT_START < TOOL_RETURN < HYBRID_READY <
    # DECODE_DONE at equal times, whatever order they were scheduled in.
    documented = ["TRAIN_DONE", "WEIGHTS_READY", "ROLLOUT_START"]
    documented += ["TOOL_RETURN", "HYBRID_READY", "DECODE_DONE"]
    q = EventQueue()
    for name in reversed(documented):
        q.push(1.0, Kind[name], name)
    assert [ev.target for ev in q.drain()] == documented


def test_the_kv_cache_holds_a_turn_that_fills_it_and_frees_a_finished_turns_room() -> None:
    # A turn is admitted if its final context fits beside the others' reserved contexts (<=), and a
    # finished turn's final context leaves the reservation while the others run.
    inst = _instance(0, 1, 0)
    cap = inst.kv_capacity
    inst.join(0.0, "long", 1000, 1000, 500)  # reserves 1,500 tokens
    inst.join(0.0, "short", 100, 100, 10)  # reserves 110, ends first
    assert inst.fits(cap - 1610) and not inst.fits(cap - 1609)
    assert inst.pop_done(inst.next_done_s()) == ["short"]
    assert inst.batch == 1
    assert inst.fits(cap - 1500) and not inst.fits(cap - 1499)


def test_a_spill_factor_past_max_num_seqs_never_spills() -> None:
    # settings.py: past max_num_seqs no load spills, however idle the rest of the cluster (the bar
    # is spill_factor x the instance's GPUs x (the cluster's mean per GPU + 1)).
    busy, idle = _instance(0, 1, 0), [_instance(1, 8, 1), _instance(2, 8, 1)]
    _load(busy, TABLES.max_num_seqs - 1)  # room for one more; 15 sequences on 17 GPUs
    router = Router([busy, *idle], num_buckets=2, placement="least_load", spill_factor=16.5)
    assert router.choose(0, None, 1000) is busy
    assert Router([busy, *idle], 2, "least_load", spill_factor=2.0).choose(0, None, 1000) in idle


def test_an_overloaded_bucket_spills_to_the_least_loaded_of_it_and_the_longer_ones() -> None:
    # Router: "spills to the least-loaded instance of this or a longer bucket". Bucket 1's instance
    # (3 sequences, more than 2 x (7 / 18 + 1) per GPU) is overloaded, yet less loaded than bucket
    # 2's (4): it keeps the turn. Bucket 0's idle instances serve shorter work only.
    short = [_instance(0, 8, 0), _instance(1, 8, 0)]
    mine, longer = _instance(2, 1, 1), _instance(3, 1, 2)
    _load(mine, 3)
    _load(longer, 4)
    router = Router([*short, mine, longer], num_buckets=3, placement="least_load")
    assert mine.batch > router.spill_factor * mine.tp * (router._mean_load() + 1)
    assert router.choose(1, None, 1000) is mine


def test_round_robin_pins_each_trajectory_to_the_next_instance_in_turn() -> None:
    insts = [_instance(i, 1, 0) for i in range(3)]
    router = Router(insts, num_buckets=1, placement="round_robin")
    assert [router.pin() for _ in range(7)] == [*insts, *insts, insts[0]]


def _flight(sim: Simulator, turn: int = 1, last: Instance | None = None, moved: bool = False) -> Flight:
    """A trajectory of iteration 0 at `turn` (its earlier turns and payloads in its context)."""
    traj = next(t for t in sim.trajs[0] if len(t.turns) >= 3)
    req = SchedRequest(traj.trajectory_id, traj.prompt_id, traj.prompt_tokens, 0, None)
    before = traj.turns[:turn]
    ctx = traj.prompt_tokens + sum(t.gen_tokens + t.payload_tokens for t in before)
    new = before[-1].payload_tokens if before else traj.prompt_tokens
    return Flight(traj, req, 0, float(ctx), 0.0, turn, last, None, float(new), moved)


def _holders(sim: Simulator, f: Flight) -> list[Instance]:
    return [i for i in sim.instances if any(entry[2] is f for entry in i.heap)]


def test_the_turn_after_a_move_stays_where_the_moved_turn_ran() -> None:
    # A moved turn goes to the least-loaded instance (its whole context prefilled there); its next
    # turn is an ordinary one: it stays with the instance that now holds its prefix (sticky_turns),
    # even where that instance is no longer the least loaded.
    sim = build_sim("tiny", "greedy")  # 4xTP1, one bucket
    f = _flight(sim, turn=0, moved=True)
    sim.route(f)
    (first,) = _holders(sim, f)
    _load(first, 3)  # every other instance is idle
    done = f.traj.turns[0]  # its turn and tool call ended: the next turn
    f.turn, f.last = 1, first
    f.ctx += done.gen_tokens + done.payload_tokens
    f.new_tokens = float(done.payload_tokens)
    sim.route(f)
    assert _holders(sim, f) == [first]
    assert sum(entry[2] is f for entry in first.heap) == 2  # both turns ran on it


def test_a_returning_turn_queues_behind_turns_waiting_for_its_instance() -> None:
    # A turn held by the instance with its prefix waits in that instance's queue behind the turns
    # already there (a FIFO), even when it would fit now: the waiting turn gets the next room.
    sim = build_sim("tiny", "greedy")
    a = sim.instances[0]
    half = a.kv_capacity / 2
    a.join(0.0, "running", half, half, 10)
    waiting = object()  # a turn of ~half the cache: it does not fit beside the running one
    queue = sim.router.pinned_queues[a.instance_id]
    queue.append(waiting)
    f = _flight(sim, turn=1, last=a)
    assert a.fits(f.ctx + f.traj.turns[1].gen_tokens)
    sim.route(f)
    assert list(queue) == [waiting, f]
    assert a.batch == 1


def test_a_freed_instance_serves_its_own_queue_before_shorter_buckets() -> None:
    # Router.drain_order: an instance takes waiting turns from its own queue, then shorter buckets'.
    # While the head of its own queue waits for room, a shorter bucket's turn does not take it.
    sim = build_sim("tiny", "greedy")
    assert sim.dep is not None
    sim.deploy(replace(sim.dep, instances=((1, 0), (1, 1)), bucket_bounds=(500,)))
    longer = sim.router.by_bucket[1][0]
    half = longer.kv_capacity / 2
    longer.join(0.0, "running", half, half, 10)
    big = _flight(sim, turn=0)
    big.ctx = half + 100  # waits for the running turn's room
    small = _flight(sim, turn=1)
    sim.router.queues[1].append(big)
    sim.router.queues[0].append(small)
    sim._drain(longer)
    assert list(sim.router.queues[1]) == [big] and list(sim.router.queues[0]) == [small]
    assert longer.batch == 1


def test_a_bucket_end_is_booked_to_the_bucket_that_served_the_last_turn() -> None:
    # stats.IterationRecord.bucket_end_s: per bucket, when the last trajectory whose final turn ran
    # on one of its instances finished -- a spilled trajectory's admission bucket is not that one.
    sim = build_sim("tiny", "greedy")
    sim.cur = IterationRecord(0, trajectories=2)
    sim.unfinished = 2
    f = _flight(sim, turn=2, last=_instance(99, 1, 1))  # admitted to bucket 0, served in bucket 1
    assert sim.sched is not None
    sim.sched.admit(f.req)
    sim.q.now_s = 3.0
    sim.finish(f)
    assert sim.cur.bucket_end_s == {1: 3.0}


def test_the_event_count_leaves_out_stale_events() -> None:
    # Stale events (a batch changed since they were scheduled) are dropped, not handled: the count
    # is the events handled, which is the trace's length.
    sim = build_sim("tiny", "greedy", 2, record_events=True)
    st = sim.run()
    assert sim.q.log is not None
    assert sim.q.processed > len(sim.q.log)  # some were stale
    assert st.events == len(sim.q.log)


def test_a_trajectorys_tokens_are_its_prompt_generated_and_payload_tokens() -> None:
    turns = (Turn(30, "calc", 7, "success"), Turn(20, None, 0, None))
    assert SimTrajectory("t", "p", 0, 100, turns, (0.5, 0.0)).total_tokens == 100 + 30 + 7 + 20


def test_an_update_on_a_layout_that_no_longer_fits_is_priced_on_the_best_that_does() -> None:
    model, hw = get_model("qwen3-14b"), get_hardware("A800")
    shape = TrainShape(500_000.0, 500_000.0 * 8000.0, 16_000.0)
    plain = TrainLayout(1, 1, 8, zero_stage=0)  # full optimizer states on every GPU: does not fit
    est = estimate_train(model, hw, plain, shape)
    alt = best_train(model, hw, 8, shape)
    assert not est.feasible and alt is not None and alt.time_s != est.time_s
    assert update_time_s(model, hw, plain, shape) == alt.time_s


def test_a_colocated_updates_own_time_leaves_out_both_switches() -> None:
    # Colocated: rollout ends, the engines sleep (switch), the update runs, the weights sync and the
    # engines wake (switch). IterationRecord.train_s is the update's own time, start to end.
    sim = build_sim("tiny", "colocated", 3)
    st = sim.run()
    for r in st.records:
        own = (r.train_end_s - sim.t_sync - sim.switch_s) - (r.rollout_end_s + sim.switch_s)
        assert r.train_s == pytest.approx(own, rel=1e-9, abs=1e-9)
    assert sim.switch_s > 0


def test_the_core_keeps_at_least_half_the_replicas_when_hybrids_serve_rollout() -> None:
    # The training GPUs beyond the core half, in whole replicas, become rollout instances: of 3
    # replicas of 8 GPUs the core keeps 2 (half, rounded up to whole replicas), one goes.
    sim = build_sim("tiny", "+elastic", 1, gpus="32xA800")
    assert sim.dep is not None
    lay = replace(sim.dep.train_layout, tp=8, pp=1, dp=3)
    sim.dep = replace(sim.dep, train_gpus=24, train_layout=lay)
    pipeline._hybrids_to_rollout(sim)
    assert sum(i.tp for i in sim.hybrids) == 8


def _tail(sim: Simulator) -> list[Instance]:
    """A rollout tail with a 100 s update running; the instances of the (one) bucket."""
    sim.rollout_running = True
    sim.unfinished = 1
    sim.bucket_flights = [0] * len(sim.bucket_flights)
    sim.trainer.start(0.0, 0, 100.0, sim.trainer.train_gpus)
    return [i for i in sim.instances if i.bucket == 0]


def test_a_tail_instance_is_lent_with_one_unfinished_trajectory_per_other_instance() -> None:
    # An idle instance is lent if its bucket holds at most one unfinished trajectory per *other*
    # active instance of the bucket -- never the bucket's last active one.
    sim = build_sim("tiny", "+elastic", 1, gpus="32xA800")
    group = _tail(sim)
    assert len(group) == 3
    sim.bucket_flights[0] = 3  # more than the 2 others
    pipeline.maybe_lend(sim, group[0])
    assert not sim.lent
    sim.bucket_flights[0] = 2  # one per other instance
    pipeline.maybe_lend(sim, group[0])
    assert sim.lent == [group[0]]
    sim.bucket_flights[0] = 0
    pipeline.maybe_lend(sim, group[1])
    assert sim.lent == group[:2] and sim.router.active_in(0) == 1
    assert pipeline.loan_pays(sim, group[2].tp)  # it would pay, but it is the last one serving
    pipeline.maybe_lend(sim, group[2])
    assert sim.lent == group[:2] and group[2].active


def test_rollout_busy_time_counts_every_gpu_of_an_instance() -> None:
    sim = build_sim("tiny", "greedy")
    inst = Instance(99, 4, 0, sim.tables, sim.tables.kv_capacity[4])
    inst.join(0.0, "turn", 100, 100, 10**6)
    sim.q.now_s = 10.0
    sim.harvest([inst])
    assert sim.stats.roll_busy_gpu_s == pytest.approx(10.0 * 4)


def test_a_move_that_keeps_the_training_gpus_does_not_wait_for_the_update() -> None:
    # deployments.update_wait_s: only a layout with fewer training GPUs waits for the running update.
    sim = build_sim("tiny", "static-optimal")
    dep = sim.dep
    assert dep is not None
    sim.trainer.start(0.0, 0, 100.0, dep.train_gpus)
    sim.q.now_s = 30.0
    assert sim.update_wait_s(dep) is None
    assert sim.update_wait_s(replace(dep, train_gpus=dep.train_gpus + 1)) is None
    assert sim.update_wait_s(replace(dep, train_gpus=dep.train_gpus - 1)) == pytest.approx(70.0)


def test_the_half_split_of_an_odd_cluster_uses_every_gpu() -> None:
    # Fixed splits: training gets half (rounded down), rollout the rest.
    sim = build_sim("tiny", "static-uniform", gpus="9xA800")
    dep = sim.dep
    assert dep is not None
    assert (dep.train_gpus, dep.rollout_gpus) == (4, 5)
    assert sum(tp for tp, _ in dep.instances) == 5


def test_two_gpus_are_enough_for_a_split_policy() -> None:
    check_cluster_size([POLICIES["greedy"], POLICIES["+elastic"]], 2)  # one training, one rollout GPU
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        check_cluster_size([POLICIES["greedy"]], 1)


def _bound_inputs(gpus: int) -> tuple:
    model, hw = get_model("qwen2.5-3b"), get_hardware("A800")
    tables = CostTables(RolloutCostModel(model, hw, 256), (1, 2, 4, 8))
    return model, hw, gpus, tables, (1, 2, 4, 8)


def _shape(ts: list[SimTrajectory]) -> TrainShape:
    sizes = [float(t.total_tokens) for t in ts]
    return TrainShape(sum(sizes), sum(s * s for s in sizes), max(sizes))


def test_the_path_bound_ends_with_the_last_update_on_every_gpu() -> None:
    # The path bound is the slowest trajectories' own latency (no GPU count in it) plus the last
    # update on every GPU at train_mfu: going from 8 to 16 GPUs takes half of that update off it.
    wl = load_scenario("tiny", 2, 0)
    iters = [wl.trajectories(j) for j in range(2)]
    model, hw, *_ = _bound_inputs(8)
    last = train_lower_bound_s(model, hw, 1, _shape(iters[-1]))
    path8 = lower_bound_s(iters, *_bound_inputs(8))[3]
    path16 = lower_bound_s(iters, *_bound_inputs(16))[3]
    assert last > 0 and path8 - path16 == pytest.approx(last / 8 - last / 16, rel=1e-9)


def test_the_work_bound_decodes_at_the_iterations_shortest_context() -> None:
    # Work bound: decode at the largest batch and the iteration's shortest context on the most
    # efficient degree, prefill likewise, training at train_mfu, all over the cluster's GPUs.
    ts = [
        SimTrajectory("a", "p0", 0, 100, (Turn(400, None, 0, None),), (0.0,)),
        SimTrajectory("b", "p1", 0, 60_000, (Turn(400, None, 0, None),), (0.0,)),
    ]
    model, hw, gpus, tables, tps = _bound_inputs(8)
    b = tables.max_num_seqs
    dec = min(tp * tables.itl_s(tp, b, 100) / b for tp in tps)
    pre = min(tp * tables.prefill_s(tp, 1.0, 100) for tp in tps)
    train = train_lower_bound_s(model, hw, 1, _shape(ts))
    expected = (800 * dec + 60_100 * pre + train) / gpus
    assert lower_bound_s([ts], model, hw, gpus, tables, tps)[2] == pytest.approx(expected, rel=1e-9)


def test_the_slowest_ten_percent_is_the_nearest_whole_count() -> None:
    # 10% of 16 trajectories is 1.6: the two slowest.
    lat = [1.0] * 14 + [10.0, 10.0]
    assert long_tail_share(lat, 0.1) == pytest.approx(20.0 / 34.0)


def test_the_mean_iteration_is_the_makespan_over_the_iterations() -> None:
    r = simulate("tiny", "8xA800", 3, ["greedy"], seed=0).results[0]
    assert r.mean_iteration_s == pytest.approx(r.makespan_s / 3)
    assert r.mean_iteration_s == pytest.approx(sum(r.iteration_s) / 3)


def test_a_zero_mixed_gap_is_not_called_faster() -> None:
    # mixed_gap: the mixed price over the one-degree price, minus 1; 0 is a tie, not "faster".
    tok = {"greedy": 450.0, "+planning": 510.0, "+hetero-tp": 510.0, "+cmlfq": 600.0, "+elastic": 700.0}
    results = [PolicyResult(n, v, 1.0, 1.0, 0.0, 0.0, 0, 0, 0.0, 0.0, "", "", 0, 0.0) for n, v in tok.items()]
    report = SimReport("tiny", "8xH100", "m", 1, 0, 1.0, 1.0, results)
    report.result("+hetero-tp").mixed_gap = 0.0
    text = "".join(format_verdicts(report))
    assert "mixed-TP layout 0.0% slower than one degree" in text and "faster" not in text


def test_no_trajectory_outgrows_max_total_tokens() -> None:
    # The generator stops a trajectory at max_total_tokens (prompt, generated and payload tokens).
    cap = 400
    wl = load_scenario("tiny", 3, 0, spec_overrides={"max_total_tokens": cap})
    totals = [t.total_tokens for j in range(3) for t in wl.trajectories(j)]
    assert max(totals) == cap  # some reach the cap ...
    assert all(n <= cap for n in totals)  # ... and none passes it


def _cmlfq_decision(sim: bool, small: int) -> object:
    """A request admitted to bucket 0 (bound 1,000) while the tree knew nothing; 10 trajectories of
    its prompt then finish, `small` of them with 100 tokens left after the first tool return, the
    rest 20,000. At that return (context 170) the mean says bucket 1; P90 says so iff small < 9."""
    cfg = SchedulerConfig(type="cmlfq", buckets=[1000], prefill_decode_cost_ratio=0.0)
    sched = SimCMLFQScheduler(cfg, tree=SimPrefixTree.from_config(cfg)) if sim else CMLFQScheduler(cfg)
    req = SchedRequest("r", "p", 100, 0, None)
    assert sched.admit(req) == 0
    for i in range(10):
        turns = (Turn(50, "calc", 20, "success"), Turn(100 if i < small else 20_000, None, 0, None))
        sched.on_finish(FinishedTrajectory(f"t{i}", "p", 100, 0, 0, turns))
    return sched.on_tool_return(req, ToolReturn(0, 50, "calc", 20, "success", 170))


def test_cmlfq_moves_only_when_the_tail_quantile_agrees_at_its_exact_value() -> None:
    # The tail test: the first bucket whose bound covers at least `tail_quantile` (0.9) of the
    # remaining tokens. With 9 of 10 samples inside bucket 0 that bucket covers exactly 90%: the
    # tail disagrees with the mean and the request stays; with 8 of 10 it moves.
    for sim in (True, False):
        assert _cmlfq_decision(sim, small=8) == Move(1)
        assert _cmlfq_decision(sim, small=9) is None


def test_the_sim_trees_ceiling_is_the_largest_remaining_total_inserted() -> None:
    # SimPrefixTree.max_remaining: the largest remaining-token count any insert recorded (the
    # trajectory's generated and payload tokens after its prompt), the bound the lazy tests rely on.
    tree = SimPrefixTree.from_config(SchedulerConfig(type="cmlfq", buckets=[1000]))
    totals = []
    for i, (gen, payload, last) in enumerate([(50, 20, 100), (400, 300, 2000), (10, 5, 30)]):
        turns = (Turn(gen, "calc", payload, "success"), Turn(last, None, 0, None))
        tree.insert(f"p{i}", turns, 0, prompt_tokens=100)
        totals.append(gen + payload + last)
    assert tree.max_remaining == max(totals) == 2700
