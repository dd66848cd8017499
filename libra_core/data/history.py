"""Per-iteration history of a run: stage timings, token counts, rewards (`history.parquet`).

Written by the experiment flow after each iteration (one row per iteration, rewritten atomically
so readers never see a partial file); read by the CLI summary, reports and the planner's
calibration later. Columns are fixed by HISTORY_SCHEMA; stage timings are `<stage>_s`.

A column added after runs were recorded is nullable (null: not recorded), or has a backfill value
in HISTORY_BACKFILL that keeps an older file's rows meaning what they meant: readers never see a
file of another version fail for a column it could not have written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from libra_core.data.atomic import atomic_path
from libra_core.data.schema import DAMAGED_FILE_ERRORS, parquet_schema_problems

# pool: starting, resizing or waking the rollout engines for the iteration's plan (part of plan_s
# in files written before 2026-12-07)
STAGES = ("plan", "pool", "rollout", "reward", "update", "sync")

HISTORY_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int32(), nullable=False),
    ]
    + [pa.field(f"{s}_s", pa.float64(), nullable=False) for s in STAGES]
    + [
        pa.field("iteration_s", pa.float64(), nullable=False),  # wall time of the whole iteration
        pa.field("eval_s", pa.float64(), nullable=True),  # greedy evaluation, when it ran
        pa.field("tokens_generated", pa.int64(), nullable=False),  # policy tokens sampled
        pa.field("tokens_trained", pa.int64(), nullable=False),  # loss-mask tokens in the update
        pa.field("num_trajectories", pa.int32(), nullable=False),
        pa.field("reward_mean", pa.float64(), nullable=False),
        pa.field("accuracy", pa.float64(), nullable=False),  # share of exactly correct answers
        pa.field("mixed_group_share", pa.float64(), nullable=False),  # groups with reward variance
        pa.field("mean_response_tokens", pa.float64(), nullable=False),
        pa.field("tool_failure_share", pa.float64(), nullable=False),
        pa.field("loss", pa.float64(), nullable=False),
        pa.field("clip_fraction", pa.float64(), nullable=False),
        pa.field("grad_norm", pa.float64(), nullable=False),
        pa.field("eval_accuracy", pa.float64(), nullable=True),
        pa.field("rollout_tokens_per_s", pa.float64(), nullable=False),
        pa.field("routing_moves", pa.int32(), nullable=False),  # bucket changes the scheduler asked for
        pa.field("routing_migrations", pa.int32(), nullable=False),  # moves that changed instance
        pa.field("migrated_tokens", pa.int64(), nullable=False),  # context re-prefilled by migrations
        # generated tokens decoded in the bucket of their trajectory's size (null: nothing routed)
        pa.field("routing_class_accuracy", pa.float64(), nullable=True),
        # migrated_tokens / all tokens of the finished trajectories (null: none finished, or a file
        # written before 2026-12-06)
        pa.field("migration_token_ratio", pa.float64(), nullable=True),
        # what the update trained on vs everything generated (staleness bound, dynamic sampling)
        pa.field("optimizer_steps", pa.int32(), nullable=False),
        pa.field("stale_dropped", pa.int32(), nullable=False),  # trajectories past max_staleness
        pa.field("stale_recomputed", pa.int32(), nullable=False),
        pa.field("groups_filtered", pa.int32(), nullable=False),  # equal-reward groups dropped
        pa.field("max_staleness_seen", pa.int32(), nullable=False),  # optimizer steps, trained data
        pa.field("behavior_weight_mean", pa.float64(), nullable=False),  # decoupled PPO weight
        pa.field("train_reward_mean", pa.float64(), nullable=False),
        pa.field("train_response_tokens_mean", pa.float64(), nullable=False),
        pa.field("response_tokens_p90", pa.float64(), nullable=False),  # all generated
        pa.field("train_response_tokens_p90", pa.float64(), nullable=False),
        pa.field("rollout_instances", pa.int32(), nullable=False),  # pool the rollout ran on
        pa.field("predicted_iteration_s", pa.float64(), nullable=True),  # planner's T_iter (libra)
    ]
)


# Columns added after runs existed -> the value rows of a file without them take.
HISTORY_BACKFILL: dict[str, Any] = {"pool_s": 0.0}  # those rows' plan_s includes the pool's time
_READ_SCHEMA = pa.schema([f.with_nullable(True) if f.name in HISTORY_BACKFILL else f for f in HISTORY_SCHEMA])


def history_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "history.parquet"


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    path = history_path(run_dir)
    if not path.exists():
        return []
    problems = parquet_schema_problems(path, _READ_SCHEMA)
    if not problems:
        try:
            names = set(pq.read_schema(path).names)
            table = pq.read_table(path, schema=_READ_SCHEMA)
        except DAMAGED_FILE_ERRORS as err:  # a footer that reads, a damaged page
            problems = [f"cannot be read ({' '.join(str(err).split())})"]
        else:
            absent = {c: v for c, v in HISTORY_BACKFILL.items() if c not in names}
            # a file that declares its columns nullable (another writer, a hand repair) reads
            # with nulls where this schema has none, and every reader would trip over them
            problems = [
                f"column {f.name!r} holds null values ({table.column(f.name).null_count}), expected none"
                for f in HISTORY_SCHEMA
                if not f.nullable and f.name not in absent and table.column(f.name).null_count
            ]
            if not problems:
                return [row | absent for row in table.to_pylist()]
    raise ValueError(
        f"run history {path}: {'; '.join(problems)}. Restore it, or delete it to record only the "
        "iterations from now on"
    )


def append_history(run_dir: str | Path, row: dict[str, Any]) -> Path:
    """Add (or replace, on resume) the row of `row["iteration"]` and rewrite the file atomically."""
    missing = set(HISTORY_SCHEMA.names) - row.keys()
    extra = row.keys() - set(HISTORY_SCHEMA.names)
    if missing or extra:
        raise ValueError(f"history row: missing {sorted(missing)}, unknown {sorted(extra)}")
    refuse_unknown_history_columns(run_dir)
    rows = [r for r in read_history(run_dir) if r["iteration"] != row["iteration"]] + [row]
    rows.sort(key=lambda r: r["iteration"])
    path = history_path(run_dir)
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), tmp)
    return path


def refuse_unknown_history_columns(run_dir: str | Path) -> None:
    """Before a rewrite: a history with columns this schema lacks (written by another version of
    Libra) would lose them for every row. Readers take such a file; writers refuse it."""
    path = history_path(run_dir)
    if not path.exists():
        return
    try:
        names = pq.read_schema(path).names
    except DAMAGED_FILE_ERRORS:
        return  # read_history names what is wrong with the file
    extra = [n for n in names if n not in HISTORY_SCHEMA.names]
    if extra:
        raise ValueError(
            f"run history {path} has columns this version of Libra does not record ({extra}); "
            "rewriting it would drop them from every row. Continue the run with the version that "
            "wrote them, or copy the file aside first"
        )


def drop_history_after(run_dir: str | Path, iteration: int) -> int:
    """Remove the rows of iterations after `iteration` (what a resumed run's abandoned attempt
    recorded); returns how many were removed. The file is rewritten atomically, or left alone."""
    rows = read_history(run_dir)
    kept = [r for r in rows if r["iteration"] <= iteration]
    if len(kept) < len(rows):
        refuse_unknown_history_columns(run_dir)
        with atomic_path(history_path(run_dir)) as tmp:
            pq.write_table(pa.Table.from_pylist(kept, schema=HISTORY_SCHEMA), tmp)
    return len(rows) - len(kept)
