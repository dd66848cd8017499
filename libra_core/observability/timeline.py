"""Per-iteration timeline of a run: when each stage and each rollout instance was busy.

The experiment flow records one span per stage (plan, pool, rollout, reward, update, sync, eval) with
wall-clock start and end, plus one span per busy stretch of every rollout instance (the union of
the generation requests it was serving, which the rollout stage writes to a file: request_spans.py).
Spans are kept per iteration in `<run>/timeline/iteration=N.json` (rewritten atomically, so a
resumed iteration replaces its spans) and exported together as a Chrome/Perfetto trace
(`<run>/timeline/trace.json`, open it in ui.perfetto.dev or chrome://tracing). Times are Unix
seconds; in the async pipeline the rollout of iteration i+1 overlaps the update of iteration i, and
the spans show that as it happened.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libra_core.data.atomic import atomic_path
from libra_core.data.io import drop_partitions_after

log = logging.getLogger(__name__)

STAGE_LANES = ("plan", "pool", "rollout", "reward", "update", "sync", "eval", "checkpoint")
INSTANCE_LANE_PREFIX = "instance/"  # lane of one rollout instance, e.g. "instance/vllm-0"


@dataclass(frozen=True)
class Span:
    iteration: int
    lane: str  # a stage name, or INSTANCE_LANE_PREFIX + instance id
    start: float  # Unix seconds
    end: float

    def __post_init__(self) -> None:
        if not self.lane:
            raise ValueError("span lane must not be empty")
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            # json.dumps would write them as Infinity/NaN, which trace.json readers refuse
            raise ValueError(
                f"span {self.lane!r} of iteration {self.iteration} has a start or end that is not a "
                f"finite number ({self.start}, {self.end})"
            )
        if not self.end >= self.start:
            raise ValueError(f"span {self.lane!r} of iteration {self.iteration} ends before it starts")

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def merge_intervals(
    intervals: Iterable[tuple[float, float]], gap_s: float = 0.05
) -> list[tuple[float, float]]:
    """Union of [start, end] intervals; stretches closer than `gap_s` are joined (a request that
    ends and the next that starts a few ms later are one busy stretch of the instance)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap_s:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def instance_spans(iteration: int, busy: Sequence[tuple[str, float, float]]) -> list[Span]:
    """Spans of each rollout instance from its (instance id, start, end) request intervals."""
    by_instance: dict[str, list[tuple[float, float]]] = {}
    for instance, start, end in busy:
        by_instance.setdefault(instance, []).append((start, end))
    return [
        Span(iteration, INSTANCE_LANE_PREFIX + instance, s, e)
        for instance in sorted(by_instance)
        for s, e in merge_intervals(by_instance[instance])
    ]


def rollout_instance_spans(iteration: int, requests_path: str | Path | None) -> list[Span]:
    """`instance_spans` of a rollout's request-spans file (request_spans.py). A damaged one is
    logged and gives no spans: the timeline is a view, and until 2026-12-06 such a file failed the
    iteration after its rollout had run."""
    from libra_core.observability.request_spans import read_request_spans

    try:
        return instance_spans(iteration, read_request_spans(requests_path))
    except ValueError as err:
        log.warning("iteration %d: no rollout instance spans: %s", iteration, err)
        return []


def timeline_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "timeline"


def write_timeline(run_dir: str | Path, iteration: int, spans: Sequence[Span]) -> Path:
    path = timeline_dir(run_dir) / f"iteration={iteration}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps([asdict(s) for s in spans], indent=1))
    return path


def drop_timeline_after(run_dir: str | Path, iteration: int) -> int:
    """Delete the span files of iterations after `iteration` (a resumed run's abandoned attempt)
    and rewrite trace.json without them; returns how many files were deleted."""
    dropped = drop_partitions_after(timeline_dir(run_dir), ".json", iteration)
    if dropped:
        write_perfetto(run_dir)
    return dropped


def _span(d: object, iteration: int) -> Span:
    """One span of a file of `iteration`, its types checked: a cast read `"lane": null` as a lane
    named "None", `"iteration": 1.9` as 1 and a string time as a number."""
    if not isinstance(d, dict):
        raise ValueError(f"a span is {type(d).__name__}, not an object")
    if type(d["iteration"]) is not int or d["iteration"] != iteration:
        raise ValueError(f"a span of iteration {d['iteration']!r} in the file of iteration {iteration}")
    if not isinstance(d["lane"], str):
        raise ValueError(f"a span's lane is {d['lane']!r}, not a name")
    for key in ("start", "end"):
        if isinstance(d[key], bool) or not isinstance(d[key], int | float):
            raise ValueError(f"a span's {key} is {d[key]!r}, not a number of seconds")
    return Span(iteration, d["lane"], float(d["start"]), float(d["end"]))


def _parse(path: Path) -> list[Span]:
    try:
        iteration = int(path.stem.removeprefix("iteration="))
        raw = json.loads(path.read_text())
        if not isinstance(raw, list):
            raise ValueError("expected a list of spans")
        return [_span(d, iteration) for d in raw]
    except (ValueError, KeyError, TypeError, OverflowError) as err:  # Overflow: Infinity, 1e400
        raise ValueError(f"{path}: not a timeline file ({err})") from err
    except OSError as err:  # a folder of that name, no permission
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from err


def read_timeline(run_dir: str | Path, damaged: list[str] | None = None) -> list[Span]:
    """All spans of the run, ordered by start time (empty if the run recorded none). A span file
    that cannot be read raises a ValueError naming it; given a `damaged` list, it is skipped and
    its problem appended instead: the timeline is a view of the run, so the readers that show it
    (trace.json, the report, the UI's artifacts) lose that file alone."""
    spans: list[Span] = []
    for path in sorted(timeline_dir(run_dir).glob("iteration=*.json")):
        try:
            spans += _parse(path)
        except ValueError as err:
            if damaged is None:
                raise
            damaged.append(str(err))
    return sorted(spans, key=lambda s: (s.start, s.lane))


def to_perfetto(spans: Sequence[Span]) -> dict[str, Any]:
    """Chrome trace-event JSON: one process per iteration, one thread per lane, complete events."""
    if not spans:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    origin = min(s.start for s in spans)
    lanes = sorted({s.lane for s in spans}, key=_lane_order)
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    events: list[dict[str, Any]] = []
    for it in sorted({s.iteration for s in spans}):
        events.append({"ph": "M", "name": "process_name", "pid": it, "args": {"name": f"iteration {it}"}})
        events += [
            {"ph": "M", "name": "thread_name", "pid": it, "tid": tid[lane], "args": {"name": lane}}
            for lane in lanes
        ]
    for s in spans:
        events.append(
            {
                "ph": "X",
                "name": lane_label(s.lane),
                "cat": "instance" if s.lane.startswith(INSTANCE_LANE_PREFIX) else "stage",
                "pid": s.iteration,
                "tid": tid[s.lane],
                "ts": round((s.start - origin) * 1e6, 1),
                "dur": round(s.duration_s * 1e6, 1),
                "args": {"iteration": s.iteration, "seconds": round(s.duration_s, 4)},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_perfetto(run_dir: str | Path) -> Path:
    """(Re)write `<run>/timeline/trace.json` from every recorded span; a damaged span file is left
    out with a warning (until 2026-12-06 it failed the write, and with it a resume half-way)."""
    path = timeline_dir(run_dir) / "trace.json"
    damaged: list[str] = []
    spans = read_timeline(run_dir, damaged)
    for problem in damaged:
        log.warning("left out of trace.json: %s", problem)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(to_perfetto(spans)))
    return path


def _lane_order(lane: str) -> tuple[int, int, list[tuple[int, int, str]]]:
    """Stages in pipeline order, rollout instances right after the rollout stage, numbers in names
    by value (`vllm-2` before `vllm-10`)."""
    parts = re.split(r"(\d+)", lane)  # odd positions: the runs of digits
    natural = [(1, *_by_value(part)) if i % 2 else (0, 0, part) for i, part in enumerate(parts)]
    if lane.startswith(INSTANCE_LANE_PREFIX):
        return (STAGE_LANES.index("rollout"), 1, natural)
    return (STAGE_LANES.index(lane) if lane in STAGE_LANES else len(STAGE_LANES), 0, natural)


def _by_value(digits: str) -> tuple[int, str]:
    """A run of digits as a key that orders by value without `int()`: a lane name with over 4300
    digits made `int` raise, and the whole report failed without naming the file (until
    2026-12-07). Fewer significant digits is smaller; of as many, the text compares as the value."""
    significant = digits.lstrip("0") or "0"
    return (len(significant), significant)


def lane_order(lanes: Iterable[str]) -> list[str]:
    return sorted(set(lanes), key=_lane_order)


def lane_label(lane: str) -> str:
    """What a person reads for a lane: the stage name, or the instance (`vllm-0`; a pool's ids
    like `rollout:<run name>-0` are shortened to their index)."""
    instance = lane.removeprefix(INSTANCE_LANE_PREFIX)
    if instance != lane and ":" in instance and (index := instance.rsplit("-", 1)[-1]).isdigit():
        return f"vllm-{index}"
    return instance
