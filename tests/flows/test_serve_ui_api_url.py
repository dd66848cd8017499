"""What `libra serve` tells the Prefect UI about where its API is, and what it checks before it starts
a server: a PREFECT_UI_API_URL the user exported (Prefect's setting for a server reached from
another machine) is theirs, a wildcard `--host` gets a hint, and an output folder that cannot be
written is the one-line exit 2 `libra run` gives (the server's log goes there: it was a traceback).
The server's process is stubbed; `start_server` and `libra serve` are the real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import flows.prefect_server as ps
from flows.cli import main


@pytest.fixture
def no_prefect_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PREFECT_API_URL", *ps.UI_API_URL_VARS):
        monkeypatch.delenv(name, raising=False)


def _server_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host: str) -> dict[str, str]:
    """The environment `start_server` gives `prefect server start` (a process that exits at once)."""
    seen: dict[str, str] = {}

    class ExitedServer:
        returncode, pid = 1, 0

        def __init__(self, cmd: list[str], env: dict[str, str], **_: Any) -> None:
            seen.update(env)

        def poll(self) -> int:
            return 1

    monkeypatch.setattr(ps.subprocess, "Popen", ExitedServer)
    with pytest.raises(RuntimeError, match="exited with code 1"):
        ps.start_server(host, ps.free_port(), tmp_path / "server.log", timeout_s=5)
    return seen


@pytest.mark.parametrize("name", ps.UI_API_URL_VARS)
def test_a_ui_api_url_the_user_exported_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_prefect_env: None, name: str
) -> None:
    monkeypatch.setenv(name, "http://gpu-box.example.org:4200/api")
    env = _server_env(monkeypatch, tmp_path, "0.0.0.0")
    assert env[name] == "http://gpu-box.example.org:4200/api"
    assert env.get("PREFECT_UI_API_URL", env[name]) == "http://gpu-box.example.org:4200/api"  # was 0.0.0.0


def test_without_one_the_ui_calls_the_address_the_server_listens_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_prefect_env: None
) -> None:
    env = _server_env(monkeypatch, tmp_path, "127.0.0.1")
    assert env["PREFECT_UI_API_URL"] == f"http://127.0.0.1:{env['PREFECT_SERVER_API_PORT']}/api"


def test_wildcard_hosts() -> None:
    assert [ps.is_wildcard_host(h) for h in ("0.0.0.0", "::", "[::]", "127.0.0.1", "::1", "gpu-box")] == [
        True, True, True, False, False, False,
    ]  # fmt: skip


def _serve_until_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str
) -> tuple[int, list[tuple[str, int]]]:
    asked: list[tuple[str, int]] = []

    def start_server(host: str, port: int, log_path: Path, timeout_s: float = 90.0) -> object:
        asked.append((host, port))
        raise RuntimeError("not started: this test stops here")

    monkeypatch.setattr(ps, "start_server", start_server)
    code = main(["serve", "--port", "0", *args])
    return code, asked


def test_serve_on_a_wildcard_host_says_how_a_remote_browser_reaches_the_api(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signal_handlers: None,
    no_prefect_env: None,
) -> None:
    code, ((_, port),) = _serve_until_start(
        monkeypatch, tmp_path, "--host", "0.0.0.0", "--set", f"experiment.output_dir={tmp_path}"
    )
    err = capsys.readouterr().err
    assert code == 1
    assert (
        f"note: the UI's pages will call the API at http://0.0.0.0:{port}/api, which a browser on another "
        f"machine cannot reach; for remote access, export PREFECT_UI_API_URL=http://HOST:{port}/api"
    ) in err


@pytest.mark.parametrize(
    ("host", "user_url"), [("127.0.0.1", None), ("0.0.0.0", "http://gpu-box.example.org:4200/api")]
)
def test_no_hint_on_a_specific_host_or_with_the_users_url(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signal_handlers: None,
    no_prefect_env: None,
    host: str,
    user_url: str | None,
) -> None:
    if user_url:
        monkeypatch.setenv("PREFECT_UI_API_URL", user_url)
    code, _ = _serve_until_start(
        monkeypatch, tmp_path, "--host", host, "--set", f"experiment.output_dir={tmp_path}"
    )
    assert code == 1 and "PREFECT_UI_API_URL" not in capsys.readouterr().err


def test_serve_refuses_an_output_dir_it_cannot_write_like_run(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signal_handlers: None,
    no_prefect_env: None,
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    bad = f"experiment.output_dir={a_file / 'runs'}"
    code, asked = _serve_until_start(monkeypatch, tmp_path, "--set", bad)
    serve_err = capsys.readouterr().err
    assert (code, asked) == (2, [])  # no server started
    assert serve_err.strip().splitlines() == [
        f"error: experiment.output_dir: {a_file / 'runs'}: {a_file} is a file, not a folder"
    ]
    assert main(["run", "--set", bad]) == 2
    assert capsys.readouterr().err == serve_err  # the same words as `libra run`
