"""User values in what the CLI prints (paths, URLs, names from files) are shown as text, never read
as Rich markup: `[red]` in a path is not eaten, and `[/x]` cannot crash the printer."""

from __future__ import annotations

import io
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.cli.test_cli import ROOT, libra
from tests.observability.test_report import make_run

ODD = ("runs[red]", "serve[/x]")  # a style tag that would vanish, a closing tag that would raise


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """`libra run` and `libra serve` install SIGINT/SIGTERM handlers: not in the test process."""
    monkeypatch.setattr(signal, "signal", lambda *args: None)


@pytest.mark.parametrize("name", ODD)
def test_run_summary_prints_the_run_folder_as_it_is(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows import progress_view

    run = make_run(tmp_path / name)
    buf = io.StringIO()
    monkeypatch.setattr(progress_view, "console", Console(file=buf, width=1000))
    progress_view.print_summary(str(run), 12.0)
    assert f"run folder: {run}  (wall 12s)" in buf.getvalue()


@pytest.mark.parametrize("name", ODD)
def test_serve_prints_the_server_log_path_as_it_is(
    tmp_path: Path,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_signals: None,
) -> None:
    from flows import cli, prefect_server

    def not_started(host: str, port: int, log: Path) -> None:
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(prefect_server, "start_server", not_started)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "1000")
    out_dir = tmp_path / name
    rc = cli.main(
        ["serve", str(ROOT / "stages.yaml"), "--set", f"experiment.output_dir={out_dir}", "--port", "4999"]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "error: not started in this test" in err
    assert f"(log: {out_dir / '.prefect-server.log'}) ..." in err


def test_run_prints_the_prefect_api_url_as_it_is(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_signals: None,
) -> None:
    from flows import cli, prefect_server, progress_view

    url = "http://[fd00::1]:4200/api"  # an IPv6 literal starting with a letter reads as a tag
    message = f"Prefect server at {url} is not reachable; running with an ephemeral Prefect API instead"
    monkeypatch.setattr(prefect_server, "choose_api_for_run", lambda: message)
    monkeypatch.setattr(progress_view, "run_with_progress", lambda *args: 0)
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "WARNING")  # restored after: _cmd_run sets these
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.setenv("COLUMNS", "1000")
    rc = cli.main(["run", str(ROOT / "stages.yaml"), "--set", f"experiment.output_dir={tmp_path}"])
    assert rc == 0 and message in capsys.readouterr().err
    # one line on a narrow terminal too: it was wrapped at 80 columns, mid-sentence
    monkeypatch.setenv("COLUMNS", "60")
    rc = cli.main(["run", str(ROOT / "stages.yaml"), "--set", f"experiment.output_dir={tmp_path}"])
    assert rc == 0 and message in capsys.readouterr().err


def _on_a_terminal(cwd: Path, *args: str) -> str:
    """`libra ARGS` in `cwd` with stdout on a pseudo-terminal (the commands print Rich tables
    there), the output without its colour codes."""
    leader, follower = pty.openpty()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "300", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args], cwd=cwd, stdout=follower, stderr=subprocess.PIPE, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower's last holder closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) in (0, 1), proc.stderr.read() if proc.stderr else ""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())


def _odd_trace(folder: Path) -> str:
    trace = "t[red].parquet"  # relative: a table's title wraps at the table's width
    assert libra("trace", "synth", "-o", trace, cwd=folder).returncode == 0
    return trace


def test_trace_eval_table_shows_the_trace_path_as_it_is(tmp_path: Path) -> None:
    trace = _odd_trace(tmp_path)
    out = _on_a_terminal(
        tmp_path, "trace-eval", "--trace", trace, "--buckets", "54,64", "--scheduler", "static"
    )
    assert "t[red].parquet (buckets 54,64)" in out and "static *" in out


def test_plan_table_shows_the_workload_name_as_it_is(tmp_path: Path) -> None:
    trace = _odd_trace(tmp_path)
    out = _on_a_terminal(
        tmp_path, "plan", "--hardware", "16xA800", "--model", "qwen3-8b", "--workload", trace
    )
    assert "16xA800-80G · qwen3-8b · t[red] (mean" in out


def test_run_cancelled_from_the_ui_exits_130_with_a_resume_hint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_signals: None,
) -> None:
    from prefect.exceptions import CancelledRun

    from flows import cli, prefect_server, progress_view, rl_experiment

    def cancelled(*args: object) -> int:  # what calling rl_experiment does when it ends CANCELLED
        rl_experiment.started_runs.append(str(tmp_path / "run-1"))
        raise CancelledRun("Cancelled from iteration-2")

    monkeypatch.setattr(prefect_server, "choose_api_for_run", lambda: None)
    monkeypatch.setattr(progress_view, "run_with_progress", cancelled)
    monkeypatch.setattr(rl_experiment, "started_runs", [])
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    rc = cli.main(["run", str(ROOT / "stages.yaml"), "--set", f"experiment.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_INTERRUPTED, err  # before: a CancelledRun traceback
    assert (
        f"run cancelled from the Prefect UI; resume it with `libra run --resume {tmp_path / 'run-1'}`" in err
    )


@pytest.mark.parametrize("made_folder", [True, False])
def test_a_failed_run_names_its_folder_and_how_to_resume_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_signals: None,
    made_folder: bool,
) -> None:
    # a failure inside the flow ended in a Python traceback that named no run folder
    from flows import cli, prefect_server, progress_view, rl_experiment

    run_dir = str(tmp_path / "run-1")
    monkeypatch.setattr(rl_experiment, "started_runs", [str(tmp_path / "an-earlier-run")])

    def failed(*args: object) -> int:
        if made_folder:
            rl_experiment.started_runs.append(run_dir)
        raise RuntimeError("the update stage ran out of memory")

    monkeypatch.setattr(prefect_server, "choose_api_for_run", lambda: None)
    monkeypatch.setattr(progress_view, "run_with_progress", failed)
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    rc = cli.main(["run", str(ROOT / "stages.yaml"), "--set", f"experiment.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "libra: run failed: RuntimeError: the update stage ran out of memory" in err
    assert (f"resume it with `libra run --resume {run_dir}`" in err) == made_folder
    assert "an-earlier-run" not in err
