"""A bad argument to a benchmark script is one `error:` line and exit 2, before any work is done:
no traceback, no table for "0 iterations", no Hugging Face error for a missing folder."""

from __future__ import annotations

import pytest

from tests.benchmarks.support import run_script

CASES = [
    ("sim_static_sweep.py", ["--iterations", "0"], "--iterations"),
    ("sim_long_bucket.py", ["--iterations", "0"], "--iterations"),
    ("sim_long_bucket.py", ["--prompts-per-iteration", "0"], "--prompts-per-iteration"),
    ("sim_rerank.py", ["--prompts-per-iteration", "0"], "--prompts-per-iteration"),
    ("sim_rerank.py", ["--plans", "-1"], "--plans"),
    ("sim_diag.py", ["tiny", "0", "greedy"], "ITERATIONS"),
    ("sim_crit_path.py", ["--scenario", "tiny", "--instances", "0"], "--instances"),
    ("sim_crit_path.py", ["--scenario", "tiny", "--tp", "3"], "--tp 3"),
    ("sim_spread.py", ["--iterations", "0"], "--iterations"),
    ("sim_spread.py", ["--iterations", "2", "--scenarios", "tiny"], "--iterations"),  # was "cv inf"
    ("sim_homogeneous_price.py", ["--rollout-gpus", "-4"], "--rollout-gpus"),
    ("sim_workload_shape.py", ["--scenario", "tiny", "--iterations", "0"], "--iterations"),
    ("sim_table.py", ["--scenarios", "tiny", "--iterations", "0"], "--iterations"),
    ("planner_speed.py", ["--repeats", "0"], "--repeats"),
    ("planner_reprice.py", ["--staleness", "-1"], "--staleness"),
    ("planner_reprice.py", ["--windows", "nope"], "nope"),
    ("scheduler_latency.py", ["--trajectories", "0"], "--trajectories"),
    ("gpu_decode_step.py", ["--out", "x.json", "--smoke", "--reps", "0"], "--reps"),
    ("gpu_decode_step.py", ["--compare", "/nonexistent"], "/nonexistent"),
    ("gpu_train_step.py", ["--compare", "/nonexistent"], "/nonexistent"),
    ("async_vs_sync.py", ["--modes", ""], "--modes"),
    ("async_vs_sync.py", ["--summarize", "foo"], "MODE=RUN_DIR"),
    ("async_vs_sync.py", ["--modes", "", "--summarize", "sync=/nonexistent"], "/nonexistent"),
    ("vllm_step_overhead.py", ["--lengths", "96"], "--lengths"),
    ("vllm_step_overhead.py", ["--batches", "x"], "--batches"),
    ("learning_curve.py", ["/nonexistent"], "/nonexistent"),
    ("policy_errors.py", ["--run", "/nonexistent"], "/nonexistent"),
    ("policy_errors.py", ["--policy", "/nonexistent"], "/nonexistent"),
    ("rollout_throughput.py", ["/nonexistent"], "/nonexistent"),
    ("trace_eval_table.py", [], "--run"),  # its old default named a run that does not exist
    ("trace_eval_table.py", ["--run", "/nonexistent"], "/nonexistent"),
    ("answer_check_cost.py", ["--timeout-s", "0"], "--timeout-s"),
    ("answer_check_cost.py", ["--data", "/nonexistent"], "/nonexistent"),
    ("answer_check_cost.py", ["--data", ".", "--file", "benchmarks"], "is not a file"),  # was a traceback
    ("answer_check_cost.py", ["--data", ".", "--file", "README.md"], "invalid JSON"),  # was a traceback
    ("env_tool_cost.py", ["--runs", "0"], "--runs"),
    ("env_tool_cost.py", ["--search-calls", "x"], "--search-calls"),
    ("env_tool_cost.py", ["--wall-time-s", "0"], "--wall-time-s"),
    ("env_tool_cost.py", ["--cpu-time-s", "601"], "--cpu-time-s"),
    ("env_tool_cost.py", ["--data", "/nonexistent"], "/nonexistent: no such data folder"),
    ("env_tool_cost.py", ["--data", "benchmarks"], "missing code/mbpp.jsonl"),
    ("env_tool_cost.py", ["--json", "/nonexistent/x.json"], "--json"),
    ("cost_model_error.py", ["--profiles", "/nonexistent"], "/nonexistent"),
    ("cost_model_error.py", ["--profiles", "benchmarks"], "missing compute/"),  # was a traceback
    # a policy that splits the cluster cannot run on one GPU: was a ZeroDivisionError / a traceback
    ("sim_diag.py", ["tiny", "1", "greedy", "--hardware=1xH100"], "at least 2 GPUs"),
    ("sim_load_sweep.py", ["--scenarios", "tiny", "--hardware", "1xH100"], "at least 2 GPUs"),
    ("sim_setting_compare.py", ["--scenarios", "tiny", "--hardware", "1xH100"], "at least 2 GPUs"),
    ("sim_rerank.py", ["--scenario", "tiny", "--policy", "all"], "--policy all"),  # was colocated's table
    ("sim_spread.py", ["--iterations", "101", "--scenarios", "tiny"], "--iterations 101"),  # extrapolated
    # a negative seed: a traceback once seed 0's table was printed
    ("sim_table.py", ["--scenarios", "tiny", "--iterations", "1", "--seeds", "0", "-1"], "--seeds"),
    ("sim_load_sweep.py", ["--seed", "-1"], "--seed"),
    ("sim_setting_compare.py", ["--seed", "-1"], "--seed"),
    ("sim_future_window.py", ["--seed", "-1"], "--seed"),
    # a cluster the model does not train on: a traceback
    (
        "sim_table.py",
        ["--scenarios", "r2e-gym", "--hardware", "4xA800", "--iterations", "1"],
        "cannot deploy",
    ),
    ("sim_speed.py", ["--hardware", "4xA800", "--iterations", "1"], "cannot deploy"),
    # ... and no table header before that error line
    (
        "sim_load_sweep.py",
        ["--scenarios", "r2e-gym", "--hardware", "4xA800", "--iterations", "1", "--loads", "8"],
        "cannot deploy",
    ),
    (
        "sim_setting_compare.py",
        ["--scenarios", "r2e-gym", "--hardware", "4xA800", "--iterations", "1", "--loads", "8"],
        "cannot deploy",
    ),
    ("sim_mixed_price.py", ["--hardware", "4xA800", "--iterations", "1"], "found no plan"),
    (
        "sim_crit_path.py",
        ["--scenario", "tiny", "--tp", "8", "--instances", "7"],
        "--instances 7",
    ),  # 56 of 48
    (
        "gpu_decode_step.py",
        ["--smoke", "--device", "bogus", "--out", "x.json"],
        "--device bogus",
    ),  # torch's error
    # an unwritable --out started `libra run`; its own keys won over by a --set reported an older run
    ("async_vs_sync.py", ["--out", "/etc/passwd"], "--out"),
    ("async_vs_sync.py", ["--set", "experiment.output_dir=/tmp/elsewhere"], "experiment.output_dir"),
]


@pytest.mark.parametrize(("script", "args", "named"), CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in CASES])
def test_a_bad_argument_exits_2_with_one_line_naming_it(script: str, args: list[str], named: str) -> None:
    out = run_script(script, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: ") and named in last, last
    assert "|" not in out.stdout  # no table was printed


@pytest.mark.parametrize("flag", ["--rounds", "--steps"])
def test_elastic_join_refuses_zero_before_it_starts_the_worker_pool(flag: str) -> None:
    out = run_script("elastic_join.py", flag, "0")
    assert out.returncode == 2 and f"argument {flag}: must be >= 1" in out.stderr
    assert "pool:" not in out.stdout  # the pool's start line


def test_trace_eval_table_checks_its_inputs_before_it_creates_the_output_folder(tmp_path) -> None:
    out_dir = tmp_path / "traces"
    out = run_script("trace_eval_table.py", "--run", str(tmp_path / "missing-run"), "--out", str(out_dir))
    assert out.returncode == 2 and "missing-run: no such run folder" in out.stderr
    assert not out_dir.exists()
