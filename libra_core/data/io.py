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
    TRAJECTORY_SCHEMA,
    TrajectorySchemaError,
    parquet_schema_problems,
    validate_trajectories,
)


def write_ipc(table: pa.Table, path: str | Path, *, require_reward: bool = False) -> Path:
    """Validate and write a trajectory table as an Arrow IPC file."""
    path = Path(path)
    validate_trajectories(table, require_reward=require_reward)
    with (
        atomic_path(path) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        ipc.new_file(sink, TRAJECTORY_SCHEMA) as w,
    ):
        w.write_table(table)
    return path


def read_ipc(path: str | Path, *, require_reward: bool = False) -> pa.Table:
    """Read (memory-mapped, zero-copy) and validate an Arrow IPC trajectory file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    try:
        with pa.memory_map(str(path), "r") as source:
            table = ipc.open_file(source).read_all()
    except pa.ArrowInvalid as err:
        raise TrajectorySchemaError(f"{path} is not an Arrow IPC file: {err}") from err
    validate_trajectories(table, require_reward=require_reward)
    return table


def lake_path(run_dir: str | Path, iteration: int) -> Path:
    return Path(run_dir) / "lake" / f"iteration={iteration:05d}.parquet"


def write_lake(table: pa.Table, run_dir: str | Path, iteration: int) -> Path:
    """Write one iteration's rewarded trajectories into the run's Parquet lake."""
    path = lake_path(run_dir, iteration)
    validate_trajectories(table, require_reward=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def read_lake(run_dir: str | Path, iteration: int | None = None) -> pa.Table:
    """Read one iteration (or all) from the lake, validated against the schema."""
    if iteration is not None:
        paths = [lake_path(run_dir, iteration)]
    else:
        paths = sorted((Path(run_dir) / "lake").glob("iteration=*.parquet"))
    if not paths:
        return TRAJECTORY_SCHEMA.empty_table()
    for p in paths:
        problems = parquet_schema_problems(p, TRAJECTORY_SCHEMA)
        if problems:
            raise TrajectorySchemaError(f"lake file {p}: " + "; ".join(problems))
    tables = []
    for p in paths:
        try:
            tables.append(pq.read_table(p, schema=TRAJECTORY_SCHEMA))
        except (pa.ArrowException, OSError) as err:  # a footer that reads, a damaged page
            reason = " ".join(str(err).split())
            raise TrajectorySchemaError(f"lake file {p}: cannot be read ({reason})") from err
    table = pa.concat_tables(tables)
    validate_trajectories(table, require_reward=True)
    return table


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
