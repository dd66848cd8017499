"""What the `libra` commands say on a bad argument: `error: ...` naming the flag or path and what is
wrong with it, exit 2 (docs/architecture.md, "Bad input and written files")."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.test_cli import libra


def _error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: "), out.stderr
    return out.stderr.replace("\n", "")


def test_simulate_refuses_a_negative_seed(tmp_path: Path) -> None:
    out = libra("simulate", "--scenario", "tiny", "--hardware", "8xA800", "--iterations", "1",
                "--policies", "greedy", "--seed", "-1", "--out", str(tmp_path / "sim"))  # fmt: skip
    assert "--seed must be >= 0, got -1" in _error(out) and not (tmp_path / "sim").exists()


def test_trace_synth_refuses_a_negative_seed(tmp_path: Path) -> None:
    out = libra("trace", "synth", "--seed", "-5", "-o", str(tmp_path / "t.parquet"))
    assert "--seed must be >= 0, got -5" in _error(out) and not (tmp_path / "t.parquet").exists()
    assert libra("trace", "synth", "--seed", "0", "-o", str(tmp_path / "t.parquet")).returncode == 0


def test_resume_refusals_print_error_like_every_command(tmp_path: Path) -> None:
    err = _error(libra("run", "--resume", str(tmp_path / "missing")))
    assert f"--resume {tmp_path / 'missing'}: not a run folder (no config.resolved.yaml)" in err
    err = _error(libra("run", "stages.yaml", "--resume", str(tmp_path)))
    assert "continues with the run's own config; drop stages.yaml" in err


def test_report_on_a_file_says_it_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "stages.yaml").write_text("experiment: {}\n")
    assert f"{tmp_path / 'stages.yaml'}: is not a folder" in _error(
        libra("report", str(tmp_path / "stages.yaml"))
    )
    assert f"{tmp_path / 'absent'}: no such folder" in _error(libra("report", str(tmp_path / "absent")))


def test_trace_eval_on_a_folder_says_it_is_a_folder(tmp_path: Path) -> None:
    err = _error(libra("trace-eval", "--trace", str(tmp_path), "--buckets", "54"))
    assert f"--trace {tmp_path}: is a folder, not a file" in err


def test_plan_help_says_what_its_exit_status_means() -> None:
    out = libra("plan", "--help")
    assert out.returncode == 0
    assert "1 when no plan fits the cluster" in " ".join(out.stdout.split())
    out = libra("plan", "--hardware", "1xA800", "--model", "qwen3-14b", "--workload", "swe-longtail")
    assert out.returncode == 1 and "no feasible plan" in out.stdout  # what the help says
