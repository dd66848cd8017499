"""A local-pool worker whose driver is killed outright exits at once, even in the middle of a call.

Without it, a worker busy in a long update finishes the call and writes its results into the run
folder after its driver died (SIGKILL 30 s after a cancel, an OOM kill), while a resumed run may
already work there. The driver and the worker here are real processes; the driver is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_core.pools.local import DRIVER_POLL_S

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

CALL_S = 6.0

HELPER = (
    "import pathlib, time\n"
    "def long_call(marker, seconds):\n"
    "    pathlib.Path(marker + '.started').write_text('x')\n"
    "    time.sleep(seconds)\n"
    "    pathlib.Path(marker + '.finished').write_text('x')\n"
)

DRIVER = (
    "import sys, threading, time\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import orphan_helper\n"
    "from libra_core.config.pools import LocalPoolConfig\n"
    "from libra_core.pools.local import LocalPool\n"
    "pool = LocalPool(LocalPoolConfig(start_method=sys.argv[4]))\n"
    "pool.start(1)\n"
    "wid = pool.worker_ids[0]\n"
    "args = (wid, orphan_helper.long_call, sys.argv[2], float(sys.argv[3]))\n"
    "threading.Thread(target=pool.run, args=args, daemon=True).start()\n"
    "print(pool.health()[wid].pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_worker_exits_mid_call_when_its_driver_is_killed(tmp_path: Path, start_method: str) -> None:
    (tmp_path / "orphan_helper.py").write_text(HELPER)
    marker = str(tmp_path / "call")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), marker, str(CALL_S), start_method],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker_pid = 0
    try:
        assert driver.stdout is not None
        worker_pid = int(driver.stdout.readline())
        deadline = time.monotonic() + 30
        while not Path(marker + ".started").exists():
            assert time.monotonic() < deadline, "the worker never started the call"
            time.sleep(0.05)
        assert _running(worker_pid)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        killed_at = time.monotonic()
        while _running(worker_pid) and time.monotonic() - killed_at < 10 * DRIVER_POLL_S + 2:
            time.sleep(0.05)
        assert not _running(worker_pid), "the worker outlived its driver"
        assert time.monotonic() - killed_at < CALL_S  # it did not wait for the call to end
        time.sleep(CALL_S + 1 - (time.monotonic() - killed_at))
        assert not Path(marker + ".finished").exists(), "the orphaned call ran to its end"
    finally:
        if driver.poll() is None:
            driver.kill()
        if worker_pid and _running(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)
