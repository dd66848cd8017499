"""The workload the planner plans for: where each trajectory's last tool call leaves its context
(`Workload.last_call_ctx_tokens`), from turn lists, scaled, pooled and read back from the project's
trajectory table (its per-turn split comes from the loss mask)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from libra_core.planner.workload import (
    Turns,
    _turn_lengths,
    concat,
    workload_from_trajectory_table,
    workload_from_turns,
)


def _two() -> Turns:
    # One trajectory calls a tool after 30 tokens (8-token reply) and answers with 500; the other
    # answers at once.
    return Turns([100, 40], [[30, 500], [70]], [[8, 0], [0]], [1.5, 0.0])


def test_the_context_after_the_last_tool_return_is_kept() -> None:
    w = workload_from_turns("two", _two(), 1, 2)
    assert w.last_call_ctx_tokens is not None
    assert w.last_call_ctx_tokens.tolist() == [100 + 30 + 8, 40]  # no call: its prompt
    assert w.reprefill_ctx_tokens.tolist() == [130, 0]
    assert w.total_tokens.tolist() == [638, 110]


def test_scaling_stretches_the_growth_before_the_last_call() -> None:
    w = workload_from_turns("two", _two(), 1, 2).scaled(2.0)
    assert w.last_call_ctx_tokens is not None
    assert w.last_call_ctx_tokens.tolist() == [100 + 2 * 38, 40]


def test_pooling_keeps_it_only_when_every_window_has_it() -> None:
    a = workload_from_turns("a", _two(), 1, 2)
    pooled = concat([a, a], "pool")
    assert pooled.last_call_ctx_tokens is not None
    assert pooled.last_call_ctx_tokens.tolist() == [138, 40, 138, 40]
    assert concat([a, replace(a, last_call_ctx_tokens=None)], "pool").last_call_ctx_tokens is None
    with pytest.raises(AssertionError, match="last_call_ctx_tokens"):
        replace(a, last_call_ctx_tokens=np.array([1.0]))


@pytest.mark.parametrize(
    ("mask", "calls", "turns"),
    [
        ([1, 1, 1, 0, 0, 1, 1], 1, [3, 2]),  # call, observation, answer
        ([1, 0, 1, 1, 0, 0, 1, 1, 1], 2, [1, 2, 3]),
        ([1, 1, 0, 0], 1, [2, 0]),  # cut off after the observation: no answer turn
        ([1, 1, 1, 1], 0, [4]),
        ([1, 1, 1, 1], 1, [2, 2]),  # an empty observation: the runs cannot tell, split evenly
        ([1, 0, 1, 0, 1, 1], 1, [2, 2]),  # more observations than calls: split evenly
    ],
)
def test_turn_lengths_come_from_the_loss_mask(mask: list[int], calls: int, turns: list[float]) -> None:
    assert _turn_lengths(mask, calls) == pytest.approx(turns)


# One trajectory-table row: 10 prompt tokens; 4 generated, a 3-token observation, 20 generated.
ONE_CALL_ROW = {
    "iteration": 0,
    "prompt_id": "p0",
    "group_id": "g0",
    "prompt_ids": [1] * 10,
    "loss_mask": [1] * 4 + [0] * 3 + [1] * 20,
    "tool_events": [{"turn": 0, "payload_tokens": 3}],
    "tool_latency_s": 0.5,
}


def test_the_trajectory_table_places_the_last_call_where_it_happened() -> None:
    # The call returns at 10 + 4 + 3 = 17 tokens, not at the middle of the growth (10 + 27 / 2).
    w = workload_from_trajectory_table(pa.Table.from_pylist([ONE_CALL_ROW]), group_size=1)
    assert w.last_call_ctx_tokens is not None and w.last_call_ctx_tokens.tolist() == [17.0]
    assert w.gen_tokens.tolist() == [24.0] and w.reprefill_ctx_tokens.tolist() == [14.0]


def test_an_iteration_that_samples_one_problem_twice_counts_both_groups() -> None:
    # An environment with fewer problems than prompts per iteration cycles them: two groups of one
    # prompt id. Counted by prompt id, the iteration looked half its size.
    rows = [
        {**ONE_CALL_ROW, "prompt_id": "p", "group_id": f"g{g}", "iteration": it}
        for it in (1, 2)
        for g in (0, 1)
        for _ in range(2)
    ]
    w = workload_from_trajectory_table(pa.Table.from_pylist(rows), group_size=2)
    assert w.prompts_per_iteration == 2 and w.trajectories_per_iteration == 4


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (Turns([0, 0], [[0], [0]], [[0], [0]], [0.0, 0.0]), "has no tokens"),
        (Turns([10, 5], [[float("nan")], [3]], [[0], [0]], [0.0, 0.0]), "gen_tokens must be finite"),
        (Turns([10, 5], [[4], [3]], [[0], [0]], [-1.0, 0.0]), "tool_latency_s must be finite"),
    ],
)
def test_a_workload_without_tokens_or_with_bad_values_is_refused(turns: Turns, message: str) -> None:
    # all zero: a ZeroDivisionError (or numpy's geometric-sequence error) deep in the training price
    with pytest.raises(ValueError, match=message):
        workload_from_turns("bad", turns, 1, 2)


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_train_share_outside_0_1_is_refused(share: float) -> None:
    w = workload_from_turns("w", _two(), 1, 2)
    with pytest.raises(ValueError, match="train_share"):
        replace(w, train_share=share)


def test_training_is_priced_on_the_trained_share_and_pooling_weighs_it_by_tokens() -> None:
    from libra_core.planner.train_cost import TrainShape

    w = workload_from_turns("w", _two(), 1, 2)
    full, half = TrainShape.from_workload(w), TrainShape.from_workload(replace(w, train_share=0.5))
    assert half.tokens == pytest.approx(full.tokens / 2)
    assert half.sum_sq_len == pytest.approx(full.sum_sq_len / 2)
    assert half.max_seq_len == full.max_seq_len  # the longest may be among the kept
    long = replace(w, gen_tokens=w.gen_tokens * 3, train_share=0.2)
    pooled = concat([replace(w, train_share=1.0), long], "p")
    a, b = float(w.total_tokens.sum()), float(long.total_tokens.sum())
    assert pooled.train_share == pytest.approx((1.0 * a + 0.2 * b) / (a + b))
