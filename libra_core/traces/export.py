"""Trace export: a run's Parquet trajectory lake -> a scheduling trace (schema.py).

Per lake row (libra_core/data/schema.py TRAJECTORY_SCHEMA): `prompt_tokens` is `len(prompt_ids)`;
turn k's `gen_tokens` is the length of the k-th run of `loss_mask == 1` in `response_ids`; its tool
return is the tool event with `turn == k` (tool, payload_tokens, status, and the call's measured
`latency_s`, which the simulator replays). A trajectory whose response
ends with a tool payload (it hit max_turns) gets a final turn with 0 generated tokens.
Called by `libra trace export RUN_DIR -o trace.parquet`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from libra_core.config.loader import RESOLVED_CONFIG_NAME
from libra_core.data.io import read_lake
from libra_core.scheduling.base import ToolStatus, Turn
from libra_core.traces.schema import TraceSchemaError, TraceTrajectory, trace_table, write_trace

log = logging.getLogger(__name__)


def generation_runs(loss_mask: Sequence[int]) -> list[int]:
    """Lengths of the maximal runs of 1 in `loss_mask`, in order."""
    runs: list[int] = []
    prev = 0
    for m in loss_mask:
        if m == 1:
            if prev == 1:
                runs[-1] += 1
            else:
                runs.append(1)
        prev = m
    return runs


def _ended_on_a_tool_return(row: dict[str, Any], events: list[dict[str, Any]]) -> bool:
    """Whether a row with as many generation runs as tool events surely ended on its last tool
    return (no zero-token payload merged two runs).

    With no zero-token payload, nothing merged. A run that ended at `max_turns` ended on a tool
    return by construction (the agent loop stops only after one), so its counts say nothing merged.
    A `max_tokens` row whose only zero-token payload is the last one is the agent loop's cut
    observation: the call used the last of the budget, so no generation followed it (an observation
    is never empty otherwise: every shipped environment wraps the result in markers)."""
    zero = [k for k, e in enumerate(events) if e["payload_tokens"] == 0]
    if not zero or row["finish_reason"] == "max_turns":
        return True
    return row["finish_reason"] == "max_tokens" and zero == [len(events) - 1]


def _turns(row: dict[str, Any]) -> tuple[tuple[Turn, ...], tuple[float | None, ...]]:
    """The row's turns and each turn's tool latency (None on the last turn)."""
    runs = generation_runs(row["loss_mask"])
    events = sorted(row["tool_events"], key=lambda e: e["turn"])
    if [e["turn"] for e in events] != list(range(len(events))) or len(runs) not in (
        len(events),
        len(events) + 1,
    ):
        raise TraceSchemaError(
            f"trajectory {row['trajectory_id']!r}: {len(runs)} generation runs do not line up with tool "
            f"events on turns {[e['turn'] for e in events]} (a zero-token tool payload merges two turns); "
            "such rows cannot be split into turns"
        )
    if len(runs) == len(events) and not _ended_on_a_tool_return(row, events):
        # As many runs as events reads as "ended on a tool return", but a zero-token payload that
        # merged two runs, then an answer, reads the same: the turns' tokens would be shifted.
        raise TraceSchemaError(
            f"trajectory {row['trajectory_id']!r}: a zero-token tool payload may have merged two "
            f"generation runs ({len(runs)} runs, {len(events)} tool events); such rows cannot be split "
            "into turns"
        )
    turns = [
        Turn(runs[k], e["tool"], e["payload_tokens"], cast(ToolStatus, e["status"]))
        for k, e in enumerate(events)
    ]
    last_gen = runs[-1] if len(runs) == len(events) + 1 else 0
    turns.append(Turn(last_gen, None, 0, None))
    return tuple(turns), (*(float(e["latency_s"]) for e in events), None)


def lake_to_trace(lake: pa.Table) -> pa.Table:
    """Trace table (TRACE_SCHEMA) from a trajectory-lake table, sorted by iteration then id."""
    columns = [
        "trajectory_id",
        "prompt_id",
        "iteration",
        "prompt_ids",
        "loss_mask",
        "tool_events",
        "finish_reason",
        "min_version",
    ]
    rows = lake.select(columns).to_pylist()
    trajectories = []
    for row in rows:
        turns, latencies = _turns(row)
        trajectories.append(
            TraceTrajectory(
                trajectory_id=row["trajectory_id"],
                prompt_id=row["prompt_id"],
                iteration=row["iteration"],
                prompt_tokens=len(row["prompt_ids"]),
                turns=turns,
                tool_latency_s=latencies,
                policy_version=row["min_version"],
            )
        )
    trajectories.sort(key=lambda t: (t.iteration, t.trajectory_id))
    return trace_table(trajectories)


def export_trace(run_dir: str | Path, out_path: str | Path) -> Path:
    """Write the trace of every iteration in `run_dir/lake` to `out_path` (Parquet); returns the path."""
    lake = read_lake(run_dir)
    if lake.num_rows == 0:
        if (Path(run_dir) / RESOLVED_CONFIG_NAME).is_file():  # a run folder, before its first reward
            raise FileNotFoundError(
                f"run {run_dir} has no trajectories in its lake yet ({Path(run_dir) / 'lake'}); "
                "export it once an iteration has finished"
            )
        raise FileNotFoundError(
            f"no trajectory lake under {Path(run_dir) / 'lake'}; is {run_dir} a run directory?"
        )
    table = lake_to_trace(lake)
    log.info("exported %d trajectories from %s to %s", table.num_rows, run_dir, out_path)
    return write_trace(table, out_path)
