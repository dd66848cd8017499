"""The addresses `libra serve` listens on and prints: a free port in the address family of `--host`
(`--host ::1 --port 0` crashed: it bound an IPv4 socket), and IPv6 literals in brackets in every URL
it builds (`http://::1:4200` is no URL)."""

from __future__ import annotations

import http.server
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import flows.prefect_server as ps
from tests.support import start_serve


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(
    not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback: ::1 cannot be bound"
)


def test_urls_bracket_ipv6_literals_only() -> None:
    assert ps.http_url("127.0.0.1", 4200) == "http://127.0.0.1:4200"
    assert ps.http_url("localhost", 80) == "http://localhost:80"
    assert ps.http_url("::1", 4200) == "http://[::1]:4200"
    assert ps.http_url("[::1]", 4200) == "http://[::1]:4200"  # already bracketed: not twice
    assert ps.http_url("fd00::2", 1) == "http://[fd00::2]:1"


def test_free_port_on_ipv4_is_bindable() -> None:
    port = ps.free_port("127.0.0.1")
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


@needs_ipv6
def test_free_port_on_ipv6_is_bindable() -> None:
    port = ps.free_port("::1")  # an IPv4 socket cannot bind ::1: this raised
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", port))


def test_free_port_on_a_name_that_does_not_resolve_raises_oserror() -> None:
    with pytest.raises(OSError):
        ps.free_port("no-such-host.invalid")


@pytest.fixture
def ipv6_health_api() -> Iterator[int]:
    """A port on ::1 whose `/api/health` answers 200, as a running Prefect server's does."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Server6(http.server.HTTPServer):
        address_family = socket.AF_INET6

    srv = Server6(("::1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


@needs_ipv6
def test_start_server_on_ipv6_checks_and_names_a_bracketed_url(ipv6_health_api: int, tmp_path: Path) -> None:
    port = ipv6_health_api
    assert ps.api_healthy(f"http://[::1]:{port}/api")
    with pytest.raises(RuntimeError) as err:
        ps.start_server("::1", port, tmp_path / "server.log")
    assert str(err.value) == (
        f"something already answers on http://[::1]:{port}; pass --api-url http://[::1]:{port}/api to use it"
    )


@needs_ipv6
def test_serve_on_ipv6_port_0_picks_a_port_and_prints_a_bracketed_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signal_handlers: None
) -> None:
    from flows.cli import main

    asked: list[tuple[str, int]] = []

    def start_server(host: str, port: int, log_path: Path, timeout_s: float = 90.0) -> object:
        asked.append((host, port))
        raise RuntimeError("not started: this test stops here")

    monkeypatch.setattr(ps, "start_server", start_server)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    code = main(["serve", "--host", "::1", "--port", "0", "--set", f"experiment.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 1 and "not started: this test stops here" in err
    ((host, port),) = asked
    assert host == "::1" and 0 < port < 65536
    assert f"starting Prefect server on http://[::1]:{port} " in err.replace("\n", " ")


def test_serve_on_a_host_that_does_not_resolve_exits_1_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, signal_handlers: None
) -> None:
    from flows.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    code = main(
        [
            "serve",
            "--host",
            "no-such-host.invalid",
            "--port",
            "0",
            "--set",
            f"experiment.output_dir={tmp_path}",
        ]
    )
    assert code == 1
    assert "--host no-such-host.invalid: no free port to listen on" in capsys.readouterr().err


@pytest.mark.slow
@needs_ipv6
def test_libra_serve_on_ipv6_port_0_serves_its_ui(tmp_path: Path) -> None:
    """The command the audit found crashing, end to end: a real Prefect server on ::1."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = tmp_path / "serve.log"
    overrides = [f"experiment.output_dir={tmp_path / 'runs'}", "schedule.active=false"]
    proc = start_serve(["--host", "::1", "--port", "0"], overrides, log, env)
    try:
        deadline = time.monotonic() + 180
        while not (found := re.search(r"Prefect UI: (http://\[::1\]:\d+)\n", log.read_text())):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert ps.api_healthy(f"{found[1]}/api"), log.read_text()
    finally:
        proc.terminate()  # stops serving and the Prefect server it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log.read_text()
