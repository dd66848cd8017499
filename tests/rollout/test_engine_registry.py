"""Engines orphaned by a killed process are stopped by the next one; nothing else is touched.

The "engines" here are real process groups shaped like a vLLM server (a session leader with a child
in its group, as the API server and its engine core); the owner is a real process killed with
SIGKILL, as Prefect's runner does 30 s after a cancel's SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libra_core.rollout import engine_registry
from libra_core.rollout.engine_registry import process_start, reap_orphans, record

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

# A session leader that starts a child in its group and prints both pids, then sleeps.
ENGINE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)
# The owner: starts an engine in its own session, records it, says so, sleeps.
OWNER = (
    "import subprocess, sys, time\n"
    "from pathlib import Path\n"
    "from libra_core.rollout.engine_registry import record\n"
    "engine = subprocess.Popen([sys.executable, '-c', sys.argv[2]], stdout=subprocess.PIPE,\n"
    "                          start_new_session=True, text=True)\n"
    "child = int(engine.stdout.readline())\n"
    "record(Path(sys.argv[1]), 'pool-0', engine.pid)\n"
    "print(engine.pid, child, flush=True)\n"
    "time.sleep(600)\n"
)


def group(pgid: int) -> list[int]:
    return engine_registry.group_members(pgid)


def gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(process_start(p) is None for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def killed_owner(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """An owner that recorded an engine and was then SIGKILLed: (pid folder, leader pid, child pid)."""
    folder = tmp_path / "engines"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(folder), ENGINE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert owner.stdout is not None
    leader, child = (int(x) for x in owner.stdout.readline().split())
    owner.kill()
    owner.wait()
    try:
        yield folder, leader, child
    finally:
        for pid in group(leader):  # whatever a failed test left of the engine, and only that
            os.kill(pid, signal.SIGKILL)


def test_engines_of_a_killed_owner_are_stopped(killed_owner: tuple[Path, int, int]) -> None:
    folder, leader, child = killed_owner
    assert sorted(group(leader)) == sorted([leader, child])  # the kill left both running
    assert reap_orphans(folder) == ["pool-0"]
    assert gone([leader, child]) and group(leader) == []
    assert list(folder.iterdir()) == []
    assert reap_orphans(folder) == []  # nothing left to do


def test_a_leaderless_group_is_stopped(killed_owner: tuple[Path, int, int]) -> None:
    """The API server died and its engine core still runs in the group."""
    folder, leader, child = killed_owner
    os.kill(leader, signal.SIGKILL)
    assert gone([leader])
    assert group(leader) == [child]
    assert reap_orphans(folder) == ["pool-0"]
    assert gone([child])


def test_engines_of_a_live_owner_are_left_alone(tmp_path: Path) -> None:
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    try:
        assert engine.stdout is not None
        child = int(engine.stdout.readline())
        path = record(tmp_path, "pool-0", engine.pid)
        assert path is not None and json.loads(path.read_text())["owner"] == os.getpid()
        assert reap_orphans(tmp_path) == []
        assert sorted(group(engine.pid)) == sorted([engine.pid, child]) and path.exists()
        engine_registry.forget(tmp_path, "pool-0")
        assert not path.exists()
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


def test_a_recycled_pid_is_not_signalled(tmp_path: Path) -> None:
    """A file naming this very process (pid reused since) with another start time and a dead owner:
    the reaper must not signal it; a signal to this group would end the test run."""
    me = os.getpid()
    start = process_start(me)
    assert start is not None
    entry = {"instance_id": "pool-3", "pid": me, "pid_start": start - 1, "owner": 2**22 + 7, "owner_start": 1}
    (tmp_path / "pool-3.pid").write_text(json.dumps(entry))
    assert reap_orphans(tmp_path) == []
    assert not (tmp_path / "pool-3.pid").exists()  # stale: removed


def test_unreadable_and_stale_files_are_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "pool-1.pid").write_text("{not json")
    (tmp_path / "pool-2.pid").write_text(json.dumps({"instance_id": "pool-2"}))
    assert reap_orphans(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    assert "unreadable engine pid file" in caplog.text and "pool-1.pid" in caplog.text
    assert reap_orphans(tmp_path / "missing") == []


def test_two_writers_of_one_pid_file_do_not_share_a_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A has written its temp file and is about to rename it when writer B records the same
    instance: with one fixed temp name, B overwrote A's temp file and renamed it away, and A's
    rename failed (FileNotFoundError)."""
    a_renaming, b_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if threading.current_thread().name == "writer-a":
            a_renaming.set()
            assert b_done.wait(timeout=30)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)

    def writer_a() -> None:
        try:
            record(tmp_path, "pool-0", os.getpid())
        except BaseException as err:  # reported by the test thread
            errors.append(err)
            a_renaming.set()

    a = threading.Thread(target=writer_a, name="writer-a")
    a.start()
    assert a_renaming.wait(timeout=30)
    try:
        record(tmp_path, "pool-0", os.getppid())
    finally:
        b_done.set()
        a.join(timeout=30)
    assert errors == []
    entry = json.loads((tmp_path / "pool-0.pid").read_text())
    assert entry["pid"] == os.getpid()  # A renamed last: its whole file
    assert [p.name for p in tmp_path.iterdir()] == ["pool-0.pid"]
