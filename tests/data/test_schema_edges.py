"""Edge cases of the trajectory row invariants in `libra_core.data.schema` (mutation-audit gaps)."""

from __future__ import annotations

from typing import Any

import pytest

from libra_core.data.schema import TrajectorySchemaError, table_from_rows, validate_trajectories


def row(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "trajectory_id": "it00001-g0000-s00",
        "iteration": 1,
        "prompt_id": "p",
        "group_id": "g",
        "sample_index": 0,
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5, 6, 7, 8],
        "behavior_logprobs": [-0.5, -0.25, 0.0, 0.0, -1.0],
        "loss_mask": [1, 1, 0, 0, 1],
        "version_spans": [{"start": 0, "end": 2, "version": 3}, {"start": 4, "end": 5, "version": 4}],
        "min_version": 3,
        "max_version": 4,
        "tool_events": [
            {
                "turn": 0,
                "tool": "calculator",
                "call_tokens": 2,
                "payload_tokens": 2,
                "status": "success",
                "latency_s": 0.001,
            }
        ],
        "num_turns": 2,
        "finish_reason": "answer",
        "final_answer": "7",
        "reference_answer": "7",
        "reward": None,
        "instance_id": "vllm-0",
        "rollout_latency_s": 0.5,
        "generation_latency_s": 0.4,
        "tool_latency_s": 0.001,
    }
    base.update(over)
    return base


def test_baseline_row_is_valid() -> None:
    # Guard: the builder's row passes, so each rejection below is due to the one changed field.
    validate_trajectories(table_from_rows([row()]))


def test_positive_behavior_logprob_rejected() -> None:
    # Regression: dropping the `lp <= 1e-4` bound let a log-prob of 0.5 (probability > 1) through.
    bad = row(behavior_logprobs=[0.5, -0.25, 0.0, 0.0, -1.0])
    with pytest.raises(TrajectorySchemaError, match="finite and <= 0"):
        validate_trajectories(table_from_rows([bad]))


def test_empty_version_span_rejected() -> None:
    # Regression: `s < e` relaxed to `s <= e` accepted the empty span [3, 3).
    spans = [
        {"start": 0, "end": 2, "version": 3},
        {"start": 3, "end": 3, "version": 3},
        {"start": 4, "end": 5, "version": 4},
    ]
    with pytest.raises(TrajectorySchemaError, match="empty"):
        validate_trajectories(table_from_rows([row(version_spans=spans)]))


def test_tool_event_at_last_turn_index_rejected() -> None:
    # Regression: `turn >= num_turns` relaxed to `>` accepted turn 2 of a 2-turn trajectory.
    event = {
        "turn": 2,
        "tool": "calculator",
        "call_tokens": 2,
        "payload_tokens": 2,
        "status": "success",
        "latency_s": 0.001,
    }
    with pytest.raises(TrajectorySchemaError, match="tool event at turn 2 of a trajectory of 2 turns"):
        validate_trajectories(table_from_rows([row(tool_events=[event], num_turns=2)]))
