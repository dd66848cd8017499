"""GPU bookkeeping across moves: a running update keeps the GPUs it started on, the ledger books
every GPU the trainer uses to training, and an update is priced on the tokens it trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.planner.train_cost import TrainShape
from libra_core.scheduling.base import Turn
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.settings import SimSettings
from libra_core.sim.trace_replay import TraceWorkload
from libra_core.sim.training import update_time_s
from libra_core.sim.workloads import load_scenario
from libra_core.traces.schema import TraceTrajectory, trace_table, write_trace
from tests.sim.builders import build_sim


def _watch_training_side(sim: Simulator) -> list[tuple[float, float]]:
    """(GPUs the trainer worked on, GPUs the ledger booked to training) per ledger interval in which
    an update ran; the ledger's own deltas, so the check shares no formula with it."""
    seen: list[tuple[float, float]] = []
    account = sim._account

    def watched() -> None:
        dt = sim.q.now_s - sim._ledger_s
        before = sim.stats.train_gpu_s
        busy = hasattr(sim, "trainer") and sim.trainer.busy and not sim.p.colocated
        gpus = sim.trainer.gpus if busy else 0.0
        account()
        if busy and dt > 1e-9:
            seen.append((gpus, (sim.stats.train_gpu_s - before) / dt))

    sim._account = watched  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(
    ("scenario", "policy", "gpus"),
    [
        ("dapo-math", "greedy", "8xA800"),  # greedy's re-split lands while update 1 runs
        ("search-r1", "greedy", "8xA800"),
        ("dapo-math", "+elastic", "15xA800"),  # a rollout GPU no instance holds trains
        ("tiny", "+elastic", "13xA800"),
    ],
)
def test_every_gpu_the_trainer_uses_is_booked_to_training(scenario: str, policy: str, gpus: str) -> None:
    sim = build_sim(scenario, policy, 3, gpus=gpus)
    seen = _watch_training_side(sim)
    stats = sim.run()
    assert seen, "no update ran"
    assert max(used - booked for used, booked in seen) <= 1e-9
    assert 0.0 <= 1 - stats.roll_busy_gpu_s / stats.roll_gpu_s <= 1.0
    assert 0.0 <= 1 - stats.train_busy_gpu_s / stats.train_gpu_s <= 1.0


@pytest.mark.parametrize(("scenario", "gpus"), [("search-r1", "16xA800"), ("dapo-math", "12xA800")])
def test_the_books_close_when_the_run_ends(scenario: str, gpus: str) -> None:
    """The elastic pool shortens updates, leaving their first predicted end in the queue as an
    outdated event; the ledger must not book idle GPU time up to it, past the run's end."""
    sim = build_sim(scenario, "+elastic", 4, gpus=gpus)
    stats = sim.run()
    booked = stats.roll_gpu_s + stats.train_gpu_s
    assert booked == pytest.approx(sim.G * stats.makespan_s, rel=1e-9)
    assert sim.q.now_s == pytest.approx(stats.makespan_s, rel=1e-12)


def test_a_resplit_does_not_change_the_running_update() -> None:
    # Greedy re-splits at its rollout start while update 1 runs. Before 2026-12-05 the update's
    # rate followed the new split's training GPUs (4 -> 1 made it 4x faster, on GPUs it still held).
    sim = build_sim("dapo-math", "greedy", 3, gpus="8xA800")
    first = sim.dep
    assert first is not None
    stats = sim.run()
    assert stats.deployments[-1] != stats.deployments[0]  # it did move
    priced = update_time_s(
        sim.model, sim.hw, first.train_layout, TrainShape.from_workload(sim.workload_of(1))
    )
    assert stats.records[1].train_s == pytest.approx(priced, rel=1e-9)


def test_a_trace_update_is_priced_on_the_tokens_replayed(tmp_path: Path) -> None:
    # 3 prompts x 8 samples per iteration: once priced as 16 trajectories (weight 2/3).
    turns = (Turn(300, "bash", 40, "success"), Turn(200, None, 0, None))
    rows = [
        TraceTrajectory(f"{p}-{g}", f"p{p}", 0, 500, turns, (1.0, None)) for p in range(3) for g in range(8)
    ]
    path = write_trace(trace_table(rows), tmp_path / "t.parquet")
    cluster = parse_cluster("8xH100")
    wl = TraceWorkload(path, "qwen3-4b")
    sim = Simulator(
        resolve_policies(["static-optimal"])[0],
        wl,
        get_model("qwen3-4b"),
        cluster.hardware,
        8,
        1,
    )
    w = sim.workload_of(0)
    assert (w.prompts_per_iteration, w.group_size, w.num_samples) == (3, 8, 24)
    assert w.weight == 1.0


def test_more_prompts_than_the_pool_is_refused() -> None:
    # Each iteration draws distinct prompts; more than the pool repeated trajectory ids and crashed.
    with pytest.raises(ValueError, match=r"prompts_per_iteration \(16\) exceeds prompt_pool \(8\)"):
        load_scenario("tiny", 2, 0, spec_overrides={"prompts_per_iteration": 16})


def test_no_room_to_generate_is_refused() -> None:
    # A prompt at the token cap left a trajectory with no turns, and routing it raised IndexError.
    with pytest.raises(ValueError, match=r"max_total_tokens \(100\) leaves no room .* longest prompt"):
        load_scenario("tiny", 2, 0, spec_overrides={"max_total_tokens": 100})
    wl = load_scenario("tiny", 1, 0, spec_overrides={"max_total_tokens": 400})
    assert all(t.turns for t in wl.trajectories(0))


def test_lent_gpus_train_only_as_whole_replicas() -> None:
    # A hybrid joins as a whole data-parallel replica (DESIGN.md): 1 GPU lent to a TP8 update
    # sped it up by 1/8 of a replica (x1.1125 with the 0.9 hybrid efficiency) until 2026-12-06.
    from libra_core.sim import pipeline

    sim = build_sim("r2e-gym", "+elastic", 1, gpus="15xA800")
    assert sim.dep is not None and sim.dep.train_layout.tp * sim.dep.train_layout.pp == 8
    tr = sim.trainer
    tr.start(0.0, 0, 100.0, sim.dep.train_gpus)
    core_rate = tr.rate()
    ones = [i for i in sim.instances if i.tp == 1]
    assert len(ones) >= 7  # 7 of them: still no whole TP8 replica
    assert not pipeline.loan_pays(sim, 1)  # one GPU would add no replica: no loan
    for inst in ones[:7]:
        pipeline._lend(sim, inst)
        sim.lent_ready.add(inst.instance_id)
        tr.set_gpus(0.0, pipeline._train_gpus_now(sim))
        assert tr.rate() == core_rate and tr.gpus == sim.dep.train_gpus
    assert pipeline.loan_pays(sim, 1)  # the eighth completes a replica


def _update_then_replan_to_fewer_training_gpus(returning: int = 0) -> Simulator:
    """dapo-math +elastic on 48xA800 (train 8, TP2 DP4 | rollout 40, 5xTP8): an update starts, then
    a replan moves 4 training GPUs to rollout (the move waits for the update)."""
    from dataclasses import replace

    from libra_core.sim import pipeline

    sim = build_sim("dapo-math", "+elastic", 4)
    old = sim.dep
    assert old is not None and old.train_gpus == 8 and old.spare_gpus == 0
    sim.returning_gpus = returning  # training hybrids' GPUs on their way back
    sim.pending_train.append(0)
    pipeline.try_start_train(sim)
    new = replace(old, train_gpus=4, train_layout=replace(old.train_layout, dp=2), rollout_gpus=44)
    assert new.spare_gpus == 4
    sim.q.now_s = 1.0
    pipeline._redeploy(sim, new)
    return sim


def test_a_running_update_keeps_its_core_through_a_replan_and_is_booked_once() -> None:
    from libra_core.sim import pipeline
    from libra_core.sim.pipeline import HybridReturn

    sim = _update_then_replan_to_fewer_training_gpus(returning=2)
    assert sim.trainer.gpus == 6  # its 8 less the 2 on their way back
    sim.q.now_s = 2.0
    pipeline.on_hybrid_ready(sim, HybridReturn(2))
    assert sim.trainer.gpus == 8  # was 4: the new layout's core
    # the ledger: the 4 GPUs the update holds are the new layout's 4 spare ones, booked once
    sim._account()
    train0, roll0 = sim.stats.train_gpu_s, sim.stats.roll_gpu_s
    sim.q.now_s += 100.0
    sim._account()
    assert (sim.stats.train_gpu_s - train0, sim.stats.roll_gpu_s - roll0) == (800.0, 4000.0)  # was 1200, 3600


def test_the_books_close_at_the_end_when_late_wakes_are_moot() -> None:
    """Hybrids sent to a rollout that ended before their (long) wake: their ready events, and the
    return to training after them, come after the last weights are ready. They were handled as the
    last events, and the books closed there: 1,070 GPU-seconds booked for a 41 s run on 12 GPUs
    (494; this test's assertion on the old code)."""
    settings = SimSettings(max_num_seqs=2, wake_s=60.0)
    spec = {"prompts_per_iteration": 2, "max_turns": 2}
    cluster = parse_cluster("12xA800")
    wl = load_scenario("search-r1", 3, 1, spec_overrides=spec)  # seed 1: seed 0 has no late wake
    policy = resolve_policies(["+elastic"])[0]
    sim = Simulator(policy, wl, get_model(wl.model), cluster.hardware, 12, 3, settings)
    stats = sim.run()
    assert stats.hybrid_rollouts == 0  # no hybrid woke in time to serve: every ready came late
    booked = stats.roll_gpu_s + stats.train_gpu_s
    assert booked == pytest.approx(sim.G * stats.makespan_s, rel=1e-9)


def test_a_colocated_switch_is_not_training() -> None:
    """A colocated update waits for the switch (engines sleep, training states come back) before it
    trains; the switch was booked as training busy, the wake after the update as idle."""
    runs = [build_sim("tiny", "colocated", 3, settings=SimSettings(wake_s=w)) for w in (0.0, 5.0)]
    (plain, switching) = [sim.run() for sim in runs]
    longer_s = runs[1].switch_s - runs[0].switch_s
    assert longer_s == pytest.approx(5.0)
    assert switching.train_busy_gpu_s == pytest.approx(plain.train_busy_gpu_s, rel=1e-9)
    # each iteration pays the switch twice (sleep before the update, wake after), on the training side
    extra = switching.train_gpu_s - plain.train_gpu_s
    assert extra == pytest.approx(8 * 3 * 2 * longer_s, rel=1e-6)
