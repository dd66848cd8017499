"""Files with a few bytes changed (a bad disk, a bad copy) at the readers of a run's data: each
read either succeeds or raises the reader's error naming the file. pyarrow raises more than its own
errors on such bytes: an OSError from its I/O layer ("File too short") and a UnicodeDecodeError from
a damaged footer's strings escaped `read_ipc`, and an ArrowNotImplementedError escaped the history
check as a traceback out of `libra run --resume` (until 2026-12-07). Seeded, so the same damaged
files each run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from libra_core.data.history import append_history, read_history
from libra_core.data.io import read_ipc, write_ipc
from libra_core.data.schema import TrajectorySchemaError, table_from_rows
from tests.data.test_schema import row
from tests.observability.test_report import history_row

TRIES = 300


def _damaged_reads(path: Path, read: Callable[[], object], seed: int) -> list[BaseException]:
    """Read `path` after each of TRIES seeded changes of one to four bytes; the errors raised."""
    rng = random.Random(seed)
    whole = path.read_bytes()
    errors: list[BaseException] = []
    try:
        for _ in range(TRIES):
            damaged = bytearray(whole)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            path.write_bytes(bytes(damaged))
            try:
                read()
            except Exception as err:  # noqa: BLE001 - every kind is checked below
                errors.append(err)
    finally:
        path.write_bytes(whole)
    return errors


def _unnamed(errors: list[BaseException], path: Path, kind: type[BaseException]) -> list[str]:
    return [
        f"{type(e).__name__}: {e}"[:200] for e in errors if not (isinstance(e, kind) and str(path) in str(e))
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_damaged_arrow_file_is_a_trajectory_error_naming_it(tmp_path: Path, seed: int) -> None:
    rows = [
        row(trajectory_id=f"t{i}", group_id=f"g{i // 2}", sample_index=i % 2, reward=1.0) for i in range(6)
    ]
    path = write_ipc(table_from_rows(rows), tmp_path / "a.arrow", require_reward=True)
    errors = _damaged_reads(path, lambda: read_ipc(path, require_reward=True), seed)
    assert len(errors) > TRIES // 3  # most changes are caught: the test exercises the error paths
    assert _unnamed(errors, path, TrajectorySchemaError) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_a_damaged_history_is_a_value_error_naming_it(tmp_path: Path, seed: int) -> None:
    for iteration in (1, 2):
        append_history(tmp_path, history_row(iteration, random.Random(iteration)))
    path = tmp_path / "history.parquet"
    errors = _damaged_reads(path, lambda: read_history(tmp_path), seed)
    assert len(errors) > TRIES // 3
    assert _unnamed(errors, path, ValueError) == []
