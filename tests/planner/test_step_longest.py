"""The distribution of an optimizer step's longest sequence, checked against random deals of the
sequences into steps, and the training price it floors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from libra_core.planner.presets import workload_preset
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.step_longest import StepLongest
from libra_core.planner.train_cost import TrainLayout, TrainShape, estimate_train, rank_step_flops

A, B = 3.0, 0.002  # a sequence of length s costs A s + B s^2


def _dealt(lengths: list[float], steps: int, share: float, rng: random.Random) -> float:
    """A rank's mean floored work over the steps of one random deal."""
    order = lengths[:]
    rng.shuffle(order)
    per = len(order) // steps
    return float(
        np.mean(
            [
                max(share, A * s + B * s * s)
                for s in (max(order[i * per : (i + 1) * per]) for i in range(steps))
            ]
        )
    )


@pytest.mark.parametrize("share", [0.0, 5_000.0, 60_000.0, 1e9])
def test_the_expected_floor_matches_random_deals_into_steps(share: float) -> None:
    rng = random.Random(0)
    lengths = [rng.lognormvariate(7.0, 1.0) for _ in range(64)]
    dist = StepLongest.of(np.array(lengths), pool=64, per_step=16)
    assert dist.prob.sum() == pytest.approx(1.0) and (dist.prob >= 0).all()
    deals = np.mean([_dealt(lengths, 4, share, rng) for _ in range(20_000)])
    assert dist.expected_floored(share, A, B) == pytest.approx(deals, rel=0.01)
    longest = max(lengths)
    if share < A * longest + B * longest**2:  # every step floored at the iteration's longest: above
        assert dist.expected_floored(share, A, B) < max(share, A * longest + B * longest**2) * 0.95


@pytest.mark.parametrize("share", [0.5, 0.25])
def test_a_trained_share_is_a_random_subset_of_the_pool(share: float) -> None:
    # Dynamic sampling trains a share of the sampled trajectories: a step's sequences are then a
    # random subset of the whole pool, not of a pool the size of the trained count.
    rng = random.Random(1)
    lengths = [rng.lognormvariate(7.0, 1.0) for _ in range(64)]
    trained, steps = int(64 * share), 2
    dist = StepLongest.of(np.array(lengths), pool=64, per_step=trained / steps)

    def deal() -> float:
        return _dealt(rng.sample(lengths, trained), steps, 0.0, rng)

    deals = np.mean([deal() for _ in range(20_000)])
    assert dist.expected_floored(0.0, A, B) == pytest.approx(deals, rel=0.01)


def test_a_step_of_the_whole_population_holds_the_longest() -> None:
    lengths = np.array([100.0, 200.0, 5_000.0])
    one_step = StepLongest.of(lengths, pool=3, per_step=3)
    assert one_step.prob.tolist() == pytest.approx([0.0, 0.0, 1.0])
    # a sample that stands for many sequences: a step of thousands almost surely meets the longest
    many = StepLongest.of(lengths, pool=30_000, per_step=7_500)
    assert many.prob[-1] == pytest.approx(1.0)


def test_the_update_is_priced_below_the_old_every_step_floor_only_where_the_floor_decides() -> None:
    m, hw = get_model("qwen3-8b"), get_hardware("A800")
    shape = TrainShape.from_workload(workload_preset("math-short", seed=0))
    bound = TrainShape(
        shape.tokens, shape.sum_sq_len, shape.max_seq_len, shape.minibatches
    )  # no distribution
    few = TrainLayout(1, 1, 8, zero_stage=1)  # an even share far above any one sequence
    assert rank_step_flops(m, shape, few) == pytest.approx(rank_step_flops(m, bound, few))
    wide = TrainLayout(1, 1, 1024, zero_stage=1)  # more ranks than sequences per step
    assert rank_step_flops(m, shape, wide) < 0.9 * rank_step_flops(m, bound, wide)
    assert estimate_train(m, hw, wide, shape).time_s < estimate_train(m, hw, wide, bound).time_s


def test_tensor_parallel_traffic_follows_the_steps_longest_too() -> None:
    # A rank's micro-batches carry its share of a step, at least the step's own longest sequence:
    # until 2026-12-07 their TP all-reduces were priced at the iteration's longest in every step.
    m, hw = get_model("qwen3-14b"), get_hardware("A800")
    shape = TrainShape.from_workload(workload_preset("math-short", seed=0))
    bound = TrainShape(shape.tokens, shape.sum_sq_len, shape.max_seq_len, shape.minibatches)
    few = TrainLayout(4, 1, 8, zero_stage=1)
    assert estimate_train(m, hw, few, shape).tp_comm_s == pytest.approx(
        estimate_train(m, hw, few, bound).tp_comm_s
    )
    wide = TrainLayout(4, 1, 64, zero_stage=1)
    per_step, every_step = estimate_train(m, hw, wide, shape), estimate_train(m, hw, wide, bound)
    assert per_step.tp_comm_s < 0.95 * every_step.tp_comm_s
    # the expected tokens a rank holds: between the even share and the iteration's longest
    share = shape.tokens / shape.minibatches / wide.dp
    assert shape.step_longest is not None
    rank_tokens = shape.step_longest.expected_floored(share, 1.0, 0.0)
    assert max(share, float(np.min(shape.step_longest.lens))) < rank_tokens < shape.max_seq_len


@pytest.mark.parametrize(("groups", "steps"), [(16, 4), (2, 2), (1, 1), (0, 1)])
def test_the_update_is_priced_at_the_steps_its_trained_groups_make(groups: int, steps: int) -> None:
    # The trainer deals the groups with signal into at most `minibatches` parts: with 1 of 16 groups
    # trained it takes one step, which was priced as 4 (each with its DP sync and optimizer step)
    # until 2026-12-07, and the live planner's update correction learned that error as the model's.
    from dataclasses import replace

    from libra_core.planner.train_cost import update_steps

    w = replace(workload_preset("search-medium", seed=0), prompts_per_iteration=16, minibatches=4)
    trained = replace(w, train_share=groups / 16)
    assert update_steps(trained) == steps
    shape = TrainShape.from_workload(trained)
    assert shape.minibatches == steps
    if groups:  # each step trains about one group's tokens: the price scales with the groups
        m, hw = get_model("qwen3-8b"), get_hardware("H100")
        layout = TrainLayout(1, 1, 8, zero_stage=3)
        whole = estimate_train(m, hw, layout, TrainShape.from_workload(replace(w, train_share=1.0))).time_s
        assert estimate_train(m, hw, layout, shape).time_s < whole * max(steps, groups) / 4 * 1.2
