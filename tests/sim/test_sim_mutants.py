"""Simulator details a mutation audit found unguarded by the rest of tests/sim and the golden trace.

Guards: the elastic hybrids' share of an update's rate (`Trainer.rate`), the router's walk past
empty buckets (`Router.clamp`) and its per-GPU load (`Router._least`), an empty instance taking a
turn larger than its KV cache (`Instance.fits`), the rank of an iteration's t90
(`Simulator.finish`), and what a replan decides on: the iterations the run has left and the window
of the last `window_iterations` rollouts (pipeline.replan, pipeline.on_rollout_done). Expected
values are worked out here from the documented rules, not copied from a run.
"""

from __future__ import annotations

import pytest

from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.specs import get_hardware, get_model
from libra_core.sim.engine import Simulator
from libra_core.sim.instance import CostTables, Instance
from libra_core.sim.router import Router
from libra_core.sim.settings import SimSettings
from libra_core.sim.training import HYBRID_EFFICIENCY, Trainer
from tests.sim.builders import build_sim

TABLES = CostTables(RolloutCostModel(get_model("qwen3-8b"), get_hardware("A800"), max_num_seqs=16), (1, 8))


def _instance(instance_id: int, tp: int, bucket: int) -> Instance:
    return Instance(instance_id, tp, bucket, TABLES, TABLES.kv_capacity[tp])


def _run_turns(inst: Instance, n: int) -> None:
    for k in range(n):
        inst.join(0.0, f"turn{inst.instance_id}.{k}", 100, 100, 50)


def test_hybrid_gpus_train_at_the_hybrid_efficiency() -> None:
    # Trainer.rate: GPUs past the core count at HYBRID_EFFICIENCY each (not 1, not 0); fewer than the
    # core slow the update in proportion (training.py's docstring).
    eff = HYBRID_EFFICIENCY
    assert 0.0 < eff < 1.0  # else the cases below could not tell the efficiency from 0 or 1

    core = Trainer(train_gpus=8)
    core.start(0.0, 0, time_s=100.0, gpus=8.0)
    assert core.done_s() == pytest.approx(100.0)

    doubled = Trainer(train_gpus=8)
    doubled.start(0.0, 0, time_s=100.0, gpus=16.0)  # one core replica's worth of hybrids
    assert doubled.done_s() == pytest.approx(100.0 / (1.0 + eff))

    half = Trainer(train_gpus=8)
    half.start(0.0, 0, time_s=100.0, gpus=4.0)  # hybrids not back yet: half the core
    assert half.done_s() == pytest.approx(200.0)

    # Half the update on the core alone, then 4 hybrid GPUs join: the other half at (8 + 4 eff) / 8.
    joined = Trainer(train_gpus=8)
    joined.start(0.0, 0, time_s=100.0, gpus=8.0)
    joined.set_gpus(50.0, 12.0)
    assert joined.remaining == pytest.approx(0.5)
    assert joined.done_s() == pytest.approx(50.0 + 50.0 / ((8.0 + 4.0 * eff) / 8.0))
    assert joined.finish(joined.done_s()) == 0
    assert joined.busy_gpu_s == pytest.approx(50.0 * 8.0 + (50.0 / ((8.0 + 4.0 * eff) / 8.0)) * 12.0)


def test_clamp_walks_down_past_empty_buckets() -> None:
    # Router.clamp: a scheduler bucket with no instance maps to the nearest *shorter* bucket that has
    # one (a shorter bucket's work never goes to a longer one by clamping); out-of-range indices first
    # clamp into [0, num_buckets - 1]. Buckets 1 and 3 of 4 are empty here.
    router = Router([_instance(0, 1, 0), _instance(1, 8, 2)], num_buckets=4, placement="least_load")
    assert [router.clamp(b) for b in (-3, 0, 1, 2, 3, 9)] == [0, 0, 0, 2, 2, 2]


def test_least_load_compares_running_sequences_per_gpu() -> None:
    # Router._least: the least-loaded instance is the one with the fewest running sequences per GPU
    # of its TP degree: a TP8 instance with 2 sequences (0.25 per GPU) beats a TP1 one with 1.
    for order in ((0, 1), (1, 0)):  # whichever comes first in the bucket
        tp1, tp8 = _instance(0, 1, 0), _instance(1, 8, 0)
        _run_turns(tp1, 1)
        _run_turns(tp8, 2)
        pair = [tp1, tp8]
        router = Router([pair[i] for i in order], num_buckets=1, placement="least_load")
        assert router.choose(0, None, 1000) is tp8
        _run_turns(tp8, 7)  # 9 sequences: 1.125 per GPU against 1 -- now the TP1 one is less loaded
        assert router.choose(0, None, 1000) is tp1


def test_an_empty_instance_takes_a_turn_larger_than_its_kv_cache() -> None:
    # Instance.fits: an instance with nothing running always takes one turn, however long its final
    # context (else such a turn would wait forever); a busy one takes it only if the KV cache holds it.
    inst = _instance(0, 1, 0)
    giant = 2.0 * inst.kv_capacity
    router = Router([inst], num_buckets=1, placement="least_load")
    assert inst.fits(giant)
    assert router.choose(0, None, giant) is inst
    inst.join(0.0, "giant", giant - 50, giant - 50, 50)
    assert not inst.fits(giant)
    assert router.choose(0, None, giant) is None  # the next one waits in the queue
    assert inst.pop_done(inst.next_done_s()) == ["giant"]
    assert router.choose(0, None, giant) is inst  # empty again: it takes the next


def test_a_bucket_with_no_active_instance_admits_nowhere_in_it() -> None:
    # Router._least skips inactive instances (lent to training, or a training hybrid not ready yet):
    # a turn admitted to a bucket whose only instance is lent spills to a longer bucket's active
    # instance, or waits in the queue when there is none -- never onto the lent (idle) instance.
    lent, longer = _instance(0, 1, 0), _instance(1, 8, 1)
    lent.active = False
    router = Router([lent, longer], num_buckets=2, placement="least_load")
    assert router.choose(0, None, 1000) is longer
    alone = Router([lent], num_buckets=1, placement="least_load")
    assert alone.choose(0, None, 1000) is None
    lent.active = True  # back from training: it serves its bucket again
    assert router.choose(0, None, 1000) is lent


def test_t90_is_when_the_first_ninety_percent_of_trajectories_had_finished() -> None:
    # Simulator.finish: t90 is the finish of the k-th trajectory for the smallest k >= 0.9 n; tiny
    # runs 16 per iteration, 0.9 x 16 = 14.4, so the 15th (not the 14th, nor the 16th = the last).
    sim = build_sim("tiny", "static-optimal", 1)
    st = sim.run()
    rec = st.records[0]
    assert rec.trajectories == 16
    # Every trajectory is admitted at the rollout's start, so start + latency is its finish.
    ends = sorted(rec.rollout_start_s + lat for lat in st.latencies_s)
    assert len(ends) == 16
    assert ends[13] < ends[14] < ends[15]  # distinct, so a wrong rank reads another time
    assert rec.t90_s == pytest.approx(ends[14], rel=1e-12)
    assert rec.rollout_end_s == pytest.approx(ends[15], rel=1e-12)


ITERATIONS, WINDOW, PER_ITERATION = 5, 2, 16  # tiny: 4 prompts x 4 samples per iteration


@pytest.fixture(scope="module")
def replanned() -> tuple[Simulator, list[dict]]:
    """A +planning tiny run replanning at every rollout start (1..4) on a 2-iteration window."""
    settings = SimSettings(replan_every=1, window_iterations=WINDOW)
    sim = build_sim("tiny", "+planning", ITERATIONS, settings=settings)
    st = sim.run()
    decisions = [r for r in st.replans if r["action"] in ("apply", "keep")]
    assert [r["iteration"] for r in decisions] == [1, 2, 3, 4]
    return sim, decisions


def test_replan_amortises_over_the_iterations_left(replanned: tuple[Simulator, list[dict]]) -> None:
    # pipeline.replan passes `iterations_left=iterations - j` (this one included) to the decision,
    # which amortises a move over min(expected_iterations, that): 4, 3, 2, 1 here, not the
    # replanner's 50 nor the run's 5.
    sim, decisions = replanned
    assert sim.replanner.expected_iterations > ITERATIONS
    assert [r["expected_iterations"] for r in decisions] == [ITERATIONS - j for j in (1, 2, 3, 4)]


def test_replan_window_holds_the_last_window_iterations(replanned: tuple[Simulator, list[dict]]) -> None:
    # pipeline.on_rollout_done keeps the last `window_iterations` finished rollouts: the replan at
    # rollout j plans on iterations max(0, j - 2)..j - 1, at most 2 x 16 trajectories.
    sim, decisions = replanned
    expected = [min(j, WINDOW) * PER_ITERATION for j in (1, 2, 3, 4)]
    assert [r["window_trajectories"] for r in decisions] == expected
    assert [w.name for w in sim.windows] == [f"iter{j}" for j in range(ITERATIONS - WINDOW, ITERATIONS)]
