"""What a replacement engine serves, which cores it binds, and what its start blocks.

The engines are fake_vllm_server.py (each reports the `version.txt` of the folder it loaded, and
reloads it on a weight sync); the pool, the server wrapper and the client are the real ones."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from libra_core.config.models import VllmEngineConfig
from libra_core.pools import rollout
from libra_core.rollout.client import EngineClient
from tests.rollout.fake_vllm import FakeVllmServer

POOL = "rollout:replacements"


def _write_version(policy: Path, version: str) -> None:
    """As the trainer writes the weights: a temp file renamed over the old one."""
    tmp = policy / ".version.txt.tmp"
    tmp.write_text(version)
    tmp.rename(policy / "version.txt")


def _get(url: str, path: str) -> str:
    return httpx.get(f"{url}{path}", trust_env=False, timeout=5).text


def _crash(pool_id: str, index: int) -> None:
    server = rollout._POOLS[pool_id].servers[index]
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _write_version(folder, "v0")
    return folder


@pytest.fixture
def pool(tmp_path: Path, policy: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[rollout.PoolInfo]:
    monkeypatch.setattr(rollout, "VllmServer", FakeVllmServer)
    engine = VllmEngineConfig(startup_timeout_s=30, request_timeout_s=10)
    info = rollout.ensure_rollout_pool(
        POOL, policy, engine, tmp_path / "logs", size=2, max_model_len=64, dtype="float32", version=0
    )
    yield info
    rollout.stop_rollout_pool(POOL)


def test_a_replacement_started_before_the_sync_serves_the_served_version(
    pool: rollout.PoolInfo, policy: Path, tmp_path: Path
) -> None:
    """Async pipeline: the update of iteration i has written v1 to the policy folder while the
    rollout of i+1 runs on v0, and an engine crashes. Its replacement loaded v1, and the agent loop
    labelled its tokens v0 (the pool's served version) beside instances really serving v0."""
    _write_version(policy, "v1")  # the update; its sync has not run
    _crash(POOL, 0)
    live = rollout.live_pool(POOL)  # the rollout task's retry
    assert live.urls[0] == pool.urls[1] and live.urls[1] not in pool.urls
    assert rollout.served_version(POOL) == 0
    assert [_get(url, "/served") for url in live.urls] == ["v0", "v0"]
    # the sync: every instance reloads the folder, then the pool serves v1
    for url in rollout.live_pool(POOL).urls:
        EngineClient(url, timeout_s=10).swap_weights(str(policy))
    rollout.set_served_version(POOL, 1)
    assert [_get(url, "/served") for url in live.urls] == ["v1", "v1"]
    # a replacement after the sync loads v1, from the folder itself
    _crash(POOL, 1)
    after = rollout.live_pool(POOL)
    assert [_get(url, "/served") for url in after.urls] == ["v1", "v1"]
    assert rollout._POOLS[POOL].servers[1].model_dir == policy
    kept = list((tmp_path / "logs" / "engines").glob("served-policy-*"))
    assert len(kept) == 1 and (kept[0] / "version.txt").read_text() == "v1"  # the v0 copy is gone
    rollout.stop_rollout_pool(POOL)
    assert list((tmp_path / "logs" / "engines").glob("served-policy-*")) == []


def test_an_engine_that_joined_during_a_sync_is_reloaded_when_the_sync_ends(
    pool: rollout.PoolInfo, policy: Path
) -> None:
    """The sync lists the pool's URLs, then reloads them; an engine that replaced one in between
    (a rollout retry) started from the v0 copy and missed the reload: `set_served_version` reloads
    it, and only it."""
    _write_version(policy, "v1")
    listed = rollout.live_pool(POOL).urls  # the sync's list
    for url in listed:
        EngineClient(url, timeout_s=10).swap_weights(str(policy))
    rollout.mark_unresponsive(POOL, listed[1])  # meanwhile the rollout's retry replaces an engine
    live = rollout.live_pool(POOL)
    assert live.urls[0] == listed[0] and live.urls[1] not in listed
    assert _get(live.urls[1], "/served") == "v0"
    rollout.set_served_version(POOL, 1)
    assert [_get(url, "/served") for url in live.urls] == ["v1", "v1"]
    assert [_get(url, "/reloads") for url in live.urls] == ["1", "1"]  # no second reload of the first


def test_each_instance_binds_its_own_cores_and_a_replacement_takes_the_freed_ones(
    tmp_path: Path, policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `cpu_threads` set (async mode sets it), every instance was bound to cores 0..n-1."""
    monkeypatch.setattr(rollout, "VllmServer", FakeVllmServer)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6})

    def binding(server: rollout.VllmServer) -> str:
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        return env["VLLM_CPU_OMP_THREADS_BIND"]

    engine = VllmEngineConfig(cpu_threads=1, startup_timeout_s=30)
    try:
        rollout.ensure_rollout_pool(
            POOL, policy, engine, tmp_path / "logs", size=2, max_model_len=64, dtype="float32"
        )
        servers = rollout._POOLS[POOL].servers
        assert [binding(s) for s in servers] == ["4", "5"]
        _crash(POOL, 0)
        rollout.live_pool(POOL)
        assert [binding(s) for s in rollout._POOLS[POOL].servers] == ["5", "4"]
        rollout.ensure_rollout_pool(
            POOL, policy, engine, tmp_path / "logs", size=4, max_model_len=64, dtype="float32"
        )
        assert [binding(s) for s in rollout._POOLS[POOL].servers] == ["5", "4", "6", "nobind"]
    finally:
        rollout.stop_rollout_pool(POOL)


def test_replacing_an_engine_does_not_hold_the_lock_other_pool_calls_take(
    pool: rollout.PoolInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`live_pool` stopped the dead engine (up to 15 s for a group that ignores SIGTERM) and started
    its replacement under the module lock, so marking an engine unresponsive, or any call on
    another pool, waited for all of it."""
    real_stop = FakeVllmServer.stop

    def slow_stop(self: FakeVllmServer, timeout_s: float = 15.0) -> None:
        time.sleep(2.0)
        real_stop(self, timeout_s)

    monkeypatch.setattr(FakeVllmServer, "stop", slow_stop)
    _crash(POOL, 0)
    replacing = threading.Thread(target=rollout.live_pool, args=(POOL,))
    replacing.start()
    try:
        time.sleep(0.5)
        start = time.monotonic()
        rollout.mark_unresponsive(POOL, pool.urls[1])
        assert rollout.served_version(POOL) == 0
        assert time.monotonic() - start < 0.5
        assert replacing.is_alive()  # still replacing
    finally:
        replacing.join()
    assert rollout._POOLS[POOL].unresponsive == {pool.urls[1]}
