"""Finding the Prefect server: an unreachable PREFECT_API_URL falls back to an ephemeral API."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.prefect_server import api_healthy, choose_api_for_run, free_port, start_server
from tests.support import fake_prefect_api


def test_unreachable_server_falls_back_to_ephemeral(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # no profile naming a server
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_API_URL", dead)
    monkeypatch.delenv("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", raising=False)  # restored afterwards
    message = choose_api_for_run()
    assert message is not None and dead in message and "ephemeral" in message
    assert "(from PREFECT_API_URL)" in message
    import os

    # unset (not ""): Prefect starts its own ephemeral API and exits without service tracebacks
    assert "PREFECT_API_URL" not in os.environ
    assert os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] == "true"


def test_no_server_configured_says_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # no profiles file
    monkeypatch.chdir(tmp_path)
    assert choose_api_for_run() is None


PROFILE_RUN = """
import os, sys
sys.path.insert(0, sys.argv[1])
from flows.prefect_server import choose_api_for_run
print("MESSAGE", choose_api_for_run(), flush=True)
print("AT", os.environ["PREFECT_PROFILES_PATH"], flush=True)
print("PROFILES", repr(open(os.environ["PREFECT_PROFILES_PATH"]).read()), flush=True)
from prefect import flow

@flow
def one() -> int:
    return 1

print("RESULT", one(), flush=True)
"""


def test_a_profile_naming_a_stopped_server_falls_back_to_ephemeral(tmp_path: Path) -> None:
    """`prefect config set PREFECT_API_URL=...` writes the URL into the active profile, which the
    check (environment only) did not see: with that server stopped, `libra run` ended in Prefect's
    "Failed to reach API" traceback (until 2026-12-06)."""
    import os
    import subprocess
    import sys

    dead = f"http://127.0.0.1:{free_port()}/api"
    profiles = (
        f'active = "mine"\n\n[profiles.mine]\nPREFECT_API_URL = "{dead}"\nPREFECT_LOGGING_LEVEL = "INFO"\n'
        '\n[profiles.other]\nPREFECT_API_URL = "http://elsewhere:4200/api"\n'
    )
    (tmp_path / "profiles.toml").write_text(profiles)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(tmp_path), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", PROFILE_RUN, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Prefect server at {dead} (from the active Prefect profile or settings file)" in done.stdout
    assert "RESULT 1" in done.stdout
    # the run read a copy of the profiles without the active profile's URL (its other settings
    # kept): PREFECT_API_URL="" overrode it until 2026-12-06, and Prefect's event service then
    # logged "Service 'EventsWorker' failed" and printed tracebacks at exit
    copied = next(line for line in done.stdout.splitlines() if line.startswith("PROFILES"))
    assert '"PREFECT_LOGGING_LEVEL" = "INFO"' in copied and dead not in copied
    assert "http://elsewhere:4200/api" in copied  # another profile, as it was
    assert "EventsWorker" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "profiles.toml").read_text() == profiles  # the user's file untouched
    (copy_path,) = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("AT ")]
    assert copy_path != str(tmp_path / "profiles.toml") and not Path(copy_path).exists()  # removed at exit


def test_start_server_refuses_a_port_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_prefect_api() as api_url:
        port = int(api_url.rsplit(":", 1)[1].removesuffix("/api"))
        assert api_healthy(api_url)
        with pytest.raises(RuntimeError, match="already answers"):
            start_server("127.0.0.1", port, tmp_path / "server.log")


def test_a_failed_start_quotes_only_its_own_log_lines(tmp_path: Path) -> None:
    # The server log is appended across starts; a start that failed on port 4302 quoted an earlier
    # session's "dashboard at http://127.0.0.1:4300" above its own error (until 2026-12-07).
    from flows.prefect_server import _tail

    log = tmp_path / ".prefect-server.log"
    log.write_text("old: dashboard at http://127.0.0.1:4300\n")
    start = log.stat().st_size
    with log.open("a") as fh:
        fh.write("new: Port 4302 is already in use\n")
    assert _tail(log, start) == "new: Port 4302 is already in use"
    assert _tail(log).splitlines()[0].startswith("old:")
    assert _tail(tmp_path / "missing.log", 0) == "(no log)"
