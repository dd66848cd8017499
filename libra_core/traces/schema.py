"""The trace record: one Parquet row per trajectory, all a scheduler evaluation needs.

Who writes it: `export.py` (from a run's trajectory lake) and `synthetic.py`. Who reads it: the
trace evaluator (`evaluate.py`), the latency benchmark, and anyone comparing schedulers offline.

Invariants (checked by `validate_trace`):
- `turns` is non-empty; a turn is one generation and the tool return it caused. Every turn but the
  last has a non-null `tool` and `status`; the last has both null (the trajectory ended there).
- `status` is one of success | failure | timeout; token counts are >= 0; `prompt_tokens` >= 1;
  a trajectory's total (prompt, generated and payload tokens) fits an int32.
- `latency_s`, the wall time of the turn's tool call, is null on the last turn; on the others it is
  a finite number >= 0 (measured by the run, or drawn by `libra trace synth`), or null where the
  writer did not time the call (traces written before the field existed: `read_trace` reads those
  with every latency null).
- `trajectory_id` is unique within a trace.
- `policy_version`, the policy version that generated the trajectory's first token (the clock a
  live C-MLFQ ages its statistics by), is set on every row or on none (traces written before the
  field existed, and synthetic ones, read with it null: the evaluator then counts iterations), is
  >= 0, and never goes back as iterations go on (an iteration's clock is its rows' least version).
A trajectory that ended right after a tool return (e.g. it hit max_turns) carries a last turn with
`gen_tokens` 0, so that payload still counts.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq

from libra_core.data.atomic import atomic_path
from libra_core.data.schema import DAMAGED_FILE_ERRORS
from libra_core.scheduling.base import ToolStatus, Turn, total_tokens

TOOL_STATUSES = ("success", "failure", "timeout")
# Token counts are int32 in the file and in the schedulers' statistics; a trajectory's total must
# fit too (far beyond any context length).
MAX_TRAJECTORY_TOKENS = 2**31 - 1
# An untimed call that timed out is priced this many times an untimed call's default latency: it
# waited for the tool's deadline, not for an answer.
UNTIMED_TIMEOUT_FACTOR = 3.0
# A tool call recorded as taking longer than a day is a unit or logging error, not a wait to replay
# (huge values would also sum to inf in a trajectory's priced time).
MAX_TOOL_LATENCY_S = 86_400.0

TURN = pa.struct(
    [
        pa.field("gen_tokens", pa.int32(), nullable=False),  # tokens the policy generated this turn
        pa.field("tool", pa.string(), nullable=True),  # tool called at the end of the turn; null on the last
        pa.field("payload_tokens", pa.int32(), nullable=False),  # observation tokens appended; 0 on the last
        pa.field("status", pa.string(), nullable=True),  # success | failure | timeout; null on the last
        pa.field("latency_s", pa.float64(), nullable=True),  # the tool call's wall time; null: not timed
    ]
)

TRACE_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),  # RL iteration that ran it
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("turns", pa.list_(TURN), nullable=False),
        # Policy version of its first generated token (one RL iteration takes one version per
        # optimizer step); null: not recorded.
        pa.field("policy_version", pa.int32(), nullable=True),
    ]
)
# Columns a file may lack (written before they existed): read as all null.
OPTIONAL_COLUMNS = ("policy_version",)


class TraceSchemaError(ValueError):
    """A trace does not match TRACE_SCHEMA or breaks an invariant."""


@dataclass(frozen=True, slots=True)
class TraceTrajectory:
    trajectory_id: str
    prompt_id: str
    iteration: int
    prompt_tokens: int
    turns: tuple[Turn, ...]
    # Wall seconds of each turn's tool call, as the run measured them (None: not timed; always None
    # on the last turn); None for the whole trajectory when no call was timed (normalised here, so
    # an untimed trajectory has one form whoever built it).
    tool_latency_s: tuple[float | None, ...] | None = None
    policy_version: int | None = None  # version of its first generated token; None: not recorded

    def __post_init__(self) -> None:
        lat = self.tool_latency_s
        if lat is not None:
            assert len(lat) == len(self.turns), (
                f"trajectory {self.trajectory_id!r}: {len(lat)} latencies for {len(self.turns)} turns"
            )
            if all(x is None for x in lat):
                object.__setattr__(self, "tool_latency_s", None)

    def turn_latencies_s(self) -> tuple[float | None, ...]:
        """Each turn's recorded tool-call seconds, None where the call was not timed and on the last
        turn (one entry per turn, also when the trajectory has no latencies)."""
        return self.tool_latency_s or (None,) * len(self.turns)

    def priced_latencies_s(self, untimed_s: float, scale: float = 1.0) -> tuple[float, ...]:
        """Each turn's tool wait as a replay or a plan charges it: the recorded latency times
        `scale`; `untimed_s` for a call the trace did not time (`UNTIMED_TIMEOUT_FACTOR` times that
        if it timed out); 0 on the last turn. The one pricing rule, shared by the simulator's trace
        replay and the planner's trace workload, so a plan prices what a replay runs."""

        def price(u: Turn, recorded: float | None) -> float:
            if u.tool is None:
                return 0.0
            if recorded is not None:
                return recorded * scale
            return untimed_s * (UNTIMED_TIMEOUT_FACTOR if u.status == "timeout" else 1.0)

        return tuple(price(u, x) for u, x in zip(self.turns, self.turn_latencies_s(), strict=True))

    @property
    def size(self) -> int:
        """Prompt + all generated + all payload tokens."""
        return total_tokens(self.prompt_tokens, self.turns)


def trace_table(trajectories: Iterable[TraceTrajectory]) -> pa.Table:
    """Validated Arrow table from trajectories."""
    rows = [
        {
            "trajectory_id": t.trajectory_id,
            "prompt_id": t.prompt_id,
            "iteration": t.iteration,
            "prompt_tokens": t.prompt_tokens,
            "turns": [
                {
                    "gen_tokens": u.gen_tokens,
                    "tool": u.tool,
                    "payload_tokens": u.payload_tokens,
                    "status": u.status,
                    "latency_s": latency,
                }
                for u, latency in zip(t.turns, t.turn_latencies_s(), strict=True)
            ],
            "policy_version": t.policy_version,
        }
        for t in trajectories
    ]
    table = pa.Table.from_pylist(rows, schema=TRACE_SCHEMA)
    validate_trace(table)
    return table


def _check(row: dict[str, Any], i: int) -> TraceTrajectory:
    def fail(msg: str) -> TraceSchemaError:
        return TraceSchemaError(f"trace row {i} (trajectory {row['trajectory_id']!r}): {msg}")

    turns = row["turns"]
    if not turns:
        raise fail("has no turns")
    if row["prompt_tokens"] < 1:
        raise fail(f"prompt_tokens is {row['prompt_tokens']}, must be >= 1")
    if row["iteration"] < 0:  # the C-MLFQ clock starts at 0: a negative one aged as if 0
        raise fail(f"iteration is {row['iteration']}, must be >= 0")
    if row["policy_version"] is not None and row["policy_version"] < 0:  # as the iteration above
        raise fail(f"policy_version is {row['policy_version']}, must be >= 0")
    out, latencies = [], []
    for k, turn in enumerate(turns):
        if turn is None:
            raise fail(f"turn {k} is null")
        last = k == len(turns) - 1
        if turn["gen_tokens"] < 0 or turn["payload_tokens"] < 0:
            raise fail(f"turn {k} has negative token counts")
        if last and (turn["tool"] is not None or turn["status"] is not None or turn["payload_tokens"]):
            raise fail(
                "the last turn must have null tool and status and 0 payload_tokens (the trajectory "
                f"ended there), got tool {turn['tool']!r}, payload_tokens {turn['payload_tokens']}"
            )
        if not last and (turn["tool"] is None or turn["status"] not in TOOL_STATUSES):
            raise fail(f"turn {k} needs a tool and a status in {TOOL_STATUSES}, got {turn['status']!r}")
        if not last and not turn["tool"].strip():
            # Consumers told "no tool" by truthiness or by None: an empty name was a call to some
            # and none to others (until 2026-12-07).
            raise fail(f"turn {k} calls a tool with an empty name {turn['tool']!r}")
        if not last and turn["gen_tokens"] == 0:
            # A call is generated text. A 0-token call turn also made the evaluator and the
            # simulator's replay ask the scheduler at different returns (until 2026-12-07).
            raise fail(
                f"turn {k} calls tool {turn['tool']!r} but generated 0 tokens; a call is generated text"
            )
        latency = turn.get("latency_s")
        if latency is not None and (
            last or not (math.isfinite(latency) and 0.0 <= latency <= MAX_TOOL_LATENCY_S)
        ):
            raise fail(
                "the last turn's latency_s must be null (it calls no tool)"
                if last
                else f"turn {k} has latency_s {latency}; a tool call's wall time is a number of seconds "
                f"in [0, {MAX_TOOL_LATENCY_S:.0f}] (a day)"
            )
        latencies.append(latency)
        status = cast("ToolStatus | None", turn["status"])
        out.append(Turn(turn["gen_tokens"], turn["tool"], turn["payload_tokens"], status))
    traj = TraceTrajectory(
        row["trajectory_id"],
        row["prompt_id"],
        row["iteration"],
        row["prompt_tokens"],
        tuple(out),
        tuple(latencies),
        row["policy_version"],
    )
    if traj.size > MAX_TRAJECTORY_TOKENS:
        raise fail(f"holds {traj.size:,} tokens; a trajectory holds at most {MAX_TRAJECTORY_TOKENS:,}")
    return traj


def validate_trace(table: pa.Table) -> list[TraceTrajectory]:
    """Check schema and invariants; return the rows as TraceTrajectory (raises TraceSchemaError)."""
    if not table.schema.equals(TRACE_SCHEMA, check_metadata=False):
        raise TraceSchemaError(f"trace schema mismatch:\n got {table.schema}\n expected {TRACE_SCHEMA}")
    for f in TRACE_SCHEMA:
        # Arrow does not enforce a top-level field's `nullable=False` (a file written with nullable
        # columns, as pandas writes them, casts through): until 2026-12-07 a null iteration or
        # prompt_tokens failed with a TypeError, a null id was accepted.
        column = table.column(f.name)
        if not f.nullable and column.null_count:
            first = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
            raise TraceSchemaError(
                f"column {f.name!r} is null at row {first}; it must hold a value in every row"
            )
    out = [_check(row, i) for i, row in enumerate(table.to_pylist())]
    dup = [i for i, n in Counter(t.trajectory_id for t in out).items() if n > 1]
    if dup:
        raise TraceSchemaError(f"trajectory_id {dup[0]!r} appears more than once")
    policy_clock(out)  # its checks
    return out


def policy_clock(trajectories: Sequence[TraceTrajectory]) -> dict[int, int]:
    """The C-MLFQ clock of each iteration: its rows' least `policy_version`, or the iteration
    itself when the trace records no versions. Raises TraceSchemaError when some rows record one and
    others do not, or when the clock goes back from one iteration to the next."""
    recorded = [t.policy_version is not None for t in trajectories]
    if not any(recorded):
        return {t.iteration: t.iteration for t in trajectories}
    if not all(recorded):
        missing = next(t for t in trajectories if t.policy_version is None)
        raise TraceSchemaError(
            f"policy_version is null on trajectory {missing.trajectory_id!r} and set on others; a trace "
            "records it on every row or on none"
        )
    clock: dict[int, int] = {}
    for t in trajectories:
        assert t.policy_version is not None  # every row records one (checked above)
        clock[t.iteration] = min(clock.get(t.iteration, t.policy_version), t.policy_version)
    iterations = sorted(clock)
    for before, after in zip(iterations, iterations[1:], strict=False):
        if clock[after] < clock[before]:
            raise TraceSchemaError(
                f"policy_version goes back from iteration {before} (version {clock[before]}) to "
                f"iteration {after} (version {clock[after]}); versions grow as iterations go on"
            )
    return clock


def write_trace(table: pa.Table, path: str | Path) -> Path:
    """Validate and write a trace as Parquet (atomic: temp file + rename)."""
    validate_trace(table)
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def read_trace(path: str | Path) -> list[TraceTrajectory]:
    """Read and validate a Parquet trace."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"trace file {path} is a folder, not a file; pass the trace's .parquet")
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} does not exist; export one with `libra trace export`")
    try:
        table = pq.read_table(path)
    except FileNotFoundError:  # removed since the check above: not a damaged trace
        raise
    except DAMAGED_FILE_ERRORS as err:  # not Parquet; or a footer that reads, a damaged page
        reason = " ".join(str(err).split())
        raise TraceSchemaError(f"{path} cannot be read as a Parquet trace ({reason})") from err
    for name in OPTIONAL_COLUMNS:  # an older trace: the column reads as null
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, TRACE_SCHEMA.field(name).type))
    missing = [n for n in TRACE_SCHEMA.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in TRACE_SCHEMA.names]
    if missing or extra:
        raise TraceSchemaError(
            f"{path} is not a Libra trace: missing columns {missing}, unexpected columns {extra}; "
            f"a trace has exactly {TRACE_SCHEMA.names} (`libra trace export` writes one)"
        )
    problems = [
        problem
        for f in TRACE_SCHEMA
        if (problem := _type_problem(f.name, table.schema.field(f.name).type, f.type)) is not None
    ]
    if problems:
        raise TraceSchemaError(
            f"{path}: {'; '.join(problems)}; a trace's types are those of TRACE_SCHEMA "
            "(docs/scheduling.md, `libra trace export` writes one)"
        )
    # Only casts `_type_problem` lets through: a narrower or wider integer or float (Arrow refuses a
    # value out of range), a large string or list, and the turns of a trace written before
    # `latency_s` existed (every latency null). Column by column, so an error names its column.
    columns = []
    for f in TRACE_SCHEMA:
        try:
            columns.append(table.column(f.name).cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as err:
            raise TraceSchemaError(
                f"{path}: column {f.name!r} does not fit the trace schema's {f.type}: {err}"
            ) from err
    table = pa.Table.from_arrays(columns, schema=TRACE_SCHEMA)
    try:
        return validate_trace(table)
    except TraceSchemaError as err:
        raise TraceSchemaError(f"{path}: {err}") from err


def _type_problem(column: str, got: pa.DataType, want: pa.DataType) -> str | None:
    """Why a file's column of type `got` is not read as `want` (None if it is). A cast would read
    the text "12" as the number 12, and floats as token counts whenever they happen to be whole: a
    column of another kind (text, float or bool for an integer; a number for a text) is an error.
    Integers and floats of another width cast (Arrow refuses a value out of range)."""
    if got.equals(want) or pa.types.is_null(got):  # all null: the null checks decide
        return None
    if pa.types.is_dictionary(got):  # e.g. a categorical column written by pandas
        return _type_problem(column, got.value_type, want)
    same_kind = [
        pa.types.is_integer,
        pa.types.is_floating,
        lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    ]
    if any(kind(got) and kind(want) for kind in same_kind):
        return None
    if (pa.types.is_list(got) or pa.types.is_large_list(got)) and pa.types.is_list(want):
        return _type_problem(f"{column}[]", got.value_type, want.value_type)
    if pa.types.is_struct(got) and pa.types.is_struct(want):
        have = {got.field(k).name: got.field(k) for k in range(got.num_fields)}
        wanted = {want.field(k).name: want.field(k) for k in range(want.num_fields)}
        problems = [f"column {column!r} has an unexpected field {n!r}" for n in have if n not in wanted]
        for name, f in wanted.items():
            if name in have:
                problems.append(_type_problem(f"{column}.{name}", have[name].type, f.type) or "")
            elif not f.nullable:  # a missing nullable field reads as nulls (older traces)
                problems.append(f"column {column!r} has no field {name!r}")
        return "; ".join(p for p in problems if p) or None
    return f"column {column!r} has the wrong type: {got}, expected {want}"


def as_trajectories(trace: pa.Table | Sequence[TraceTrajectory]) -> list[TraceTrajectory]:
    return validate_trace(trace) if isinstance(trace, pa.Table) else list(trace)
