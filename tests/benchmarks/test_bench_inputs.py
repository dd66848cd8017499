"""Input files a benchmark script reads are checked before its table: a run too short for the
window, an empty data file, a run folder without a history are one `error:` line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.support import run_script


def _assert_error(out, script: str, named: str) -> None:  # noqa: ANN001
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: ") and named in last, last
    assert out.stdout == ""  # no table header before the error


def _summary(folder: Path, results: list[dict]) -> Path:
    folder.mkdir()
    summary = {"scenario": "tiny", "iterations": 2, "seed": 0, "results": results}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.mark.parametrize(
    ("results", "args", "named"),
    [
        ([{"policy": "greedy", "iteration_s": [1.0, 2.0]}], [], "the run has 2 iterations"),
        ([{"policy": "greedy"}], ["--first", "0", "1", "--last", "1"], "KeyError: 'iteration_s'"),
        ([], ["--first", "0", "1", "--last", "1"], "holds no policy's results"),
    ],
    ids=["window-beyond-the-run", "no-iteration-times", "no-results"],
)
def test_iteration_means_checks_the_summary_before_the_table(tmp_path, results, args, named) -> None:
    folder = _summary(tmp_path / "tiny", results)
    _assert_error(run_script("sim_iteration_means.py", str(folder), *args), "sim_iteration_means.py", named)


def test_iteration_means_averages_the_chosen_windows(tmp_path) -> None:
    results = [{"policy": "greedy", "iteration_s": [1.0, 2.0, 4.0]}, {"policy": "x", "iteration_s": [9.0]}]
    folder = _summary(tmp_path / "tiny", results)
    out = run_script(
        "sim_iteration_means.py", str(folder), "--first", "0", "1", "--last", "2", "--policies", "greedy"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "| greedy | 1.5 | 3.0 |"  # x's one iteration is not checked


def test_answer_check_cost_refuses_a_file_without_records(tmp_path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    out = run_script("answer_check_cost.py", "--data", str(tmp_path), "--file", "empty.jsonl")
    _assert_error(out, "answer_check_cost.py", "holds no record")  # was a ZeroDivisionError


def test_artifact_cost_refuses_a_run_without_a_history(tmp_path) -> None:
    (tmp_path / "timeline").mkdir()
    span = {"iteration": 1, "lane": "rollout", "start": 0.0, "end": 1.0}
    (tmp_path / "timeline" / "iteration=00001.json").write_text(json.dumps([span]))
    out = run_script("artifact_cost.py", str(tmp_path), "--repeat", "1")
    _assert_error(out, "artifact_cost.py", "no history recorded")  # was the curves' ValueError
