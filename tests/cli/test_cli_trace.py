"""`libra trace export|synth` and `libra trace-eval` as a user runs them (subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from libra_core.data.io import write_lake
from libra_core.data.schema import table_from_rows
from libra_core.traces.schema import read_trace
from tests.cli.test_cli import libra
from tests.data.test_schema import row

METRIC_KEYS = {"scheduler", "routing_accuracy", "class_accuracy", "migration_token_ratio", "score"}


def test_export_writes_the_lake_as_a_trace(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # prompt 3 tokens; turn 0 generates 2 and gets a 2-token result, turn 1 generates 1 (the answer)
    write_lake(table_from_rows([row(reward=1.0)]), run, 1)
    write_lake(table_from_rows([row(reward=0.1, iteration=2, trajectory_id="it00002-g0000-s00")]), run, 2)
    out = libra("trace", "export", str(run), "-o", str(tmp_path / "t.parquet"))
    assert out.returncode == 0, out.stderr
    assert "2 trajectories of 8.0 tokens on average; 2 tool calls (2 success)" in out.stdout
    assert "2 with their latency: 0.001-0.001 s, median 0.001 s" in out.stdout
    trace = read_trace(tmp_path / "t.parquet")
    assert [t.iteration for t in trace] == [1, 2]
    first = trace[0]
    assert first.prompt_tokens == 3
    assert [(t.gen_tokens, t.tool, t.payload_tokens, t.status) for t in first.turns] == [
        (2, "calculator", 2, "success"),
        (1, None, 0, None),
    ]
    assert first.tool_latency_s == (0.001, None)  # the call's measured wall time


def test_an_exported_trace_replays_in_the_simulator(tmp_path: Path) -> None:
    run = tmp_path / "run"
    slow = row(reward=1.0)
    slow["tool_events"][0]["latency_s"] = 250.0  # one slow call: the replay must wait for it
    write_lake(table_from_rows([slow]), run, 1)
    trace = tmp_path / "t.parquet"
    assert libra("trace", "export", str(run), "-o", str(trace)).returncode == 0
    args = ("simulate", "--scenario", str(trace), "--hardware", "8xH100", "--iterations", "2")
    out = libra(
        *args, "--policies", "static-optimal", "--spec", "latency_scale=2", "--out", str(tmp_path / "s")
    )
    assert out.returncode == 0, out.stderr
    assert (
        "workload: trace replay of t: 1 trajectories in 1 recorded iterations; all 1 tool calls at "
        in out.stdout
    )
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    # Two iterations, each waiting 2 x 250 s on the call: the bound and the run both include it.
    assert summary["lower_bound_path_s"] >= 2 * 500.0
    assert summary["results"][0]["makespan_s"] >= summary["lower_bound_path_s"]
    bad = libra(*args, "--spec", "group_size=4")
    assert bad.returncode == 2
    assert "--spec (for a trace replay) 'group_size=4'" in bad.stderr and "latency_scale" in bad.stderr


def test_synth_then_eval_all_writes_json(tmp_path: Path) -> None:
    trace = tmp_path / "synth.parquet"
    out = libra("trace", "synth", "--preset", "noisy", "--seed", "3", "-o", str(trace))
    assert out.returncode == 0, out.stderr
    out = libra(
        "trace-eval", "--trace", str(trace), "--scheduler", "all", "--buckets", "2000,8000",
        "--json", str(tmp_path / "m.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = json.loads((tmp_path / "m.json").read_text())
    names = [r["scheduler"] for r in records]
    assert set(names) == {"static", "round_robin", "least_load", "mlfq", "input_length", "cmlfq", "oracle"}
    for r in records:
        assert set(r) >= METRIC_KEYS
        assert r["score"] == r["class_accuracy"] - r["migration_token_ratio"]
        assert 0.0 <= r["class_accuracy"] <= 1.0
    by_name = {r["scheduler"]: r for r in records}
    assert by_name["oracle"]["class_accuracy"] == 1.0  # it reads the realised sizes
    assert by_name["static"]["migration_token_ratio"] == 0.0  # never moves
    assert "cmlfq" in out.stdout and "oracle" in out.stdout
    # stdout is a pipe here: the markdown table, one row per scheduler with its full column names.
    rows = {line.split("|")[1].strip().rstrip(" *"): line for line in out.stdout.splitlines()[3:]}
    assert "routing_accuracy" in out.stdout.splitlines()[1] and "┃" not in out.stdout
    assert f"{by_name['mlfq']['routing_accuracy']:.3f}" in rows["mlfq"]


def test_bad_inputs_exit_2_without_traceback(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    cases = [
        (["trace-eval", "--trace", str(garbage), "--buckets", "10"], "garbage.parquet"),
        (["trace-eval", "--trace", str(tmp_path / "missing.parquet"), "--buckets", "10"], "does not exist"),
        (["trace-eval", "--trace", str(garbage), "--buckets", "20,10"], "ascending"),
        (["trace-eval", "--trace", str(garbage), "--buckets", "10", "--scheduler", "fifo"], "fifo"),
        (["trace", "export", str(tmp_path), "-o", str(tmp_path / "x.parquet")], "no trajectory lake"),
        (["trace", "synth", "--preset", "wild", "-o", str(tmp_path / "x.parquet")], "wild"),
    ]
    for argv, needle in cases:
        out = libra(*argv)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", ""), (argv, out.stderr)
    assert not (tmp_path / "x.parquet").exists()


def test_export_of_a_run_with_no_finished_iteration_says_so(tmp_path: Path) -> None:
    # it asked whether the run folder was a run directory
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.resolved.yaml").write_text("experiment: {name: x}\n")
    out = libra("trace", "export", str(run), "-o", str(tmp_path / "x.parquet"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "has no trajectories in its lake yet" in out.stderr.replace("\n", "")
    assert "a run directory?" not in out.stderr
