from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from libra_core.observability.timeline import (
    Span,
    instance_spans,
    lane_label,
    lane_order,
    merge_intervals,
    read_timeline,
    timeline_dir,
    to_perfetto,
    write_perfetto,
    write_timeline,
)


def test_merge_intervals_unions_overlaps_and_joins_small_gaps() -> None:
    intervals = [(0.0, 1.0), (0.5, 2.0), (2.03, 3.0), (3.2, 4.0), (10.0, 10.5)]
    assert merge_intervals(intervals) == [(0.0, 3.0), (3.2, 4.0), (10.0, 10.5)]
    assert merge_intervals(intervals, gap_s=0.0) == [(0.0, 2.0), (2.03, 3.0), (3.2, 4.0), (10.0, 10.5)]
    assert merge_intervals(intervals, gap_s=0.3) == [(0.0, 4.0), (10.0, 10.5)]


def test_merge_intervals_keeps_a_contained_interval_inside() -> None:
    assert merge_intervals([(0.0, 5.0), (1.0, 2.0), (4.0, 4.5)]) == [(0.0, 5.0)]


def test_merge_intervals_is_order_independent() -> None:
    intervals = [(3.2, 4.0), (0.5, 2.0), (10.0, 10.5), (0.0, 1.0), (2.03, 3.0)]
    assert (
        merge_intervals(intervals) == merge_intervals(sorted(intervals)) == merge_intervals(intervals[::-1])
    )
    assert merge_intervals([]) == []


def test_instance_spans_merge_per_instance() -> None:
    busy = [
        ("vllm-1", 5.0, 6.0),
        ("vllm-0", 0.0, 1.0),
        ("vllm-0", 0.9, 2.0),
        ("vllm-0", 4.0, 4.5),
        ("vllm-1", 6.01, 7.0),
    ]
    spans = instance_spans(3, busy)
    assert spans == [
        Span(3, "instance/vllm-0", 0.0, 2.0),
        Span(3, "instance/vllm-0", 4.0, 4.5),
        Span(3, "instance/vllm-1", 5.0, 7.0),
    ]


def test_span_rejects_end_before_start_and_empty_lane() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        Span(1, "rollout", 2.0, 1.0)
    with pytest.raises(ValueError, match="lane"):
        Span(1, "", 1.0, 2.0)
    # an infinite end was written into trace.json as Infinity (not JSON); a NaN start passed as
    # "ends before it starts"
    for start, end in ((1.0, math.inf), (math.nan, 2.0)):
        with pytest.raises(ValueError, match="has a start or end that is not a finite number"):
            Span(1, "rollout", start, end)


def test_lane_order_puts_instances_after_rollout_and_labels_strip_prefix() -> None:
    lanes = ["sync", "instance/vllm-1", "update", "eval", "plan", "rollout", "instance/vllm-0", "reward"]
    assert lane_order(lanes) == [
        "plan",
        "rollout",
        "instance/vllm-0",
        "instance/vllm-1",
        "reward",
        "update",
        "sync",
        "eval",
    ]
    assert lane_label("instance/vllm-0") == "vllm-0"
    assert lane_label("update") == "update"


def test_write_read_roundtrip_and_replacing_an_iteration(tmp_path: Path) -> None:
    first = [Span(1, "rollout", 100.0, 104.0), Span(1, "update", 104.5, 106.0)]
    second = [Span(2, "rollout", 106.0, 109.0), Span(2, "instance/vllm-0", 106.1, 108.7)]
    write_timeline(tmp_path, 1, first)
    write_timeline(tmp_path, 2, second)
    assert read_timeline(tmp_path) == sorted(first + second, key=lambda s: (s.start, s.lane))

    resumed = [Span(1, "rollout", 200.0, 201.0)]  # a resumed iteration replaces its spans
    write_timeline(tmp_path, 1, resumed)
    assert read_timeline(tmp_path) == [*sorted(second, key=lambda s: s.start), *resumed]
    assert not list(timeline_dir(tmp_path).glob("*.tmp"))


def test_read_timeline_of_a_run_without_one_is_empty(tmp_path: Path) -> None:
    assert read_timeline(tmp_path) == []


def test_a_timeline_entry_that_is_a_folder_names_the_file(tmp_path: Path) -> None:
    write_timeline(tmp_path, 1, [Span(1, "rollout", 0.0, 1.0)])
    (timeline_dir(tmp_path) / "iteration=2.json").mkdir()  # was an IsADirectoryError traceback
    with pytest.raises(ValueError, match=r"iteration=2\.json: cannot be read \(Is a directory\)"):
        read_timeline(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        '{"iteration": 1}',
        '[{"iteration": 2, "lane": "rollout", "start": 1.0}]',
        "not json",
        "[1, 2]",
        # OverflowError, which escaped as a traceback
        '[{"iteration": Infinity, "lane": "rollout", "start": 1.0, "end": 2.0}]',
        '[{"iteration": 2, "lane": "rollout", "start": 1' + "9" * 400 + ', "end": 2.0}]',
        # wrong types, read by casts until 2026-12-07 (a lane named "None", iteration 1.9 as 1)
        '[{"iteration": 2, "lane": null, "start": 1.0, "end": 2.0}]',
        '[{"iteration": 2, "lane": ["rollout"], "start": 1.0, "end": 2.0}]',
        '[{"iteration": 1.9, "lane": "rollout", "start": 1.0, "end": 2.0}]',
        '[{"iteration": "2", "lane": "rollout", "start": 1.0, "end": 2.0}]',
        '[{"iteration": 2, "lane": "rollout", "start": "1.0", "end": 2.0}]',
        '[{"iteration": 2, "lane": "rollout", "start": true, "end": 2.0}]',
        # a span of another iteration than its file's
        '[{"iteration": 7, "lane": "rollout", "start": 1.0, "end": 2.0}]',
    ],
)
def test_malformed_timeline_file_names_the_file(tmp_path: Path, text: str) -> None:
    write_timeline(tmp_path, 1, [Span(1, "rollout", 0.0, 1.0)])
    bad = timeline_dir(tmp_path) / "iteration=2.json"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"iteration=2\.json"):
        read_timeline(tmp_path)


def test_a_well_formed_file_reads_with_integer_times(tmp_path: Path) -> None:
    timeline_dir(tmp_path).mkdir(parents=True)
    (timeline_dir(tmp_path) / "iteration=2.json").write_text(
        '[{"iteration": 2, "lane": "rollout", "start": 1, "end": 2}]'
    )
    assert read_timeline(tmp_path) == [Span(2, "rollout", 1.0, 2.0)]


def test_instances_order_by_their_number() -> None:
    lanes = [f"instance/vllm-{i}" for i in (10, 2, 1, 11)] + ["rollout", "update"]
    assert lane_order(lanes) == ["rollout", *(f"instance/vllm-{i}" for i in (1, 2, 10, 11)), "update"]


def test_to_perfetto_events_match_spans_in_microseconds() -> None:
    spans = [
        Span(1, "rollout", 1000.0, 1003.25),
        Span(1, "instance/vllm-0", 1000.5, 1002.75),
        Span(1, "update", 1003.5, 1004.0),
        Span(2, "rollout", 1003.5, 1006.125),
    ]
    trace = to_perfetto(spans)
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(spans)
    for span, event in zip(spans, complete, strict=True):
        assert event["pid"] == span.iteration
        assert event["ts"] == pytest.approx((span.start - 1000.0) * 1e6)
        assert event["dur"] == pytest.approx((span.end - span.start) * 1e6)
        assert event["name"] == lane_label(span.lane)
        assert event["cat"] == ("instance" if span.lane.startswith("instance/") else "stage")

    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    # One named thread per lane in every iteration's process, numbered in lane order.
    assert threads == {
        (it, tid): lane
        for it in (1, 2)
        for tid, lane in enumerate(["rollout", "instance/vllm-0", "update"], start=1)
    }
    tid_of = {name: tid for (_, tid), name in threads.items()}
    assert [e["tid"] for e in complete] == [tid_of[s.lane] for s in spans]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {1: "iteration 1", 2: "iteration 2"}


def test_write_perfetto_writes_every_recorded_span(tmp_path: Path) -> None:
    write_timeline(tmp_path, 1, [Span(1, "rollout", 10.0, 12.0), Span(1, "sync", 12.0, 12.5)])
    write_timeline(tmp_path, 2, [Span(2, "rollout", 12.5, 13.0)])
    trace = json.loads(write_perfetto(tmp_path).read_text())
    durations = sorted(e["dur"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert durations == pytest.approx([0.5e6, 0.5e6, 2.0e6])
    assert to_perfetto([]) == {"traceEvents": [], "displayTimeUnit": "ms"}


def test_write_perfetto_leaves_out_a_damaged_span_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # it raised, which failed a resume half-way (history cut back, state and stage files not)
    write_timeline(tmp_path, 1, [Span(1, "rollout", 10.0, 12.0)])
    write_timeline(tmp_path, 3, [Span(3, "rollout", 14.0, 15.0)])
    (timeline_dir(tmp_path) / "iteration=2.json").write_text("[{")
    with caplog.at_level(logging.WARNING):
        trace = json.loads(write_perfetto(tmp_path).read_text())
    assert sorted(e["dur"] for e in trace["traceEvents"] if e["ph"] == "X") == pytest.approx([1e6, 2e6])
    assert "left out of trace.json: " in caplog.text
    assert "iteration=2.json: not a timeline file" in caplog.text
    damaged: list[str] = []
    assert [s.iteration for s in read_timeline(tmp_path, damaged)] == [1, 3]
    assert len(damaged) == 1 and "iteration=2.json" in damaged[0]
    with pytest.raises(ValueError, match=r"iteration=2\.json"):  # strict without the list
        read_timeline(tmp_path)


def test_lane_order_of_a_name_with_thousands_of_digits() -> None:
    # int() of over 4300 digits raised ValueError, and the whole report failed without naming a file
    huge = "instance/vllm-" + "9" * 5000
    lanes = [huge, "instance/vllm-10", "instance/vllm-007", "instance/vllm-2", "rollout", "update"]
    assert lane_order(lanes) == [
        "rollout",
        "instance/vllm-2",
        "instance/vllm-007",
        "instance/vllm-10",
        huge,
        "update",
    ]
    events = to_perfetto([Span(1, huge, 0.0, 1.0), Span(1, "rollout", 0.0, 1.0)])["traceEvents"]
    assert [e["args"]["name"] for e in events if e["name"] == "thread_name"][-1] == huge
