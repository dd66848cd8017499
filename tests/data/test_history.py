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
