"""Lake -> trace export: turns are split at loss-mask runs and joined with their tool events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra_core.data.io import write_lake
from libra_core.data.schema import table_from_rows
from libra_core.scheduling.base import Turn
from libra_core.traces.export import export_trace, generation_runs, lake_to_trace
from libra_core.traces.schema import (
    TRACE_SCHEMA,
    TraceSchemaError,
    TraceTrajectory,
    read_trace,
    validate_trace,
)


def lake_row(
    tid: str,
    mask: list[int],
    events: list[tuple[int, int, str]],
    finish: str = "answer",
    latencies_s: list[float] | None = None,
) -> dict[str, Any]:
    n = len(mask)
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m == 1 and start is None:
            start = i
        if m != 1 and start is not None:
            spans.append({"start": start, "end": i, "version": 2})
            start = None
    return {
        "trajectory_id": tid,
        "iteration": 2,
        "prompt_id": "p",
        "group_id": f"g-{tid}",
        "sample_index": 0,
        "prompt_ids": [1, 2, 3, 4],
        "response_ids": [5] * n,
        "behavior_logprobs": [-0.1 if m else 0.0 for m in mask],
        "loss_mask": mask,
        "version_spans": spans,
        "min_version": 2,
        "max_version": 2,
        "tool_events": [
            {
                "turn": t,
                "tool": "calculator",
                "call_tokens": 2,
                "payload_tokens": p,
                "status": s,
                "latency_s": (latencies_s or [0.0] * len(events))[t],
            }
            for t, p, s in events
        ],
        # the agent loop counts every generation turn, so a tool event's turn is below it (the schema
        # checks it since 2026-12-07), even where a 0-token payload merged two runs into one span
        "num_turns": max(len(spans), 1 + max((t for t, _, _ in events), default=-1)),
        "finish_reason": finish,
        "final_answer": None,
        "reference_answer": "1",
        "reward": 1.0,
        "instance_id": "vllm-0",
        "rollout_latency_s": 0.1,
        "generation_latency_s": 0.1,
        "tool_latency_s": 0.0,
    }


def test_generation_runs() -> None:
    assert generation_runs([1, 1, 0, 0, 0, 1, 0, 1, 1, 1]) == [2, 1, 3]
    assert generation_runs([0, 1]) == [1]


def test_export_round_trip(tmp_path: Path) -> None:
    rows = [
        # 3 generated, 2 payload (success), 4 generated: two turns.
        lake_row("b", [1, 1, 1, 0, 0, 1, 1, 1, 1], [(0, 2, "success")], latencies_s=[0.25]),
        # ended on a tool return (max_turns): a final turn with 0 generated tokens is added.
        lake_row(
            "a",
            [1, 1, 0, 0, 0, 1, 0],
            [(0, 3, "failure"), (1, 1, "success")],
            finish="max_turns",
            latencies_s=[1.5, 0.0],
        ),
        lake_row("c", [1, 1], [], latencies_s=[]),  # answered at once: no call to time
    ]
    write_lake(table_from_rows(rows), tmp_path, 2)
    out = export_trace(tmp_path, tmp_path / "trace.parquet")
    trace = read_trace(out)
    assert [t.trajectory_id for t in trace] == ["a", "b", "c"]  # sorted by iteration, then id
    a, b, c = trace
    assert a.prompt_tokens == 4 and a.iteration == 2
    assert a.turns == (
        Turn(2, "calculator", 3, "failure"),
        Turn(1, "calculator", 1, "success"),
        Turn(0, None, 0, None),
    )
    assert b.turns == (Turn(3, "calculator", 2, "success"), Turn(4, None, 0, None))
    assert b.size == 4 + 3 + 2 + 4
    # each call's measured wall time rides along, none on the last turn
    assert a.tool_latency_s == (1.5, 0.0, None)
    assert b.tool_latency_s == (0.25, None)
    assert c.tool_latency_s is None and c.turns == (Turn(2, None, 0, None),)
    assert c.turn_latencies_s() == (None,) and b.turn_latencies_s() == (0.25, None)


def test_an_untimed_trajectory_has_one_form() -> None:
    turns = (Turn(3, "calc", 2, "success"), Turn(1, None, 0, None))
    untimed = TraceTrajectory("t", "p", 0, 4, turns, (None, None))
    assert untimed.tool_latency_s is None and untimed == TraceTrajectory("t", "p", 0, 4, turns)
    with pytest.raises(AssertionError, match="1 latencies for 2 turns"):
        TraceTrajectory("t", "p", 0, 4, turns, (0.5,))


def test_a_trace_written_before_latencies_reads_untimed(tmp_path: Path) -> None:
    old_turn = pa.struct([f for f in TRACE_SCHEMA.field("turns").type.value_type if f.name != "latency_s"])
    old_schema = pa.schema(
        [*[f for f in TRACE_SCHEMA if f.name != "turns"], pa.field("turns", pa.list_(old_turn))]
    )
    turns = [
        {"gen_tokens": 2, "tool": "calc", "payload_tokens": 1, "status": "timeout"},
        {"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None},
    ]
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([trace_row(turns)], schema=old_schema), path)
    (t,) = read_trace(path)
    assert t.turns == (Turn(2, "calc", 1, "timeout"), Turn(1, None, 0, None))
    assert t.tool_latency_s is None


def test_misaligned_row_is_refused() -> None:
    # A zero-token payload merges two generation runs: one run, two tool events.
    lake = table_from_rows([lake_row("x", [1, 1, 1], [(0, 0, "success"), (1, 0, "success")])])
    with pytest.raises(TraceSchemaError, match="'x'.*do not line up"):
        lake_to_trace(lake)


def test_a_zero_token_payload_that_may_have_merged_turns_is_refused() -> None:
    # 2 generated, a 0-token payload, 3 generated, a 4-token payload, then a 5-token answer: two runs
    # for two events read as "ended on a tool return", and the turns were silently mis-split
    # ((5, 0), (5, 4), (0, end) for (2, 0), (3, 4), (5, end)).
    mask = [1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    lake = table_from_rows([lake_row("x", mask, [(0, 0, "success"), (1, 4, "failure")], finish="answer")])
    with pytest.raises(TraceSchemaError, match="'x': a zero-token tool payload may have merged"):
        lake_to_trace(lake)
    # the same counts with every payload non-empty: a trajectory that ended on its second tool return
    ended = table_from_rows([lake_row("y", [1, 1, 0, 1, 1, 1, 0, 0], [(0, 1, "success"), (1, 2, "failure")])])
    (turns,) = lake_to_trace(ended).column("turns").to_pylist()
    assert [(t["gen_tokens"], t["payload_tokens"]) for t in turns] == [(2, 1), (3, 2), (0, 0)]


def test_a_call_that_used_the_last_of_the_budget_ends_the_trajectory() -> None:
    # The agent loop cuts the observation to the room left: a call ending at the budget gets a
    # 0-token payload and the run stops (max_tokens). The export refused the row, and with it the
    # whole run's export.
    mask = [1] * 4 + [0] * 3 + [1] * 6
    lake = table_from_rows([lake_row("b", mask, [(0, 3, "success"), (1, 0, "success")], finish="max_tokens")])
    (turns,) = lake_to_trace(lake).column("turns").to_pylist()
    assert [(t["gen_tokens"], t["payload_tokens"], t["tool"]) for t in turns] == [
        (4, 3, "calculator"),
        (6, 0, "calculator"),
        (0, 0, None),
    ]
    # at max_turns the loop stops only after a tool return: the same counts cannot hide a merge
    lake = table_from_rows([lake_row("t", mask, [(0, 3, "success"), (1, 0, "success")], finish="max_turns")])
    assert lake_to_trace(lake).num_rows == 1
    # a zero-token payload before the last one is still ambiguous, at max_tokens too
    mask = [1] * 5 + [0] * 3 + [1] * 2
    early = table_from_rows(
        [lake_row("e", mask, [(0, 0, "success"), (1, 3, "success")], finish="max_tokens")]
    )
    with pytest.raises(TraceSchemaError, match="'e': a zero-token tool payload may have merged"):
        lake_to_trace(early)


def test_the_export_records_the_policy_version_of_the_first_token() -> None:
    row = lake_row("v", [1, 1, 0, 1], [(0, 1, "success")])
    # an async row: its first token from version 12, its second (after a weight sync) from 13
    later = {**lake_row("w", [1, 1], []), "iteration": 3, "min_version": 12, "max_version": 13}
    later["version_spans"] = [{"start": 0, "end": 1, "version": 12}, {"start": 1, "end": 2, "version": 13}]
    trace = lake_to_trace(table_from_rows([row, later]))
    assert trace.column("iteration").to_pylist() == [2, 3]
    assert trace.column("policy_version").to_pylist() == [row["min_version"], 12]


def test_a_trace_written_before_policy_versions_reads_without_them(tmp_path: Path) -> None:
    old_schema = pa.schema([f for f in TRACE_SCHEMA if f.name != "policy_version"])
    turns = [{"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None, "latency_s": None}]
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([trace_row(turns)], schema=old_schema), path)
    (t,) = read_trace(path)
    assert t.policy_version is None and t.iteration == 0


def trace_row(turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"trajectory_id": "t", "prompt_id": "p", "iteration": 0, "prompt_tokens": 3, "turns": turns}


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (
            [{"gen_tokens": 1, "tool": "x", "payload_tokens": 1, "status": "success"}],
            "last turn must have null",
        ),
        (
            [
                {"gen_tokens": 1, "tool": "x", "payload_tokens": 1, "status": "crashed"},
                {"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None},
            ],
            "turn 0 needs a tool and a status",
        ),
        ([], "has no turns"),
        (
            [
                {"gen_tokens": 1, "tool": "x", "payload_tokens": 1, "status": "success", "latency_s": -0.5},
                {"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None},
            ],
            "turn 0 has latency_s -0.5",
        ),
        (
            [
                {
                    "gen_tokens": 1,
                    "tool": "x",
                    "payload_tokens": 1,
                    "status": "success",
                    "latency_s": float("nan"),
                },
                {"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None},
            ],
            "turn 0 has latency_s nan",
        ),
        (  # finite, but two of them sum to inf when a replay prices the trajectory
            [
                {"gen_tokens": 1, "tool": "x", "payload_tokens": 1, "status": "success", "latency_s": 1e308},
                {"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None},
            ],
            r"turn 0 has latency_s 1e\+308; .* in \[0, 86400\]",
        ),
        (
            [{"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None, "latency_s": 2.0}],
            "last turn's latency_s must be null",
        ),
        (  # tokens nothing appends: they were counted in throughput but never simulated
            [{"gen_tokens": 1, "tool": None, "payload_tokens": 5000, "status": None}],
            "0 payload_tokens .* payload_tokens 5000",
        ),
    ],
)
def test_trace_invariants(turns: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(TraceSchemaError, match=message):
        validate_trace(pa.Table.from_pylist([trace_row(turns)], schema=TRACE_SCHEMA))


def test_a_negative_iteration_is_refused() -> None:
    # the C-MLFQ clock starts at 0: iterations -40..-1 were aged as if all ran at version 0
    row = trace_row([{"gen_tokens": 1, "tool": None, "payload_tokens": 0, "status": None}]) | {
        "iteration": -3
    }
    with pytest.raises(TraceSchemaError, match=r"iteration is -3, must be >= 0"):
        validate_trace(pa.Table.from_pylist([row], schema=TRACE_SCHEMA))


def test_read_trace_names_missing_and_unexpected_columns(tmp_path: Path) -> None:
    path = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"trajectory_id": ["t"], "x": [1]}), path)
    with pytest.raises(TraceSchemaError, match=r"missing columns \['prompt_id'.*unexpected columns \['x'\]"):
        read_trace(path)


def test_read_trace_accepts_the_columns_in_another_order(tmp_path: Path) -> None:
    row = trace_row([{"gen_tokens": 5, "tool": None, "payload_tokens": 0, "status": None}])
    table = pa.Table.from_pylist([row], schema=TRACE_SCHEMA)
    path = tmp_path / "reordered.parquet"
    pq.write_table(table.select(list(reversed(TRACE_SCHEMA.names))), path)
    (t,) = read_trace(path)
    assert (t.trajectory_id, t.prompt_tokens, t.turns[0].gen_tokens) == ("t", 3, 5)


def test_read_trace_names_a_column_of_the_wrong_type(tmp_path: Path) -> None:
    row = trace_row([{"gen_tokens": 5, "tool": None, "payload_tokens": 0, "status": None}])
    table = pa.Table.from_pylist([row], schema=TRACE_SCHEMA).set_column(
        3, "prompt_tokens", pa.array(["many"])
    )
    path = tmp_path / "typed.parquet"
    pq.write_table(table, path)
    with pytest.raises(TraceSchemaError, match="wrong type"):
        read_trace(path)


def test_trace_summary_counts_calls_by_status_and_reads_the_latencies() -> None:
    from libra_core.traces.report import trace_summary

    turns = (Turn(3, "calc", 2, "success"), Turn(1, "calc", 1, "timeout"), Turn(2, None, 0, None))
    timed = TraceTrajectory("a", "p", 0, 4, turns, (0.5, 4.0, None))
    untimed = TraceTrajectory("b", "p", 0, 2, (Turn(5, None, 0, None),))
    assert trace_summary([timed, untimed]) == (
        "2 trajectories of 10.0 tokens on average; 2 tool calls (1 success, 1 timeout); "
        "2 with their latency: 0.5-4 s, median 2.25 s"
    )
    assert trace_summary([untimed]).endswith("; 0 tool calls; none with its latency")


def test_read_trace_on_a_folder_says_it_is_a_folder(tmp_path: Path) -> None:
    # `libra plan --workload DIR` and `libra simulate --scenario DIR` said "does not exist"
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a file"):
        read_trace(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        read_trace(tmp_path / "missing.parquet")
