"""An engine's process group ends with its owner, and all of it ends when part of it does.

The engine is fake_vllm_server.py (an HTTP server shaped like vLLM's, with an "engine core" child
in its process group); the server wrapper, its watchdog and the stop are the real ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from libra_core.config.models import VllmEngineConfig
from libra_core.rollout.engine_registry import group_members
from tests.rollout.fake_vllm import FakeVllmServer

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

ROOT = Path(__file__).resolve().parents[2]


def _gone_within(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_members(pgid)


def _kill_group(pgid: int) -> None:
    for pid in group_members(pgid):
        os.kill(pid, signal.SIGKILL)


@contextmanager
def _healthy_engine(tmp_path: Path) -> Iterator[FakeVllmServer]:
    """A fake engine started and healthy (the FAKE_* variables set then apply), stopped and its
    group killed afterwards."""
    srv = FakeVllmServer("w-0", tmp_path, VllmEngineConfig(startup_timeout_s=30), tmp_path / "w-0.log", 64)
    srv.start()
    assert srv.process is not None
    pgid = srv.process.pid
    try:
        srv.wait_healthy(time.monotonic() + 30)
        yield srv
    finally:
        srv.stop(timeout_s=2)
        _kill_group(pgid)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVllmServer]:
    """A healthy fake engine with an engine-core child in its group."""
    monkeypatch.setenv("FAKE_CHILD", "1")
    with _healthy_engine(tmp_path) as srv:
        yield srv


OWNER = """
import sys, time
from pathlib import Path
from libra_core.config.models import VllmEngineConfig
from tests.rollout.fake_vllm import FakeVllmServer
folder = Path(sys.argv[1])
server = FakeVllmServer("w-0", folder, VllmEngineConfig(startup_timeout_s=30), folder / "w-0.log", 64)
server.start()
server.wait_healthy(time.monotonic() + 30)
print(server.process.pid, flush=True)
time.sleep(600)
"""


def test_an_engine_stops_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """Until 2026-12-06 the engine of a run killed outright (SIGKILL, an OOM kill, a SIGHUP it did
    not handle) ran on, in its own session, until a resume of the same run folder reaped it."""
    env = {**os.environ, "FAKE_CHILD": "1"}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    assert owner.stdout is not None
    pgid = int(owner.stdout.readline())
    try:
        assert len(group_members(pgid)) >= 2  # the server and its engine core, at least
        owner.kill()
        owner.wait()
        assert _gone_within(pgid, 10), f"still running: {group_members(pgid)}"
        assert "is gone; stopping the engine" in (tmp_path / "w-0.log").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()
        _kill_group(pgid)


def test_when_the_server_exits_alone_the_rest_of_its_group_ends_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's API server crashing leaves its engine core running (its memory, its cores); the
    instance now ends as a whole, with the server's exit code."""
    monkeypatch.setenv("FAKE_EXIT_AFTER_S", "1")
    monkeypatch.setenv("FAKE_CHILD", "1")
    with _healthy_engine(tmp_path) as srv:
        assert srv.process is not None
        assert srv.process.wait(timeout=20) == 9  # the server's own code, through the watchdog
        pgid = srv.process.pid
        assert _gone_within(pgid, 5), f"still running: {group_members(pgid)}"  # the engine core too


def test_a_stop_after_the_group_leader_died_signals_the_rest_at_once(server: FakeVllmServer) -> None:
    """`terminate()` sent SIGTERM only while the leader ran, so a stop after the leader's death
    waited its full timeout (15 s, under the pool's lock) before the SIGKILL."""
    assert server.process is not None
    pgid = server.process.pid
    os.kill(pgid, signal.SIGKILL)  # the leader alone
    server.process.wait()
    assert group_members(pgid)  # the rest of the group runs on
    start = time.monotonic()
    server.stop(timeout_s=10)
    assert time.monotonic() - start < 5
    assert group_members(pgid) == []


def test_a_stop_sends_the_engine_one_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop signalled the whole group and the watchdog, which got that SIGTERM too, passed it on
    to the group: vLLM's API server had a second SIGTERM during its graceful shutdown (until
    2026-12-06). The stop now signals the watchdog alone while it runs."""
    sigterms = tmp_path / "sigterms.txt"
    monkeypatch.setenv("FAKE_SIGTERM_LOG", str(sigterms))
    with _healthy_engine(tmp_path) as srv:
        assert srv.process is not None
        pgid = srv.process.pid
        srv.stop(timeout_s=10)
        assert _gone_within(pgid, 5)
    assert len(sigterms.read_text().splitlines()) == 1
