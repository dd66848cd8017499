"""The `libra` CLI as a user runs it (subprocess): exit codes and messages, no tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def libra(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`libra ARGS` in a subprocess with a bare environment (plus `env`)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_validate_default_file_ok() -> None:
    out = libra("config", "validate", "stages.yaml")
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stdout


def test_validate_writes_nothing(tmp_path: Path) -> None:
    # it checked experiment.output_dir by creating it (until 2026-12-07)
    out = libra("config", "validate", "--set", f"experiment.output_dir={tmp_path / 'made' / 'here'}")
    assert out.returncode == 0, out.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    out = libra("config", "validate", "--set", f"experiment.output_dir={tmp_path / 'file' / 'runs'}")
    assert out.returncode == 2 and "experiment.output_dir" in out.stderr  # still checked


def test_validate_prints_a_path_with_brackets_as_it_is(tmp_path: Path) -> None:
    odd = tmp_path / "m[" / "x]" / "stages.yaml"  # rich markup would read `[/x]` as a closing tag
    odd.parent.mkdir(parents=True)
    odd.write_text(Path("stages.yaml").read_text())
    out = libra("config", "validate", str(odd))
    assert out.returncode == 0 and f"ok: {odd} is valid" in out.stdout, out.stderr


def test_validate_names_each_problem_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment:\n  iterations: many\n  colour: red\nstages:\n  rollout:\n    size: -3\n")
    out = libra("config", "validate", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "invalid configuration (3 problem(s))" in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(str(bad))]
    assert len(lines) == 3
    assert any("experiment.colour: unknown key" in ln for ln in lines)
    assert any("experiment.iterations:" in ln and "'many'" in ln for ln in lines)
    assert any("stages.rollout.size:" in ln and "-3" in ln for ln in lines)


def test_set_override_applies_and_is_checked() -> None:
    out = libra("config", "show", "stages.yaml", "--set", "experiment.iterations=2")
    assert out.returncode == 0
    assert "iterations: 2" in out.stdout
    out = libra("config", "validate", "stages.yaml", "--set", "rollout.temperature=-1")
    assert out.returncode == 2 and "rollout.temperature" in out.stderr


def test_run_with_bad_config_fails_before_starting(tmp_path: Path) -> None:
    out = libra(
        "run", "stages.yaml", "--set", "stages.update.size=0", "--set", f"experiment.output_dir={tmp_path}"
    )
    assert out.returncode == 2
    assert "stages.update.size" in out.stderr
    assert not any(tmp_path.iterdir())  # nothing was created


def test_resume_with_a_bad_override_or_a_damaged_config_fails_before_starting(tmp_path: Path) -> None:
    from libra_core.config import load_config, write_resolved_config

    run = tmp_path / "run"
    resolved = write_resolved_config(load_config(None), run)
    before = resolved.read_text()
    out = libra("run", "--resume", str(run), "--set", "experiment.iterations=abc")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "invalid configuration" in out.stderr and "experiment.iterations" in out.stderr
    assert resolved.read_text() == before and sorted(p.name for p in run.iterdir()) == [resolved.name]
    out = libra("run", "stages.yaml", "--resume", str(run))  # a second config would be ignored
    assert out.returncode == 2 and "continues with the run's own config; drop stages.yaml" in out.stderr
    resolved.write_text("experiment: [unclosed\n")
    out = libra("run", "--resume", str(run))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "invalid YAML" in out.stderr


def test_resume_refusals_exit_2_before_prefect_starts(tmp_path: Path) -> None:
    from libra_core.config import load_config, write_resolved_config
    from libra_core.pipeline.run_lock import lock_run, unlock_run

    run = tmp_path / "run"
    write_resolved_config(load_config(None), run)
    out = libra("run", "--resume", str(run), "--set", "model.num_layers=8")
    assert out.returncode == 2 and "model.num_layers cannot change on resume" in out.stderr.replace("\n", "")
    lock_run(run)  # this process runs it
    try:
        out = libra("run", "--resume", str(run))
        assert out.returncode == 2 and "is in use by process" in out.stderr
    finally:
        unlock_run(run)
    (tmp_path / "afile").write_text("")
    out = libra("run", "--set", f"experiment.output_dir={tmp_path / 'afile' / 'runs'}")
    assert out.returncode == 2 and "experiment.output_dir:" in out.stderr and "is a file" in out.stderr


def test_validate_resolves_the_planners_names_and_spec_files(tmp_path: Path) -> None:
    # Pure validation cannot read a spec file; `config validate` (and `run`, before it starts) does.
    (tmp_path / "gpu.yaml").write_text("base: H100\nhbm_gbps: 0\n")
    args = ("config", "validate", "stages.yaml", "--set", "planner.type=libra")
    assert libra(*args).returncode == 0
    out = libra(
        *args, "--set", "planner.model_spec=nonsense", "--set", f"planner.hardware=8x{tmp_path / 'gpu.yaml'}",
        "--set", "planner.initial_workload=zzz",
    )  # fmt: skip
    assert out.returncode == 2 and "invalid configuration (3 problem(s))" in out.stderr
    assert "stages.yaml: planner.model_spec: unknown model 'nonsense'" in out.stderr
    assert "stages.yaml: planner.hardware: hardware file" in out.stderr and "hbm_gbps" in out.stderr
    assert "stages.yaml: planner.initial_workload: unknown workload preset 'zzz'" in out.stderr
    # The static planner does not use them, so they are not resolved.
    assert libra("config", "validate", "stages.yaml", "--set", "planner.model_spec=nonsense").returncode == 0


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    out = libra("config", "validate", str(tmp_path / "absent.yaml"))
    assert out.returncode == 2 and "absent.yaml" in out.stderr and "Traceback" not in out.stderr


def test_serve_with_a_bad_config_or_an_unreachable_server_exits_cleanly() -> None:
    from flows.prefect_server import free_port

    out = libra("serve", "--set", "schedule.cron=every night")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "schedule.cron: must have 5 fields" in out.stderr

    dead = f"http://127.0.0.1:{free_port()}/api"
    out = libra("serve", "--api-url", dead)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"no Prefect server answers at {dead}" in out.stderr


def test_a_reader_that_goes_away_is_no_error() -> None:
    # `libra plan --top 20 | head -1`: a BrokenPipeError traceback and exit 1 (until 2026-12-07).
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "config", "show"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before it writes a byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err[-2000:]
    assert "Traceback" not in err and "BrokenPipe" not in err
