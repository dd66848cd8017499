"""Moving trajectory batches between stages and onto disk.

Stages exchange Arrow IPC files (one record-batch file per stage output; tasks pass the path), and
every iteration's rewarded trajectories are appended to the Parquet trajectory lake of the run.
Every read and write validates against TRAJECTORY_SCHEMA. Writes are atomic (temp file + rename),
so a crash never leaves a half-written file where a reader expects a whole one.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from libra_core.data.atomic import atomic_path
from libra_core.data.schema import (
    DAMAGED_FILE_ERRORS,
    TRAJECTORY_SCHEMA,
    TrajectorySchemaError,
    parquet_schema_problems,
    validate_trajectories,
)


def write_ipc(table: pa.Table, path: str | Path, *, require_reward: bool = False) -> Path:
    """Validate and write a trajectory table as an Arrow IPC file."""
    validate_trajectories(table, require_reward=require_reward)
    return write_arrow_file(table, path, TRAJECTORY_SCHEMA)


def write_arrow_file(table: pa.Table, path: str | Path, schema: pa.Schema) -> Path:
    """`table` as an Arrow IPC file of `schema` at `path`, written atomically (no reader sees a
    half-written file)."""
    path = Path(path)
    with (
        atomic_path(path) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        ipc.new_file(sink, schema) as writer,
    ):
        writer.write_table(table)
    return path


def read_ipc(path: str | Path, *, require_reward: bool = False) -> pa.Table:
    """Read (memory-mapped, zero-copy) and validate an Arrow IPC trajectory file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    try:
        with pa.memory_map(str(path), "r") as source:
            table = ipc.open_file(source).read_all()
    except DAMAGED_FILE_ERRORS as err:
        raise TrajectorySchemaError(f"{path} is not an Arrow IPC file: {err}") from err
    try:
        # The footer says where each buffer is, not that its contents agree: damaged list offsets
        # would send the row checks past the end of the mapping (a SIGBUS that kills the process,
        # not an exception). A full validation checks them against the buffers first.
        table.validate(full=True)
    except DAMAGED_FILE_ERRORS as err:
        raise TrajectorySchemaError(f"{path} is damaged: {err}; write it again") from err
    try:
        validate_trajectories(table, require_reward=require_reward)
    except TrajectorySchemaError as err:
        raise TrajectorySchemaError(f"{path}: {err}") from err
    return table


def lake_path(run_dir: str | Path, iteration: int) -> Path:
    return Path(run_dir) / "lake" / f"iteration={iteration:05d}.parquet"


def write_lake(table: pa.Table, run_dir: str | Path, iteration: int) -> Path:
    """Write one iteration's rewarded trajectories into the run's Parquet lake. Refused, before
    anything is written, when a row is of another iteration: `read_lake` refuses such a partition,
    and with it the whole lake (the planner's replay, trace exports)."""
    if iteration < 0:  # `iteration=-0001.parquet` made `read_lake` refuse the whole lake
        raise ValueError(f"lake partition of iteration {iteration} not written: iterations are >= 0")
    path = lake_path(run_dir, iteration)
    validate_trajectories(table, require_reward=True)
    wrong = _other_iteration_row(table, iteration)
    if wrong is not None:
        row, found, trajectory_id = wrong
        raise TrajectorySchemaError(
            f"lake partition of iteration {iteration} ({path}) not written: row {row} (trajectory "
            f"{trajectory_id!r}) is of iteration {found}; each iteration's rows go to its own partition"
        )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def read_lake(run_dir: str | Path, iteration: int | None = None) -> pa.Table:
    """Read one iteration (or all) from the lake, validated against the schema; every row of a
    partition must be of the iteration its file name says."""
    if iteration is not None:
        paths = [lake_path(run_dir, iteration)]
    else:
        # by number: by name, iteration=100000 (six digits) came before iteration=99999
        paths = sorted(
            (Path(run_dir) / "lake").glob("iteration=*.parquet"),
            key=lambda p: (_partition_iteration(p), p.name),
        )
    if not paths:
        return TRAJECTORY_SCHEMA.empty_table()
    for p in paths:
        problems = parquet_schema_problems(p, TRAJECTORY_SCHEMA)
        if problems:
            raise TrajectorySchemaError(f"lake file {p}: " + "; ".join(problems))
    tables = []
    for p in paths:
        expected = iteration if iteration is not None else _partition_iteration(p)
        try:
            table = pq.read_table(p, schema=TRAJECTORY_SCHEMA)
        except DAMAGED_FILE_ERRORS as err:  # a footer that reads, a damaged page
            reason = " ".join(str(err).split())
            raise TrajectorySchemaError(f"lake file {p}: cannot be read ({reason})") from err
        # Each partition on its own, so that a problem names its file and the row within it.
        try:
            validate_trajectories(table, require_reward=True)
        except TrajectorySchemaError as err:
            raise TrajectorySchemaError(f"lake file {p}: {err}") from err
        _check_partition_iteration(p, table, expected)
        tables.append(table)
    _check_unique_across(paths, tables)
    return pa.concat_tables(tables)


def _partition_iteration(path: Path) -> int:
    """The iteration a lake file's name says (`iteration=00007.parquet` -> 7)."""
    number = path.name.removeprefix("iteration=").removesuffix(".parquet")
    if not number.isdigit():
        raise TrajectorySchemaError(
            f"lake file {path}: the name does not say an iteration (a partition is named like "
            "iteration=00007.parquet); move it out of the lake"
        )
    return int(number)


def _check_partition_iteration(path: Path, table: pa.Table, expected: int) -> None:
    """Every row of the partition of iteration `expected` is of that iteration: a partition copied
    or renamed from another iteration would otherwise be read as this one (by the planner's replay
    of an iteration, by trace exports) without a sign."""
    wrong_row = _other_iteration_row(table, expected)
    if wrong_row is not None:
        wrong, found, trajectory_id = wrong_row
        raise TrajectorySchemaError(
            f"lake file {path}: expected rows of iteration {expected}, found iteration "
            f"{found} in row {wrong} (trajectory {trajectory_id!r}); was the file copied or "
            "renamed from another iteration's partition? Put it back under its own iteration, or "
            "delete it"
        )


def _other_iteration_row(table: pa.Table, expected: int) -> tuple[int, int, str] | None:
    """(row, its iteration, its trajectory id) of the first row not of iteration `expected`."""
    found = table.column("iteration").to_pylist()
    row = next((i for i, it in enumerate(found) if it != expected), None)
    if row is None:
        return None
    return row, found[row], table.column("trajectory_id")[row].as_py()


def _check_unique_across(paths: list[Path], tables: list[pa.Table]) -> None:
    """The one check `validate_trajectories` makes across rows, made across partitions (each was
    checked alone): a trajectory_id, and a (group_id, sample_index), occurs once per iteration.
    Each partition holds only its own iteration, so a repeat comes from two files whose names say
    one iteration (`iteration=1.parquet` beside `iteration=00001.parquet`)."""
    first: dict[tuple[object, ...], Path] = {}  # key -> the partition that holds it
    for p, table in zip(paths, tables, strict=True):
        rows = table.select(["iteration", "trajectory_id", "group_id", "sample_index"]).to_pylist()
        keys = [
            (
                ("id", r["iteration"], r["trajectory_id"]),
                ("sample", r["iteration"], r["group_id"], r["sample_index"]),
            )
            for r in rows
        ]
        for i, (r, row_keys) in enumerate(zip(rows, keys, strict=True)):
            earlier = next((first[k] for k in row_keys if k in first), None)
            if earlier is not None:
                raise TrajectorySchemaError(
                    f"lake file {p}: trajectory {r['trajectory_id']!r} (row {i}): a second row of "
                    f"iteration {r['iteration']} with this trajectory_id or (group_id, sample_index); "
                    f"the first is in lake file {earlier}"
                )
        first.update((k, p) for row_keys in keys for k in row_keys)


def drop_partitions_after(folder: str | Path, suffix: str, iteration: int) -> int:
    """Delete the files `iteration=N<suffix>` in `folder` with N > `iteration` (what a resumed run's
    abandoned attempt wrote per iteration); returns how many."""
    dropped = 0
    for p in Path(folder).glob(f"iteration=*{suffix}"):
        number = p.name.removeprefix("iteration=").removesuffix(suffix)
        if number.isdigit() and int(number) > iteration:
            p.unlink()
            dropped += 1
    return dropped


def drop_lake_after(run_dir: str | Path, iteration: int) -> int:
    """Delete the lake partitions of iterations after `iteration` (a resumed run's abandoned
    attempt: they would be mixed into `read_lake` and trace exports); returns how many."""
    return drop_partitions_after(Path(run_dir) / "lake", ".parquet", iteration)
