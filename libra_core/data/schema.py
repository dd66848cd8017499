"""The trajectory record: the one Arrow schema exchanged by rollout -> reward -> update.

Who writes it: the rollout stage (one row per sampled trajectory, `reward` null); the reward stage
fills `reward`. Who reads it: reward, update, the trajectory lake, schedulers
and the simulator. Every boundary calls `validate_trajectories`, so a malformed batch fails where
it enters, with the row and field named.

Invariants (checked by `validate_trajectories`):
- `behavior_logprobs` and `loss_mask` have the length of `response_ids`.
- `loss_mask[i]` is 1 for tokens the policy generated, 0 for tool/observation tokens; tool tokens
  carry behaviour log-prob 0.0.
- `version_spans` are sorted, non-overlapping, inside `[0, len(response_ids))` and cover every
  policy token; `min_version`/`max_version` are the extremes over the spans.
- tool event `status` is one of success/failure/timeout; counts are >= 0; latencies and rewards are
  finite (latencies >= 0); no field marked non-nullable, and no list item, is null.
- `group_id` is shared by the `group_size` samples of one prompt; `sample_index` is 0..G-1 (>= 0 is
  checked, and that no two rows of an iteration share a trajectory id or a (group, sample) pair:
  a batch may hold part of a group, e.g. after dynamic sampling).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TOOL_STATUSES = ("success", "failure", "timeout")
FINISH_REASONS = ("answer", "max_turns", "max_tokens", "error")

VERSION_SPAN = pa.struct(
    [
        pa.field("start", pa.int32(), nullable=False),  # first response-token index of the span
        pa.field("end", pa.int32(), nullable=False),  # one past the last index
        pa.field("version", pa.int32(), nullable=False),  # policy version that generated it
    ]
)

TOOL_EVENT = pa.struct(
    [
        pa.field("turn", pa.int32(), nullable=False),  # model turn that issued the call (0-based)
        pa.field("tool", pa.string(), nullable=False),  # tool name, e.g. "calculator"
        pa.field("call_tokens", pa.int32(), nullable=False),  # tokens of the call the model wrote
        pa.field("payload_tokens", pa.int32(), nullable=False),  # tokens of the observation appended
        pa.field("status", pa.string(), nullable=False),  # success | failure | timeout
        pa.field("latency_s", pa.float64(), nullable=False),  # wall time the tool took
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("version_spans", pa.list_(VERSION_SPAN), nullable=False),
        pa.field("min_version", pa.int32(), nullable=False),
        pa.field("max_version", pa.int32(), nullable=False),
        pa.field("tool_events", pa.list_(TOOL_EVENT), nullable=False),
        pa.field("num_turns", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("final_answer", pa.string(), nullable=True),  # parsed answer text, null if none
        pa.field("reference_answer", pa.string(), nullable=False),  # ground truth from the environment
        pa.field("reward", pa.float32(), nullable=True),  # null until the reward stage
        pa.field("instance_id", pa.string(), nullable=False),  # rollout instance that served it
        pa.field("rollout_latency_s", pa.float64(), nullable=False),  # admission to finish
        pa.field("generation_latency_s", pa.float64(), nullable=False),  # time waiting on the engine
        pa.field("tool_latency_s", pa.float64(), nullable=False),  # time inside tools
    ]
)


class TrajectorySchemaError(ValueError):
    """A trajectory batch does not match TRAJECTORY_SCHEMA or breaks an invariant."""


def empty_table() -> pa.Table:
    return TRAJECTORY_SCHEMA.empty_table()


def table_from_rows(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Build a validated table from row dicts keyed by the schema's field names."""
    rows = list(rows)
    names = set(TRAJECTORY_SCHEMA.names)
    for i, row in enumerate(rows):
        missing, extra = names - row.keys(), row.keys() - names
        if missing or extra:
            raise TrajectorySchemaError(
                f"row {i}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}"
            )
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    validate_trajectories(table)
    return table


# What pyarrow raises on a damaged file: its own errors, an OSError from its I/O layer ("File too
# short"), or a UnicodeDecodeError (a ValueError) from a damaged footer's strings. Readers catch
# all three and name the file; until 2026-12-07 the last two escaped naming nothing.
DAMAGED_FILE_ERRORS = (pa.ArrowException, OSError, ValueError)


def parquet_schema_problems(path: Path, schema: pa.Schema) -> list[str]:
    """Why the Parquet file at `path` cannot be read as `schema`, before reading it with
    `schema=`: that read fills a missing column with nulls, so a file of another table would
    pass as rows of nulls. A missing nullable column is fine (files written before the column
    existed); a missing non-nullable one, or a column of another type, is a problem."""
    try:
        have = pq.read_schema(path)
    except DAMAGED_FILE_ERRORS as err:
        return [f"not a Parquet file ({' '.join(str(err).split())})"]
    got = {f.name: f for f in have}
    missing = [f.name for f in schema if f.name not in got and not f.nullable]
    problems = [f"missing columns {', '.join(missing)} (is it this kind of file?)"] if missing else []
    problems += [
        f"column {f.name!r} has type {got[f.name].type}, expected {f.type}"
        for f in schema
        if f.name in got and not got[f.name].type.equals(f.type)
    ]
    return problems


def validate_trajectories(table: pa.Table, *, require_reward: bool = False) -> None:
    """Raise TrajectorySchemaError naming the first problem; return None if the batch is sound."""
    if not table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False):
        want = {f.name: f for f in TRAJECTORY_SCHEMA}
        got = {f.name: f for f in table.schema}
        problems = [f"missing field {n!r}" for n in want if n not in got]
        problems += [f"unknown field {n!r}" for n in got if n not in want]
        problems += [
            f"field {n!r} has type {got[n].type}, expected {want[n].type}"
            for n in want
            if n in got and not got[n].type.equals(want[n].type)
        ]
        problems += [
            f"field {n!r} nullable={got[n].nullable}, expected {want[n].nullable}"
            for n in want
            if n in got and got[n].nullable != want[n].nullable
        ]
        raise TrajectorySchemaError("trajectory schema mismatch: " + "; ".join(problems or ["field order"]))
    # Arrow does not enforce `nullable=False` when a table is built, and list items are nullable
    # in the type: nulls are found here, before a row check trips over one.
    for f in TRAJECTORY_SCHEMA:
        problem = _null_problem(f.name, table.column(f.name), f.nullable)
        if problem:
            raise TrajectorySchemaError(problem)
    seen_ids: set[tuple[int, str]] = set()
    seen_samples: set[tuple[int, str, int]] = set()
    for i, row in enumerate(table.to_pylist()):
        _check_row(i, row, require_reward)
        key = (row["iteration"], row["trajectory_id"])
        sample = (row["iteration"], row["group_id"], row["sample_index"])
        if key in seen_ids or sample in seen_samples:
            raise TrajectorySchemaError(
                f"trajectory {row['trajectory_id']!r} (row {i}): a second row of iteration "
                f"{row['iteration']} with this trajectory_id or (group_id, sample_index)"
            )
        seen_ids.add(key)
        seen_samples.add(sample)


def _null_problem(name: str, column: pa.ChunkedArray | pa.Array, nullable: bool) -> str | None:
    """Where a non-nullable field, a list item or a struct child holds a null (None if nowhere)."""
    if not nullable and column.null_count:
        rows = pc.indices_nonzero(pc.is_null(column)).to_pylist()  # type: ignore[attr-defined]
        where = f"row {rows[0]}" if name in TRAJECTORY_SCHEMA.names else "an item"
        return f"field {name!r} is null in {where}; it must hold a value"
    kind = column.type
    if pa.types.is_list(kind):
        return _null_problem(f"{name}[]", pc.list_flatten(column), nullable=False)
    if pa.types.is_struct(kind):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for k in range(kind.num_fields):
            child = kind.field(k)
            values = pa.chunked_array([c.field(k) for c in chunks], type=child.type)
            problem = _null_problem(f"{name}.{child.name}", values, child.nullable)
            if problem:
                return problem
    return None


def _check_row(i: int, row: dict[str, Any], require_reward: bool) -> None:
    def fail(msg: str) -> None:
        raise TrajectorySchemaError(f"trajectory {row['trajectory_id']!r} (row {i}): {msg}")

    n = len(row["response_ids"])
    if len(row["behavior_logprobs"]) != n or len(row["loss_mask"]) != n:
        fail(
            f"behavior_logprobs ({len(row['behavior_logprobs'])}) and loss_mask ({len(row['loss_mask'])}) "
            f"must have the length of response_ids ({n})"
        )
    if not row["prompt_ids"]:
        fail("prompt_ids is empty")
    # Each refused where the row enters (until 2026-12-07 a negative iteration wrote a lake file
    # `iteration=-0001` that made the whole lake unreadable, and a negative token id failed only in
    # the update's embedding lookup)
    if row["iteration"] < 0:
        fail(f"iteration {row['iteration']} is negative")
    if min(row["prompt_ids"]) < 0 or (n and min(row["response_ids"]) < 0):
        fail("prompt_ids and response_ids must be token ids >= 0")
    mask = row["loss_mask"]
    if any(m not in (0, 1) for m in mask):
        fail("loss_mask values must be 0 or 1")
    if any(m == 0 and lp != 0.0 for m, lp in zip(mask, row["behavior_logprobs"], strict=True)):
        fail("tool/observation tokens (loss_mask 0) must carry behavior log-prob 0.0")
    if not all(math.isfinite(lp) and lp <= 1e-4 for lp in row["behavior_logprobs"]):
        fail("behavior log-probs must be finite and <= 0")
    covered = [False] * n
    prev_end = 0
    versions = []
    for span in row["version_spans"]:
        s, e = span["start"], span["end"]
        if not (prev_end <= s < e <= n):
            fail(f"version span [{s}, {e}) is unsorted, overlapping, empty or outside [0, {n})")
        prev_end = e
        if span["version"] < 0:
            fail(f"version span [{s}, {e}) has a negative version {span['version']}")
        versions.append(span["version"])
        for k in range(s, e):
            covered[k] = True
    if any(m == 1 and not c for m, c in zip(mask, covered, strict=True)):
        fail("a policy token (loss_mask 1) is not covered by any version span")
    if versions and (min(versions) != row["min_version"] or max(versions) != row["max_version"]):
        fail(f"min/max_version ({row['min_version']}, {row['max_version']}) disagree with spans {versions}")
    if row["min_version"] > row["max_version"]:
        fail(f"min_version {row['min_version']} is above max_version {row['max_version']}")
    for ev in row["tool_events"]:
        if ev["status"] not in TOOL_STATUSES:
            fail(f"tool event status {ev['status']!r} is not one of {TOOL_STATUSES}")
        if min(ev["turn"], ev["call_tokens"], ev["payload_tokens"]) < 0 or not _seconds(ev["latency_s"]):
            fail("tool event turn, call_tokens, payload_tokens and latency_s must be >= 0 (finite)")
    if row["finish_reason"] not in FINISH_REASONS:
        fail(f"finish_reason {row['finish_reason']!r} is not one of {FINISH_REASONS}")
    if row["sample_index"] < 0 or row["num_turns"] < 0:
        fail("sample_index and num_turns must be >= 0")
    for ev in row["tool_events"]:
        if ev["turn"] >= row["num_turns"]:
            fail(f"tool event at turn {ev['turn']} of a trajectory of {row['num_turns']} turns")
    latencies = ("rollout_latency_s", "generation_latency_s", "tool_latency_s")
    if not all(_seconds(row[name]) for name in latencies):
        fail(f"{', '.join(latencies)} must be finite and >= 0")
    if row["reward"] is not None and not math.isfinite(row["reward"]):
        fail(f"reward {row['reward']} is not a finite number")
    if require_reward and row["reward"] is None:
        fail("reward is null; run the reward stage before the update")


def _seconds(value: float) -> bool:
    return math.isfinite(value) and value >= 0
