"""The run history (`history.parquet`): files written before a nullable column existed still read,
and a resumed run appends to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra_core.data.history import HISTORY_SCHEMA, append_history, history_path, read_history


def _row(iteration: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        f.name: (iteration if pa.types.is_integer(f.type) else 0.5 * iteration) for f in HISTORY_SCHEMA
    }
    row["migration_token_ratio"] = 0.25
    return row


def test_a_history_written_before_the_migration_ratio_reads_it_as_null_and_takes_new_rows(
    tmp_path: Path,
) -> None:
    old_schema = pa.schema([f for f in HISTORY_SCHEMA if f.name != "migration_token_ratio"])
    old_row = {k: v for k, v in _row(1).items() if k != "migration_token_ratio"}
    pq.write_table(pa.Table.from_pylist([old_row], schema=old_schema), history_path(tmp_path))
    (first,) = read_history(tmp_path)
    assert first["migration_token_ratio"] is None
    assert first["migrated_tokens"] == 1
    append_history(tmp_path, _row(2))
    assert [(r["iteration"], r["migration_token_ratio"]) for r in read_history(tmp_path)] == [
        (1, None),
        (2, 0.25),
    ]


def test_a_history_written_before_the_pool_lane_reads_pool_s_as_zero_and_takes_new_rows(
    tmp_path: Path,
) -> None:
    # Until 2026-12-07 plan_s included starting the rollout engines, and the file had no pool_s:
    # such a run's report, resume and next append must still work, its totals unchanged.
    old_schema = pa.schema([f for f in HISTORY_SCHEMA if f.name != "pool_s"])
    old_row = {k: v for k, v in _row(1).items() if k != "pool_s"}
    pq.write_table(pa.Table.from_pylist([old_row], schema=old_schema), history_path(tmp_path))
    (first,) = read_history(tmp_path)
    assert (first["plan_s"], first["pool_s"]) == (0.5, 0.0)
    append_history(tmp_path, _row(2) | {"pool_s": 3.0})
    assert [(r["iteration"], r["pool_s"]) for r in read_history(tmp_path)] == [(1, 0.0), (2, 3.0)]
    assert pq.read_schema(history_path(tmp_path)).field("pool_s").nullable is False
    # a file that has the column keeps its null check
    loose = pa.schema([f.with_nullable(True) for f in HISTORY_SCHEMA])
    pq.write_table(pa.Table.from_pylist([_row(1) | {"pool_s": None}], schema=loose), history_path(tmp_path))
    with pytest.raises(ValueError, match=r"column 'pool_s' holds null values \(1\)"):
        read_history(tmp_path)


def test_a_null_where_the_schema_has_none_names_the_file_and_column(tmp_path: Path) -> None:
    # another writer (pandas, a hand repair) declares every column nullable; `libra report` then
    # died on a TypeError and the next append on a pyarrow error naming no file
    loose = pa.schema([f.with_nullable(True) for f in HISTORY_SCHEMA])
    rows = [_row(1), _row(2) | {"iteration_s": None}]
    pq.write_table(pa.Table.from_pylist(rows, schema=loose), history_path(tmp_path))
    before = history_path(tmp_path).read_bytes()
    with pytest.raises(ValueError, match=r"history.parquet: column 'iteration_s' holds null values \(1\)"):
        read_history(tmp_path)
    with pytest.raises(ValueError, match=r"history.parquet: column 'iteration_s'"):
        append_history(tmp_path, _row(3))
    assert history_path(tmp_path).read_bytes() == before  # nothing rewritten


def test_a_column_this_version_does_not_know_is_read_past_but_never_dropped_by_a_rewrite(
    tmp_path: Path,
) -> None:
    # A history written by a newer Libra lost that column for every row at the next append (a
    # resume with an older checkout): read_table(schema=...) left it out of the rewrite.
    from libra_core.data.history import drop_history_after

    newer = pa.schema([*HISTORY_SCHEMA, pa.field("future_metric", pa.float64())])
    rows = [_row(1) | {"future_metric": 1.5}, _row(2) | {"future_metric": 2.5}]
    pq.write_table(pa.Table.from_pylist(rows, schema=newer), history_path(tmp_path))
    before = history_path(tmp_path).read_bytes()
    assert [r["iteration"] for r in read_history(tmp_path)] == [1, 2]  # the report still reads it
    for rewrite in (lambda: append_history(tmp_path, _row(3)), lambda: drop_history_after(tmp_path, 1)):
        with pytest.raises(
            ValueError, match=r"does not record \(\['future_metric'\]\); rewriting it would drop"
        ):
            rewrite()
    assert history_path(tmp_path).read_bytes() == before
    assert drop_history_after(tmp_path, 2) == 0  # nothing to drop: no rewrite, no refusal
