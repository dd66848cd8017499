"""The simulator's failure paths inside a run: an update that fits no layout stops the run, a
training hybrid that left rollout serves no turn again, and a loan given back before it joined
leaves no second join behind."""

from __future__ import annotations

import pytest

from libra_core.scheduling.base import SchedRequest
from libra_core.sim import pipeline, simulate
from libra_core.sim.instance import Instance
from libra_core.sim.settings import SimSettings
from libra_core.sim.turns import Flight
from tests.sim.builders import build_sim

# `tiny` grown until iteration 1's longest trajectory (100k tokens) trains on no layout of the
# training GPU static-optimal planned at iteration 0 (the audit's repro, `libra simulate ... --spec`).
OUTGROWN = {
    "max_total_tokens": 1_000_000,
    "gen_median": 300.0,
    "gen_drift": 5.0,
    "max_turns": 60,
    "mean_subtasks": 10.0,
}


def test_an_update_that_fits_no_layout_on_its_gpus_stops_the_run() -> None:
    # Before 2026-12-06 the infeasible layout's time was used and the run went on (exit 0).
    with pytest.raises(
        ValueError,
        match=r"static-optimal, iteration 1's update: the training layout TP1 PP1 DP1 \S+ mb1 recompute "
        r"needs 137.3 GB per GPU for sequences of up to 100,315 tokens, where the GPU \(A800-80G\) has "
        r"80.0 GB, and no layout on 1 GPU fits",
    ):
        simulate("tiny", "8xA800", 3, ["static-optimal"], spec_overrides=OUTGROWN)


def test_the_cli_exits_2_on_an_update_that_fits_nowhere(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    spec = [f"{k}={v}" for k, v in OUTGROWN.items()]
    argv = ["simulate", "--scenario", "tiny", "--hardware", "8xA800", "--iterations", "3"]
    assert main([*argv, "--policies", "static-optimal", "--spec", *spec]) == 2
    assert "no layout on 1 GPU fits" in capsys.readouterr().err


def test_a_hybrid_back_in_training_keeps_no_turn_for_its_prefix() -> None:
    # A turn whose previous turn ran on a training hybrid that has since gone back to training is
    # routed elsewhere and prefills its whole context there. Before 2026-12-06 the hybrid stayed
    # `active`, `Router.holder` kept the turn on it, and it served rollout as a "ghost".
    sim = build_sim("tiny", "+elastic")
    first = sim.instances[0]
    hybrid = Instance(sim._next_id, first.tp, first.bucket, sim.tables, sim.tables.kv_capacity[first.tp])
    sim._next_id += 1
    sim.instances.append(hybrid)
    sim.router.by_bucket[hybrid.bucket].append(hybrid)
    sim.hybrids.append(hybrid)
    traj = sim.trajs[0][0]
    req = SchedRequest(traj.trajectory_id, traj.prompt_id, traj.prompt_tokens, 0, None)
    f = Flight(traj, req, first.bucket, 900.0, 0.0, last=hybrid, new_tokens=40.0)
    assert sim.router.holder(f.bucket, hybrid) is hybrid  # serving rollout, it holds the prefix

    pipeline._hybrids_to_training(sim, [hybrid])
    assert not hybrid.active and sim.router.holder(f.bucket, hybrid) is None
    sim.route(f)
    served = [i for i in sim.instances if i.heap]
    assert not hybrid.heap and len(served) == 1
    assert served[0].stall_until_s == pytest.approx(sim.tables.prefill_s(served[0].tp, 900.0, 900.0))


def test_no_turn_runs_on_an_instance_that_left_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    # search-r1 on 8 GPUs with 8 sequences per instance: turns queue, so updates end into training
    # hybrids that serve rollout and go back early (`hybrid_idle`); their busy time was never booked.
    sim = build_sim("search-r1", "+elastic", 3, gpus="8xA800", settings=SimSettings(max_num_seqs=8))
    ghosts: list[int] = []
    join = Instance.join

    def counted(self: Instance, *args: object) -> None:
        if self not in sim.instances:
            ghosts.append(self.instance_id)
        join(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Instance, "join", counted)
    stats = sim.run()
    assert stats.hybrid_early_returns > 0  # the case is exercised
    assert ghosts == []
    assert stats.roll_busy_gpu_s <= stats.roll_gpu_s


def test_a_loan_given_back_before_it_joined_joins_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # An instance lent, woken by a rollout start before it joined, and lent again: the first loan's
    # HYBRID_READY is outdated. Before 2026-12-06 it joined the update too (two joins, the first
    # `join_s` early for the second loan).
    sim = build_sim("tiny", "+elastic")
    monkeypatch.setattr(sim, "on_rollout_start", lambda j: None)  # no rollout: only the loans run
    monkeypatch.setattr(pipeline, "on_train_done", lambda s, t=None: None)
    before = pipeline._train_gpus_now(sim)
    sim.trainer.start(0.0, 0, 1e6, before)
    inst = sim.instances[0]
    pipeline._lend(sim, inst)
    pipeline.wake(sim, inst)  # a rollout start takes the lent instances back
    sim.lent = []
    pipeline._lend(sim, inst)
    stats = sim.run()
    assert stats.lent_joins == 1 and sim.lent_ready == {inst.instance_id}
    assert sim.trainer.gpus == before + inst.tp
