"""A damaged or invalid trace fails `read_trace` with a TraceSchemaError naming the file (what
`libra trace-eval` prints), and `trace-eval --json` writes every column of its table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from libra_core.scheduling.base import Turn
from libra_core.traces.evaluate import run_trace_eval
from libra_core.traces.schema import (
    TRACE_SCHEMA,
    TraceSchemaError,
    TraceTrajectory,
    read_trace,
    trace_table,
    write_trace,
)


def _trajectory(i: int) -> TraceTrajectory:
    turns = (Turn(10 + i, "calc", 5, "success"), Turn(20 * i + 7, None, 0, None))
    return TraceTrajectory(f"t{i}", f"p{i % 2}", 0, 12, turns, (0.1, None))


def _trace(path: Path, n: int = 3) -> Path:
    return write_trace(trace_table([_trajectory(i) for i in range(n)]), path)


def _turns(latency_s: float | None) -> list[dict[str, object]]:
    return [
        {"gen_tokens": 10, "tool": "calc", "payload_tokens": 5, "status": "success", "latency_s": latency_s},
        {"gen_tokens": 7, "tool": None, "payload_tokens": 0, "status": None, "latency_s": None},
    ]


def test_a_damaged_page_names_the_file(tmp_path: Path) -> None:
    data = bytearray(_trace(tmp_path / "t.parquet").read_bytes())
    for i in range(4, 20):  # the first page header, right after the magic bytes; the footer reads
        data[i] ^= 0xFF
    path = tmp_path / "damaged.parquet"
    path.write_bytes(data)
    with pytest.raises(TraceSchemaError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path} cannot be read as a Parquet trace (")


def test_a_missing_file_is_still_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_trace(tmp_path / "gone.parquet")


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (
            [
                {
                    "trajectory_id": "t0",
                    "prompt_id": "p",
                    "iteration": 0,
                    "prompt_tokens": 12,
                    "turns": _turns(float("nan")),
                }
            ],
            "trace row 0 (trajectory 't0'): turn 0 has latency_s nan",
        ),
        (
            [
                {
                    "trajectory_id": "t0",
                    "prompt_id": "p",
                    "iteration": i,
                    "prompt_tokens": 12,
                    "turns": _turns(0.1),
                }
                for i in range(2)
            ],
            "trajectory_id 't0' appears more than once",
        ),
        (
            [
                {
                    "trajectory_id": "t0",
                    "prompt_id": "p",
                    "iteration": 0,
                    "prompt_tokens": 12,
                    "turns": [{**_turns(0.1)[0], "tool": " "}, _turns(0.1)[1]],
                }
            ],
            "trace row 0 (trajectory 't0'): turn 0 calls a tool with an empty name ' '",
        ),
        (
            [
                {
                    "trajectory_id": "t0",
                    "prompt_id": "p",
                    "iteration": 0,
                    "prompt_tokens": 12,
                    "turns": [{**_turns(0.1)[0], "gen_tokens": 0}, _turns(0.1)[1]],
                }
            ],
            "trace row 0 (trajectory 't0'): turn 0 calls tool 'calc' but generated 0 tokens",
        ),
    ],
    ids=["nan-latency", "duplicate-id", "empty-tool-name", "call-of-no-tokens"],
)
def test_a_bad_row_names_the_file(tmp_path: Path, rows: list[dict[str, object]], problem: str) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path)  # no write_trace validation
    with pytest.raises(TraceSchemaError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}: {problem}")


def test_trace_eval_json_holds_the_table_columns_and_the_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.parquet", n=8)
    monkeypatch.chdir(tmp_path)  # no ./stages.yaml: the default config
    out = tmp_path / "m.json"
    args = ["trace-eval", "--trace", str(trace), "--buckets", "30,60", "--scheduler", "all"]
    assert main([*args, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    records = json.loads(out.read_text())
    expected = run_trace_eval(trace, "all", (30, 60))
    keys = ["scheduler", "routing_accuracy", "class_accuracy", "migration_token_ratio", "score"]
    assert [list(r)[:5] for r in records] == [keys] * len(expected)  # the keys written before, first
    assert records == expected
    for r in records:
        assert {"moves", "decisions", "trajectories"} <= set(r)
        assert r["trajectories"] == 8
        # the table's moves column shows the same number
        line = next(x for x in table.splitlines() if x.startswith(f"| {r['scheduler']} "))
        assert line.rstrip(" |").split("|")[-1].strip() == str(r["moves"])
    assert any(r["moves"] > 0 for r in records)  # some scheduler moved a request


def _retyped(column: str, values: pa.Array, turn_field: str | None = None) -> pa.Table:
    """A one-row trace whose `column` (or the turns' `turn_field`) holds `values` instead."""
    table = pa.Table.from_pylist(
        [
            {
                "trajectory_id": "t0",
                "prompt_id": "p",
                "iteration": 0,
                "prompt_tokens": 12,
                "turns": _turns(0.1),
            }
        ],
        schema=TRACE_SCHEMA,
    )
    if turn_field is not None:
        items = table.column("turns").combine_chunks().flatten()
        fields = [items.field(k) for k in range(items.type.num_fields)]
        names = [f.name for f in items.type]
        fields[names.index(turn_field)] = values
        turns = pa.ListArray.from_arrays([0, len(values)], pa.StructArray.from_arrays(fields, names=names))
        return table.set_column(table.schema.get_field_index("turns"), "turns", turns)
    return table.set_column(table.schema.get_field_index(column), column, values)


@pytest.mark.parametrize(
    ("column", "values", "got", "want"),
    [
        # each of these casts without an error: "12" -> 12, 12.0 -> 12, True -> 1, 7 -> "7"
        ("prompt_tokens", ["12"], "string", "int32"),
        ("prompt_tokens", [12.0], "double", "int32"),
        ("iteration", [True], "bool", "int32"),
        ("trajectory_id", [7], "int64", "string"),
        ("turns[].gen_tokens", ["10", "7"], "string", "int32"),
        ("turns[].payload_tokens", [5.0, 0.0], "double", "int32"),
    ],
)
def test_a_column_of_another_kind_is_refused_not_cast(
    tmp_path: Path, column: str, values: list[object], got: str, want: str
) -> None:
    name, _, turn_field = column.partition("[].")
    path = tmp_path / "typed.parquet"
    pq.write_table(_retyped(name, pa.array(values), turn_field or None), path)
    with pytest.raises(TraceSchemaError) as err:
        read_trace(path)
    assert str(err.value).startswith(
        f"{path}: column {column!r} has the wrong type: {got}, expected {want}; "
    )


def test_integer_and_float_columns_of_another_width_still_read(tmp_path: Path) -> None:
    # what pandas or polars write for Python ints and floats: the values are exact
    table = _retyped("prompt_tokens", pa.array([12], pa.int64()))
    table = table.set_column(
        table.schema.get_field_index("iteration"), "iteration", pa.array([3], pa.int64())
    )
    path = tmp_path / "wide.parquet"
    pq.write_table(table, path)
    (t,) = read_trace(path)
    assert (t.prompt_tokens, t.iteration, t.turns) == (
        12,
        3,
        (Turn(10, "calc", 5, "success"), Turn(7, None, 0, None)),
    )
    pq.write_table(_retyped("turns", pa.array([0.25, None], pa.float32()), turn_field="latency_s"), path)
    assert read_trace(path)[0].tool_latency_s == (0.25, None)
    # a value that does not fit is still an error naming the file, and (since 2026-12-07) its column
    pq.write_table(_retyped("prompt_tokens", pa.array([2**40], pa.int64())), path)
    want = f"^{re.escape(str(path))}: column 'prompt_tokens' does not fit the trace schema's int32"
    with pytest.raises(TraceSchemaError, match=want):
        read_trace(path)


def test_a_null_turn_names_the_row(tmp_path: Path) -> None:
    rows = [{"trajectory_id": "t0", "prompt_id": "p", "iteration": 0, "prompt_tokens": 12, "turns": [None]}]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path)
    with pytest.raises(TraceSchemaError) as err:  # was a TypeError from inside the row check
        read_trace(path)
    assert str(err.value) == f"{path}: trace row 0 (trajectory 't0'): turn 0 is null"


@pytest.mark.parametrize("column", ["iteration", "prompt_tokens", "trajectory_id", "prompt_id"])
def test_a_null_in_a_required_column_names_it(tmp_path: Path, column: str) -> None:
    # A file written with nullable columns (as pandas writes them) casts through; Arrow does not
    # enforce a top-level `nullable=False`. A null iteration was a TypeError, a null id accepted.
    rows = [
        {
            "trajectory_id": f"t{i}",
            "prompt_id": "p",
            "iteration": 0,
            "prompt_tokens": 12,
            "turns": _turns(0.1),
        }
        for i in range(3)
    ]
    rows[1][column] = None
    loose = pa.schema([f.with_nullable(True) for f in TRACE_SCHEMA])
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=loose), path)
    with pytest.raises(TraceSchemaError) as err:
        read_trace(path)
    assert str(err.value) == f"{path}: column {column!r} is null at row 1; it must hold a value in every row"
