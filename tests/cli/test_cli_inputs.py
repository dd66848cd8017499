"""Bad input to the `libra` commands: exit 2 with one line naming the problem, checked before the
command does its work, and nothing already written replaced (subprocess, as a user runs them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from libra_core.data.io import write_lake
from libra_core.data.schema import table_from_rows
from tests.cli.test_cli import libra
from tests.data.test_schema import row


def _synth(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    assert libra("trace", "synth", "--preset", "causal", "-o", str(path)).returncode == 0
    return path


def _error(out) -> str:  # noqa: ANN001
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_outputs_are_checked_before_the_work(tmp_path: Path) -> None:
    trace = _synth(tmp_path)
    before = trace.read_bytes()
    # trace-eval must not replace the trace it reads with its JSON.
    err = _error(libra("trace-eval", "--trace", str(trace), "--buckets", "1000,4000", "--json", str(trace)))
    assert "is an input of this command" in err and trace.read_bytes() == before
    (tmp_path / "adir").mkdir()
    assert "is a folder; give a file name" in _error(libra("trace", "synth", "-o", str(tmp_path / "adir")))
    assert not [p for p in (tmp_path / "adir").iterdir()]  # no stray temp file
    (tmp_path / "existing.txt").write_text("keep me")
    out = libra("simulate", "--scenario", "tiny", "--hardware", "8xA800", "--iterations", "1",
                "--policies", "greedy", "--out", str(tmp_path / "existing.txt"))  # fmt: skip
    assert (
        "exists and is not a folder" in _error(out) and (tmp_path / "existing.txt").read_text() == "keep me"
    )
    out = libra("trace", "synth", "-o", str(tmp_path / "existing.txt" / "t.parquet"))
    assert "is a file, not a folder" in _error(out)
    assert "the output path is empty" in _error(libra("trace", "synth", "-o", ""))
    # a folder nothing can be created in (sysfs refuses even root): one line, exit 2, no traceback
    assert "cannot write in /sys" in _error(libra("trace", "synth", "-o", "/sys/t.parquet"))
    # a dangling link passed the check, and the run failed after its work (`File exists`)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    out = libra("simulate", "--scenario", "tiny", "--hardware", "8xA800", "--iterations", "1",
                "--policies", "greedy", "--out", str(tmp_path / "dangling"))  # fmt: skip
    assert f"is a link to {tmp_path / 'gone'}, which does not exist" in _error(out)
    assert "| policy" not in out.stdout  # refused before the run


def test_a_run_folders_files_are_not_replaced(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_lake(table_from_rows([row(reward=1.0)]), run, 1)
    lake = run / "lake" / "iteration=00001.parquet"
    before = lake.read_bytes()
    err = _error(libra("trace", "export", str(run), "-o", str(lake)))
    assert "is part of the run folder" in err and lake.read_bytes() == before
    # Another file in the run folder is fine, also again (a second export replaces the first).
    for _ in range(2):
        assert libra("trace", "export", str(run), "-o", str(run / "trace.parquet")).returncode == 0


def test_empty_policies_and_bad_ports_exit_2() -> None:
    for policies in (",", "", " , "):
        out = libra("simulate", "--scenario", "tiny", "--hardware", "8xA800", "--policies", policies)
        assert "--policies names no policy" in _error(out)
    assert "--port must be in 0..65535, got 70000" in _error(libra("serve", "--port", "70000"))


def test_errors_are_printed_as_text_not_markup(tmp_path: Path) -> None:
    # A path with brackets once crashed the printer (Rich markup) or lost its brackets.
    for name in ("q[/x]", "sp[red]"):
        out = libra("plan", "--hardware", f"16x{tmp_path / name / 'gpu.yaml'}", "--model", "qwen3-8b",
                    "--workload", "math-short")  # fmt: skip
        assert f"{name}/gpu.yaml" in _error(out).replace("\n", "")
    out = libra("simulate", "--scenario", "tiny", "--hardware", "8xA800", "--policies", "[/b]")
    assert "unknown policy '[/b]'" in _error(out)


def test_damaged_run_files_name_the_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "lake").mkdir(parents=True)
    # A Parquet file of another table in the lake: read with the lake's schema it was rows of nulls.
    pq.write_table(pa.table({"x": [1, 2]}), run / "lake" / "iteration=00001.parquet")
    err = _error(libra("trace", "export", str(run), "-o", str(tmp_path / "t.parquet")))
    assert "lake file" in err and "iteration=00001.parquet: missing columns trajectory_id" in err.replace(
        "\n", ""
    )


def test_an_empty_trace_is_not_scored(tmp_path: Path) -> None:
    from libra_core.traces.schema import TRACE_SCHEMA

    empty = tmp_path / "empty.parquet"
    pq.write_table(TRACE_SCHEMA.empty_table(), empty)
    err = _error(libra("trace-eval", "--trace", str(empty), "--buckets", "1000,4000"))
    assert "holds no trajectories; nothing to evaluate" in err


def test_libra_report_names_a_damaged_history_or_state_and_keeps_the_run_files(tmp_path: Path) -> None:
    from tests.observability.test_report import make_run

    run = make_run(tmp_path)
    history = (run / "history.parquet").read_bytes()
    err = _error(libra("report", str(run), "--out", str(run / "history.parquet")))
    assert "is part of the run folder" in err and (run / "history.parquet").read_bytes() == history
    assert libra("report", str(run), "--out", str(run / "report.html")).returncode == 0  # its own file
    (run / "state.json").write_text("{\n,")
    assert f"run state {run / 'state.json'} is damaged" in _error(libra("report", str(run))).replace("\n", "")
    pq.write_table(pa.table({"x": [1]}), run / "history.parquet")
    err = _error(libra("report", str(run))).replace("\n", "")
    assert f"run history {run / 'history.parquet'}: missing columns iteration" in err


def test_a_seed_given_to_a_trace_replay_is_said_to_do_nothing(tmp_path: Path) -> None:
    trace = _synth(tmp_path)
    out = libra("simulate", "--scenario", str(trace), "--hardware", "8xH100", "--iterations", "1",
                "--policies", "greedy", "--seed", "3")  # fmt: skip
    assert out.returncode == 0 and "--seed 3 has no effect on a trace replay" in out.stderr


def test_a_name_too_long_for_the_temp_file_is_refused_before_the_work(tmp_path: Path) -> None:
    # 245 bytes fit the file system's 255, but not atomic_path's `.NAME.tmp-PID-HEX`: the write
    # failed with an OSError traceback after the trace was generated
    name = "a" * 237 + ".parquet"
    err = _error(libra("trace", "synth", "-o", str(tmp_path / name)))
    assert f"the name is 245 bytes; at most {255 - 26} fit here" in err
    assert list(tmp_path.iterdir()) == []


def test_trace_eval_with_an_empty_json_path_is_an_error(tmp_path: Path) -> None:
    trace = _synth(tmp_path)
    err = _error(libra("trace-eval", "--trace", str(trace), "--buckets", "1000,4000", "--json", ""))
    assert "the output path is empty" in err  # was exit 0, no JSON written


def test_simulate_expands_a_tilde_in_the_trace_path(tmp_path: Path) -> None:
    _synth(tmp_path)  # tmp_path / "t.parquet", reached as ~/t.parquet with HOME=tmp_path
    out = libra(
        "simulate", "--scenario", "~/t.parquet", "--hardware", "4xA800", "--iterations", "1",
        "--policies", "colocated", env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr  # was: trace file ~/t.parquet does not exist
    assert "colocated" in out.stdout


def test_input_paths_given_as_flag_equals_tilde_are_expanded(tmp_path: Path) -> None:
    # a shell leaves `--x=~/y` alone: the commands looked for `./~/y`
    _synth(tmp_path)  # tmp_path / "t.parquet"
    env = {"HOME": str(tmp_path)}
    out = libra("trace-eval", "--trace=~/t.parquet", "--buckets", "1000,4000", env=env)
    assert out.returncode == 0, out.stderr  # was: trace file ~/t.parquet does not exist
    out = libra("plan", "--hardware", "8xA800", "--model", "qwen3-8b", "--workload=~/t.parquet", env=env)
    assert "workload t: 256 traj/iter" in out.stdout, out.stderr  # was: trace file '~/t.parquet' not found
    err = _error(libra("run", "--resume=~/no-run", env=env))
    assert f"--resume {tmp_path / 'no-run'}: not a run folder" in err


def test_validate_and_run_refuse_what_this_machine_cannot_run(tmp_path: Path) -> None:
    # both passed `libra config validate`; `libra run` made a run folder and failed in
    # prepare-policy with Prefect tracebacks (exit 1)
    missing = ["--set", "environment={type: code, files: [code/nope.jsonl]}"]
    for command in (["config", "validate"], ["run"]):
        out = libra(*command, "--set", f"experiment.output_dir={tmp_path / 'runs'}", *missing)
        assert "dataset file 'code/nope.jsonl' not found under data_dir" in _error(out)
    assert not (tmp_path / "runs").exists()
    # an hf_local model folder that does not exist: `validate` said ok, `libra run` made a run
    # folder and failed in prepare-policy with a Prefect traceback
    out = libra("config", "validate", "--set", f"model={{type: hf_local, path: {tmp_path / 'nope'}}}")
    assert f"model.path '{tmp_path / 'nope'}' is not a Hugging Face model folder" in _error(out)
    # an output folder under a file: validate said ok, run and serve refused it
    (tmp_path / "afile").write_text("x")
    out = libra("config", "validate", "--set", f"experiment.output_dir={tmp_path / 'afile' / 'runs'}")
    assert f"experiment.output_dir: {tmp_path / 'afile' / 'runs'}:" in _error(out)
    assert "is a file" in out.stderr
    # `libra serve` runs the config on this machine too: refused before any server is contacted
    out = libra("serve", "--api-url", "http://127.0.0.1:9/api", *missing)
    assert "dataset file 'code/nope.jsonl' not found under data_dir" in _error(out)
    from libra_core.model.policy import vllm_is_cpu_build

    if vllm_is_cpu_build():  # GPU builds take other head sizes
        out = libra("config", "validate", "--set", "model.head_dim=16", "--set", "model.hidden_size=64")
        assert "model.head_dim 16: vLLM's CPU attention supports head sizes" in _error(out)
