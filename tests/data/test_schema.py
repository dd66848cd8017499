from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra_core.data.io import read_ipc, read_lake, write_ipc, write_lake
from libra_core.data.schema import (
    TRAJECTORY_SCHEMA,
    TrajectorySchemaError,
    table_from_rows,
    validate_trajectories,
)


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


def test_roundtrip_ipc_and_lake(tmp_path: Path) -> None:
    table = table_from_rows([row(), row(trajectory_id="b", sample_index=1)])
    path = write_ipc(table, tmp_path / "x.arrow")
    back = read_ipc(path)
    assert back.equals(table)
    assert back.column("response_ids").to_pylist()[0] == [4, 5, 6, 7, 8]
    with pytest.raises(TrajectorySchemaError, match="reward is null"):
        write_lake(table, tmp_path, 1)
    rewarded = table.set_column(
        table.schema.get_field_index("reward"),
        TRAJECTORY_SCHEMA.field("reward"),
        pa.array([1.0, 0.1], pa.float32()),
    )
    write_lake(rewarded, tmp_path, 1)
    lake = read_lake(tmp_path)
    assert lake.schema.equals(TRAJECTORY_SCHEMA)
    assert lake.column("reward").to_pylist() == pytest.approx([1.0, 0.1])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"loss_mask": [1, 1, 0, 0]}, "must have the length of response_ids"),
        ({"behavior_logprobs": [-0.5, -0.25, -0.1, 0.0, -1.0]}, "must carry behavior log-prob 0.0"),
        ({"version_spans": [{"start": 0, "end": 2, "version": 3}]}, "not covered by any version span"),
        (
            {"version_spans": [{"start": 0, "end": 2, "version": 3}, {"start": 1, "end": 5, "version": 4}]},
            "overlapping",
        ),
        ({"min_version": 0}, "disagree with spans"),
        (
            {
                "tool_events": [
                    {
                        "turn": 0,
                        "tool": "c",
                        "call_tokens": 1,
                        "payload_tokens": 1,
                        "status": "ok",
                        "latency_s": 0.0,
                    }
                ]
            },
            "status 'ok'",
        ),
        ({"finish_reason": "done"}, "finish_reason 'done'"),
        ({"loss_mask": [1, 2, 0, 0, 1]}, "0 or 1"),
        ({"behavior_logprobs": [float("nan"), -0.25, 0.0, 0.0, -1.0]}, "finite and <= 0"),
        ({"behavior_logprobs": [-0.5, -0.25, 0.0, 0.0, float("-inf")]}, "finite and <= 0"),
        ({"reward": float("nan")}, "reward nan is not a finite number"),
        ({"rollout_latency_s": -1.0}, "must be finite and >= 0"),
        ({"tool_latency_s": float("inf")}, "must be finite and >= 0"),
        (
            {
                "version_spans": [],
                "loss_mask": [0] * 5,
                "behavior_logprobs": [0.0] * 5,
                "min_version": 7,
                "max_version": 2,
            },
            "min_version 7 is above max_version 2",
        ),
        ({"num_turns": -1}, "num_turns must be >= 0"),
        # each refused where the row enters since 2026-12-07 (a negative iteration's lake file made
        # the whole lake unreadable; a negative token id failed in the update's embedding lookup)
        ({"iteration": -1}, "iteration -1 is negative"),
        ({"prompt_ids": [1, -2, 3]}, "token ids >= 0"),
        ({"response_ids": [4, 5, -6, 7, 8]}, "token ids >= 0"),
        (
            {"version_spans": [{"start": 0, "end": 2, "version": -3}, {"start": 4, "end": 5, "version": 4}]},
            "negative version -3",
        ),
        (
            {
                "num_turns": 1,
                "tool_events": [
                    {
                        "turn": 7,
                        "tool": "c",
                        "call_tokens": 1,
                        "payload_tokens": 1,
                        "status": "success",
                        "latency_s": 0.0,
                    }
                ],
            },
            "tool event at turn 7 of a trajectory of 1 turns",
        ),
        # mutation-audit edges (2026-12-07): each bound one step looser passed the suite
        ({"behavior_logprobs": [0.5, -0.25, 0.0, 0.0, -1.0]}, "finite and <= 0"),
        (
            {
                "version_spans": [
                    {"start": 0, "end": 2, "version": 3},
                    {"start": 3, "end": 3, "version": 3},
                    {"start": 4, "end": 5, "version": 4},
                ]
            },
            "empty",
        ),
        (
            {"tool_events": [{**row()["tool_events"][0], "turn": 2}], "num_turns": 2},
            "tool event at turn 2 of a trajectory of 2 turns",
        ),
        ({"trajectory_id": None}, r"field 'trajectory_id' is null in row 0"),
        ({"response_ids": None}, r"field 'response_ids' is null in row 0"),
        ({"response_ids": [4, None, 6, 7, 8]}, r"field 'response_ids\[\]' is null in an item"),
        (
            {
                "version_spans": [
                    {"start": 0, "end": 2, "version": None},
                    {"start": 4, "end": 5, "version": 4},
                ]
            },
            r"'version_spans\[\].version' is null",
        ),
    ],
)
def test_invariants_rejected(override: dict[str, Any], message: str) -> None:
    with pytest.raises(TrajectorySchemaError, match=message):
        table_from_rows([row(**override)])


@pytest.mark.parametrize("field", ["call_tokens", "turn"])
def test_negative_tool_event_counts_rejected(field: str) -> None:
    event = {**row()["tool_events"][0], field: -1}
    with pytest.raises(TrajectorySchemaError, match="tool event turn, call_tokens"):
        table_from_rows([row(tool_events=[event])])


def test_a_trajectory_twice_in_one_iteration_is_rejected() -> None:
    with pytest.raises(TrajectorySchemaError, match="a second row of iteration 1"):
        table_from_rows([row(), row(sample_index=1)])  # the same trajectory id
    with pytest.raises(TrajectorySchemaError, match=r"\(group_id, sample_index\)"):
        table_from_rows([row(), row(trajectory_id="b")])  # the same sample of group g
    # the same ids in another iteration (the whole lake read at once) are other trajectories
    assert table_from_rows([row(), row(iteration=2)]).num_rows == 2


def test_a_null_in_a_lake_file_is_named(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([row(reward=1.0, prompt_id=None)], schema=TRAJECTORY_SCHEMA)
    (tmp_path / "lake").mkdir()
    # written by another tool, which declared the column nullable (Parquet refuses the null otherwise)
    loose = TRAJECTORY_SCHEMA.set(1 + 1, TRAJECTORY_SCHEMA.field("prompt_id").with_nullable(True))
    pq.write_table(table.cast(loose), tmp_path / "lake" / "iteration=00001.parquet")
    with pytest.raises(TrajectorySchemaError, match="field 'prompt_id' is null in row 0"):
        read_lake(tmp_path)
    with pytest.raises(TrajectorySchemaError, match="field 'prompt_id' is null"):
        write_lake(table, tmp_path, 2)
    assert not (tmp_path / "lake" / "iteration=00002.parquet").exists()


def test_schema_mismatch_named() -> None:
    table = table_from_rows([row()]).drop_columns(["reward"])
    with pytest.raises(TrajectorySchemaError, match="missing field 'reward'"):
        validate_trajectories(table)
    with pytest.raises(TrajectorySchemaError, match="unknown fields"):
        table_from_rows([row(extra=1)])


def test_write_failure_keeps_previous_file(tmp_path: Path) -> None:
    good = table_from_rows([row()])
    path = write_ipc(good, tmp_path / "x.arrow")
    bad = good.drop_columns(["reward"])
    with pytest.raises(TrajectorySchemaError):
        write_ipc(bad, path)
    assert read_ipc(path).equals(good)


def test_read_garbage_is_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.arrow"
    path.write_bytes(b"not arrow at all")
    with pytest.raises(TrajectorySchemaError, match="not an Arrow IPC file"):
        read_ipc(path)
