"""The search service never outlives the process that started it, even one killed by SIGKILL
(before 2026-12-06 it did: atexit handlers do not run on SIGKILL, and the service was orphaned)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_core.envs.search_service import REPO_ROOT

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("bm25s") is None, reason="bm25s is not installed"
)

PARENT = """
import sys, time
from pathlib import Path
from libra_core.envs.search_service import SearchService
service = SearchService(Path(sys.argv[1]), latency_ms=(0.0, 0.0), max_passage_chars=100, max_top_k=3)
print(service.process.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an exited child its new parent has not reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_the_service_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    passages = tmp_path / "passages.jsonl"
    passage = {"id": "1", "title": "Nobel", "text": "The Nobel Prize in Physics."}
    passages.write_text(json.dumps(passage) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(passages)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    service_pid = None
    try:
        assert parent.stdout is not None
        service_pid = int(parent.stdout.readline())
        assert _running(service_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _running(service_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(service_pid), "the search service outlived its SIGKILLed parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        if service_pid is not None and _running(service_pid):
            os.kill(service_pid, signal.SIGKILL)  # the orphan this test started
