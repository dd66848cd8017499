"""A damaged or invalid trace fails `read_trace` with a TraceSchemaError naming the file (what
`libra trace-eval` prints), and `trace-eval --json` writes every column of its table."""

from __future__ import annotations

import json
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
    ],
    ids=["nan-latency", "duplicate-id"],
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
