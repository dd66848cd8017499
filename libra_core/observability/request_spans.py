"""Request spans: when each generation request of a rollout ran, and on which rollout instance.

Written by the rollout stage (`pipeline/rollout_stage.run_rollout`), once per iteration, next to
the iteration's trajectories (`RunLayout.rollout_requests`: `stages/iteration=N/requests.arrow`);
read by the iteration flow, which turns them into the timeline's busy spans of each instance
(`timeline.instance_spans`). A file, not a field of the stage's result: with one entry per request
(tens of thousands in a large rollout), the result would be stored by Prefect as a flow-run
parameter of the next iteration in the async pipeline, every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from libra_core.data.io import write_arrow_file
from libra_core.data.schema import DAMAGED_FILE_ERRORS

# One row per generation request the agent loop sent, in the order they finished (AgentLoop's
# `requests_served`). Times are Unix seconds: `time.time()` when the request was sent, plus the
# monotonic clock's duration until its answer came back (so a wall-clock step cannot end a span
# before it starts); no other invariant is imposed (the timeline checks its spans).
REQUEST_SPAN_SCHEMA = pa.schema(
    [
        pa.field("instance_id", pa.string(), nullable=False),  # the rollout pool's instance id
        pa.field("start_s", pa.float64(), nullable=False),
        pa.field("end_s", pa.float64(), nullable=False),
    ]
)

RequestSpan = tuple[str, float, float]  # (instance id, start, end), Unix seconds


def write_request_spans(path: str | Path, served: Sequence[RequestSpan]) -> Path:
    """Write `served` to `path` as an Arrow IPC file, atomically (a retried rollout replaces it)."""
    table = pa.table(
        [
            pa.array([instance for instance, _, _ in served], pa.string()),
            pa.array([start for _, start, _ in served], pa.float64()),
            pa.array([end for _, _, end in served], pa.float64()),
        ],
        schema=REQUEST_SPAN_SCHEMA,
    )
    return write_arrow_file(table, path, REQUEST_SPAN_SCHEMA)


def read_request_spans(path: str | Path | None) -> list[RequestSpan]:
    """The spans `write_request_spans` wrote, in its order. None, or no file at `path` (a run
    folder written before rollouts recorded them): no spans. A file that is not one, or a row with
    a null, a non-finite time or an end before its start, raises ValueError naming it."""
    if path is None or not Path(path).exists():
        return []
    try:
        with pa.OSFile(str(path), "rb") as source:
            table = ipc.open_file(source).read_all()
        table.validate(full=True)
    except DAMAGED_FILE_ERRORS as err:  # damaged, a folder of that name, no permission
        raise ValueError(f"{path}: not a request-spans Arrow IPC file ({err})") from err
    if not table.schema.equals(REQUEST_SPAN_SCHEMA):
        fields = ", ".join(f"{f.name}: {f.type}" for f in table.schema)
        expected = ", ".join(f"{f.name}: {f.type}" for f in REQUEST_SPAN_SCHEMA)
        raise ValueError(f"{path}: not a request-spans file (columns {fields}; expected {expected})")
    columns = [table.column(name).to_pylist() for name in REQUEST_SPAN_SCHEMA.names]
    spans = list(zip(*columns, strict=True))
    for row, (instance, start, end) in enumerate(spans):
        # Arrow keeps nulls a writer's schema forbids; NaN and inverted spans come from no clock
        if instance is None or start is None or end is None:
            raise ValueError(f"{path}: row {row} has a null ({instance!r}, {start!r}, {end!r})")
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise ValueError(
                f"{path}: row {row} ({instance!r}) is no span: start {start!r}, end {end!r} "
                "(finite, end at or after start)"
            )
    return spans
