"""What the benchmark scripts print is what they claim: Markdown tables whose rows have the header's
columns, every policy a name stands for, percentiles by one definition, docstrings that list what runs."""

from __future__ import annotations

import json

from tests.benchmarks.support import call_main, load_script, run_script


def _table_widths(stdout: str) -> list[int]:
    """Cells per line of every Markdown table line (`| a | b |` has 2)."""
    return [len(line.strip().strip("|").split("|")) for line in stdout.splitlines() if line.startswith("|")]


def _assert_one_width(stdout: str) -> None:
    widths = _table_widths(stdout)
    assert widths and set(widths) == {widths[0]}, stdout  # a label's ` | ` made extra cells


def test_static_sweep_rows_have_the_headers_columns() -> None:
    out = run_script("sim_static_sweep.py", "--scenario", "tiny", "--iterations", "1", "--top", "2")
    assert out.returncode == 0, out.stderr
    _assert_one_width(out.stdout)
    assert "| static-optimal (the planner's): train " in out.stdout


def test_rerank_rows_have_the_headers_columns() -> None:
    out = run_script("sim_rerank.py", "--scenario", "tiny", "--plans", "2")
    assert out.returncode == 0, out.stderr
    _assert_one_width(out.stdout)


def test_decode_compare_without_cuda_graphs_keeps_the_eager_column(tmp_path, capsys) -> None:
    """A CPU `--smoke` run records no CUDA-graph time: its two cells stay empty, and the eager time
    stays under `eager` (it was printed under `graph / model`)."""
    module = load_script("gpu_decode_step")
    path = tmp_path / "d.json"
    rec = {
        "params": 1e6,
        "decode": [{"batch": 2, "ctx": 64, "eager_ms": 7.5, "graph_ms": None}],
        "prefill": [],
    }
    path.write_text(json.dumps({"device": "cpu", "torch": "t", "models": {"tiny": rec}}))
    module.compare(path, "H100")
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| ctx |"))
    row = next(line for line in out.splitlines() if line.startswith("| 64 | 2 |"))
    cells = dict(zip(header.strip("|").split("|"), row.strip("|").split("|"), strict=True))
    assert cells[" eager "].strip() == "7.50" and not cells[" CUDA graph "].strip()


def test_tp_shards_skip_degrees_that_do_not_split_the_model_before_measuring(
    tmp_path, monkeypatch, capsys
) -> None:
    """The tiny model's 4 heads split 1, 2 and 4 ways, not 8: TP 8 raised a ValueError after the
    other degrees were measured."""
    module = load_script("gpu_decode_step")
    seen: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        module, "measure_shards", lambda name, out, dev, reps, pts, degrees: seen.append(degrees)
    )
    args = ("--tp-shards", "--models", "tiny", "--device", "cpu", "--out", str(tmp_path / "s.json"))
    assert call_main(module, monkeypatch, *args) == 0
    assert seen == [(1, 2, 4)]
    assert "tiny: TP 8 skipped" in capsys.readouterr().out


def test_sim_diag_all_runs_every_policy_under_its_own_name() -> None:
    """`all` ran the first policy only (colocated), under the name `all`; an alias ran twice."""
    out = run_script("sim_diag.py", "tiny", "1", "all,libra")
    assert out.returncode == 0, out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines() if " tok/s " in line]
    expected = ["colocated", "static-uniform", "greedy", "static-optimal", "+planning"]
    assert rows == [*expected, "+hetero-tp", "+cmlfq", "+elastic"]


def test_latency_percentiles_are_nearest_rank() -> None:
    """p99 of 100 samples is the 99th (it printed the max), p50 of 10 the 5th (it printed the 6th)."""
    percentile = load_script("scheduler_latency").percentile
    hundred = [1000 * k for k in range(1, 101)]  # 1..100 us, in ns
    assert percentile(hundred, 0.99) == 99.0 and percentile(hundred, 0.5) == 50.0
    assert percentile([1000 * k for k in range(1, 11)], 0.5) == 5.0
    assert percentile([1000 * k for k in range(1, 101)], 0.07) == 7.0  # 0.07 x 100 is 7.000000000000001
    assert percentile([3000], 0.99) == 3.0


def test_planner_speed_docstring_names_every_case() -> None:
    module = load_script("planner_speed")
    doc = module.__doc__.lower()
    for cluster, model, workload, _ in module.CASES:
        assert f"{cluster} + {model}".lower() in doc and workload in doc, (cluster, model, workload)


def test_async_vs_sync_says_its_wall_time_is_the_iterations_sum(tmp_path, monkeypatch) -> None:
    module = load_script("async_vs_sync")
    rows = [
        {"iteration": i, "iteration_s": s, "policy_version": i, "reward_mean": 0.5, "eval_accuracy": None}
        | {"max_staleness_seen": 0, "stale_dropped": 0}
        for i, s in enumerate((3.0, 1.0, 2.0), start=1)
    ]
    import libra_core.data.history as history

    monkeypatch.setattr(history, "read_history", lambda run_dir: rows)
    got = module._summary(tmp_path, 9.0)
    assert got["iterations_wall_s"] == 6.0 and got["median_iteration_s"] == 2.0
    doc = " ".join(module.__doc__.split())
    assert "first iteration start to last iteration end" not in doc  # what it did not compute
    assert "summed wall time (the history's `iteration_s`" in doc
