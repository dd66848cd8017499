"""Damaged or foreign files at the data layer's read boundary (`read_ipc`, `read_lake`) fail with a
TrajectorySchemaError naming the file, never a crash; `atomic_path` gives each write its own temp
file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from fnmatch import fnmatch
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from libra_core.data.atomic import atomic_path
from libra_core.data.io import lake_path, read_ipc, read_lake, write_ipc, write_lake
from libra_core.data.schema import TRAJECTORY_SCHEMA, TrajectorySchemaError, table_from_rows
from tests.data.test_schema import row

ROOT = Path(__file__).resolve().parents[2]


def _offsets(*values: int) -> bytes:
    return b"".join(v.to_bytes(4, "little") for v in values)


@pytest.mark.parametrize(
    "offsets",
    [(0, 3, 100_000), (0, 3, 2**31 - 1), (0, 5, 2)],
    ids=["past-the-values", "huge", "non-monotonic"],
)
def test_read_ipc_with_damaged_list_offsets_is_a_clean_error(
    tmp_path: Path, offsets: tuple[int, ...]
) -> None:
    table = table_from_rows([row(reward=1.0), row(trajectory_id="b", sample_index=1, reward=0.0)])
    data = write_ipc(table, tmp_path / "x.arrow").read_bytes()
    # the offsets of `prompt_ids` (two rows of 3 tokens); the footer stays intact
    good = _offsets(0, 3, 6)
    assert data.count(good) == 1
    path = tmp_path / "damaged.arrow"
    path.write_bytes(data.replace(good, _offsets(*offsets)))
    # In a child: reading the damaged buffers past the memory map raised SIGBUS, which would
    # kill pytest itself.
    code = (
        "import sys\n"
        "from libra_core.data.io import read_ipc\n"
        "from libra_core.data.schema import TrajectorySchemaError\n"
        "try:\n"
        "    read_ipc(sys.argv[1])\n"
        "except TrajectorySchemaError as err:\n"
        "    print(err)\n"
        "    sys.exit(3)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, (out.returncode, out.stderr[-2000:])
    assert out.stdout.startswith(f"{path} is damaged: "), out.stdout


def test_read_ipc_of_another_table_names_the_file(tmp_path: Path) -> None:
    other = pa.table({"x": [1, 2]})
    path = tmp_path / "other.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, other.schema) as w:
        w.write_table(other)
    with pytest.raises(TrajectorySchemaError) as err:
        read_ipc(path)
    assert str(err.value).startswith(f"{path}: trajectory schema mismatch: missing field 'trajectory_id'")


def test_read_ipc_names_the_file_of_a_bad_row(tmp_path: Path) -> None:
    # written by another tool, without the validation of write_ipc
    bad = pa.Table.from_pylist([row(reward=1.0, behavior_logprobs=[-0.5])], schema=TRAJECTORY_SCHEMA)
    path = tmp_path / "badlen.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, TRAJECTORY_SCHEMA) as w:
        w.write_table(bad)
    with pytest.raises(TrajectorySchemaError) as err:
        read_ipc(path)
    assert str(err.value).startswith(f"{path}: trajectory 'it00001-g0000-s00' (row 0): behavior_logprobs (1)")


def _lake(run: Path, iterations: int) -> None:
    for it in range(1, iterations + 1):
        rows = [
            row(iteration=it, trajectory_id=f"it{it}-a", reward=1.0),
            row(iteration=it, trajectory_id=f"it{it}-b", sample_index=1, reward=0.5),
        ]
        write_lake(table_from_rows(rows), run, it)


def test_read_lake_names_the_partition_and_its_row(tmp_path: Path) -> None:
    _lake(tmp_path, 3)
    bad = row(iteration=3, trajectory_id="it3-b", sample_index=1, reward=1.0, loss_mask=[1, 1, 0])
    good = row(iteration=3, trajectory_id="it3-a", reward=1.0)
    pq.write_table(pa.Table.from_pylist([good, bad], schema=TRAJECTORY_SCHEMA), lake_path(tmp_path, 3))
    with pytest.raises(TrajectorySchemaError) as err:
        read_lake(tmp_path)
    # row 1 of the third file, not row 5 of the lake
    assert str(err.value).startswith(f"lake file {lake_path(tmp_path, 3)}: trajectory 'it3-b' (row 1): ")


def test_write_lake_refuses_rows_of_another_iteration_and_keeps_the_lake_readable(tmp_path: Path) -> None:
    # written, after which read_lake refused the partition and with it the whole lake
    _lake(tmp_path, 1)
    rows = [
        row(iteration=2, trajectory_id="it2-a", reward=1.0),
        row(iteration=1, trajectory_id="x", reward=1.0),
    ]
    with pytest.raises(TrajectorySchemaError, match=r"row 1 \(trajectory 'x'\) is of iteration 1;"):
        write_lake(table_from_rows(rows), tmp_path, 2)
    assert not lake_path(tmp_path, 2).exists()
    assert read_lake(tmp_path).num_rows == 2


def test_read_lake_names_both_partitions_of_a_duplicated_trajectory(tmp_path: Path) -> None:
    _lake(tmp_path, 3)
    # a second file whose name also says iteration 1, with a copy of the first one's rows
    copy = lake_path(tmp_path, 1).with_name("iteration=1.parquet")
    pq.write_table(pq.read_table(lake_path(tmp_path, 1)), copy)
    with pytest.raises(TrajectorySchemaError) as err:
        read_lake(tmp_path)
    message = str(err.value)
    assert message.startswith(f"lake file {copy}: trajectory 'it1-a' (row 0): ")
    assert "a second row of iteration 1" in message
    assert message.endswith(f"the first is in lake file {lake_path(tmp_path, 1)}")
    assert read_lake(tmp_path, 1).num_rows == 2  # alone, the file is sound


@pytest.mark.parametrize("moved", [False, True], ids=["copied-read-iteration-3", "moved-read-all"])
def test_a_partition_of_another_iteration_names_the_file_and_both_iterations(
    tmp_path: Path, moved: bool
) -> None:
    _lake(tmp_path, 3)
    # the third file holds iteration 1's rows (a copy of its file, or the file itself renamed): read
    # as iteration 3, the planner would replay iteration 1's lengths as iteration 3's
    if moved:
        lake_path(tmp_path, 1).replace(lake_path(tmp_path, 3))
    else:
        pq.write_table(pq.read_table(lake_path(tmp_path, 1)), lake_path(tmp_path, 3))
    with pytest.raises(TrajectorySchemaError) as err:
        read_lake(tmp_path) if moved else read_lake(tmp_path, 3)
    assert str(err.value).startswith(
        f"lake file {lake_path(tmp_path, 3)}: expected rows of iteration 3, found iteration 1 in row 0 "
        "(trajectory 'it1-a'); was the file copied or renamed"
    )
    assert read_lake(tmp_path, 2).column("iteration").to_pylist() == [2, 2]


def test_a_partition_with_rows_of_two_iterations_names_the_first_stray_row(tmp_path: Path) -> None:
    rows = [
        row(iteration=2, trajectory_id="it2-a", reward=1.0),
        row(iteration=5, trajectory_id="it5-b", sample_index=1, reward=0.5),
    ]
    lake_path(tmp_path, 2).parent.mkdir(parents=True)  # written by hand: write_lake refuses it
    pq.write_table(table_from_rows(rows), lake_path(tmp_path, 2))
    with pytest.raises(
        TrajectorySchemaError, match=r"expected rows of iteration 2, found iteration 5 in row 1 "
    ):
        read_lake(tmp_path, 2)


def test_a_lake_file_whose_name_says_no_iteration_is_named(tmp_path: Path) -> None:
    _lake(tmp_path, 1)
    stray = lake_path(tmp_path, 1).with_name("iteration=old.parquet")
    lake_path(tmp_path, 1).replace(stray)
    with pytest.raises(TrajectorySchemaError) as err:
        read_lake(tmp_path)
    assert str(err.value).startswith(f"lake file {stray}: the name does not say an iteration")


def test_atomic_path_gives_each_write_its_own_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second
        # what a resume deletes as a killed write's leftover (pipeline/resume.py)
        assert fnmatch(first.name, ".*.tmp-*") and fnmatch(second.name, ".*.tmp-*")
        first.write_text("first")
        second.write_text("second")
    assert target.read_text() == "first"  # the outer block left last
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_two_threads_writing_one_target_do_not_share_a_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    target.write_text("old")
    a_started, b_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_writer() -> None:
        try:
            with atomic_path(target) as tmp, tmp.open("w") as f:
                f.write("A" * 10)
                f.flush()
                a_started.set()
                assert b_done.wait(timeout=30)
                f.write("A" * 10)
        except BaseException as err:  # reported by the test thread
            errors.append(err)
            a_started.set()

    def fast_writer() -> None:
        assert a_started.wait(timeout=30)
        try:
            with atomic_path(target) as tmp:
                tmp.write_text("B" * 5)
        except BaseException as err:
            errors.append(err)
        finally:
            b_done.set()

    threads = [threading.Thread(target=slow_writer), threading.Thread(target=fast_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert target.read_text() == "A" * 20  # the write that finished last, whole
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_read_lake_orders_partitions_by_iteration_past_five_digits(tmp_path: Path) -> None:
    # sorted by name, iteration=100000.parquet came before iteration=99999.parquet
    for it in (100_000, 99_999, 7):
        write_lake(table_from_rows([row(iteration=it, trajectory_id=f"it{it}", reward=1.0)]), tmp_path, it)
    assert read_lake(tmp_path).column("iteration").to_pylist() == [7, 99_999, 100_000]


@pytest.mark.skipif(os.name != "posix", reason="folders are synced on POSIX only")
def test_atomic_path_syncs_the_folder_after_the_rename(tmp_path: Path, monkeypatch) -> None:
    # The rename is folder data: without a folder fsync a power loss could lose the new name.
    target = tmp_path / "sub" / "x.txt"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert events == ["file", "rename", "folder"] and target.read_text() == "new"
