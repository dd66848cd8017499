from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from libra_core.observability.request_spans import (
    REQUEST_SPAN_SCHEMA,
    read_request_spans,
    write_request_spans,
)
from libra_core.observability.timeline import instance_spans


def served_requests(n: int, seed: int = 0) -> list[tuple[str, float, float]]:
    """`n` (instance id, start, end) requests as the agent loop records them: Unix seconds with
    full float precision, instances interleaved, in the order they finished."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = 1.7e9 + rng.uniform(0.0, 60.0)
        out.append((f"rollout:run-{rng.randrange(3)}", start, start + rng.expovariate(4.0)))
    return sorted(out, key=lambda r: r[2])


def test_request_spans_round_trip_exactly_and_give_the_same_timeline(tmp_path: Path) -> None:
    served = served_requests(2000)
    path = write_request_spans(tmp_path / "stages" / "requests.arrow", served)
    back = read_request_spans(path)
    assert back == served  # same order, same ids, floats bit for bit
    assert instance_spans(4, back) == instance_spans(4, served)
    assert [p.name for p in path.parent.iterdir()] == ["requests.arrow"]  # no temp file left


def test_an_empty_rollout_writes_a_file_with_no_spans(tmp_path: Path) -> None:
    path = write_request_spans(tmp_path / "requests.arrow", [])
    assert path.is_file() and read_request_spans(path) == []


def test_no_file_or_no_path_gives_no_spans(tmp_path: Path) -> None:
    # a run folder from before rollouts wrote the file, or a result that recorded none
    assert read_request_spans(tmp_path / "stages" / "requests.arrow") == []
    assert read_request_spans(None) == []


def test_a_damaged_or_foreign_file_is_refused_by_name(tmp_path: Path) -> None:
    good = write_request_spans(tmp_path / "requests.arrow", served_requests(50))
    damaged = tmp_path / "damaged.arrow"
    damaged.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ValueError, match="damaged.arrow: not a request-spans Arrow IPC file"):
        read_request_spans(damaged)
    foreign = tmp_path / "foreign.arrow"
    schema = pa.schema([pa.field("instance_id", pa.string()), pa.field("start", pa.float64())])
    with pa.OSFile(str(foreign), "wb") as sink, ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.table({"instance_id": ["a"], "start": [1.0]}, schema=schema))
    with pytest.raises(ValueError, match="foreign.arrow: not a request-spans file"):
        read_request_spans(foreign)
    folder = tmp_path / "folder.arrow"
    folder.mkdir()
    with pytest.raises(ValueError, match="folder.arrow"):
        read_request_spans(folder)
    assert REQUEST_SPAN_SCHEMA.names == ["instance_id", "start_s", "end_s"]


@pytest.mark.parametrize(
    ("span", "named"),
    [
        (("vllm-0", None, 1.0), r"row 1 has a null \('vllm-0', None, 1.0\)"),
        (("vllm-0", float("nan"), 1.0), r"row 1 \('vllm-0'\) is no span: start nan, end 1.0"),
        (("vllm-0", 2.0, 1.0), r"row 1 \('vllm-0'\) is no span: start 2.0, end 1.0"),
    ],
)
def test_a_row_that_is_no_span_is_refused_by_name_and_costs_only_the_instance_spans(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, span: tuple, named: str
) -> None:
    # read back as written; the iteration flow's instance_spans then raised (a null: a TypeError)
    # after the rollout had run, and failed the iteration
    import logging

    from libra_core.observability.timeline import rollout_instance_spans

    path = write_request_spans(tmp_path / "requests.arrow", [("vllm-0", 0.0, 0.5), span])
    with pytest.raises(ValueError, match=named):
        read_request_spans(path)
    with caplog.at_level(logging.WARNING):
        assert rollout_instance_spans(3, path) == []
    assert "iteration 3: no rollout instance spans: " in caplog.text
    good = write_request_spans(tmp_path / "good.arrow", [("vllm-0", 0.0, 0.5), ("vllm-0", 0.4, 1.0)])
    assert [(s.lane, s.start, s.end) for s in rollout_instance_spans(3, good)] == [
        ("instance/vllm-0", 0.0, 1.0)
    ]
