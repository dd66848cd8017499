"""A replacement instance takes the next port after the ones started before it (pools/rollout.py):
past 65535 the pool refuses with an error naming `base_port`, not bind()'s raw OverflowError."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config.models import VllmEngineConfig
from libra_core.pools.rollout import RolloutPool
from libra_core.rollout.vllm_server import EngineStartError


def _pool(tmp_path: Path, base_port: int) -> RolloutPool:
    engine = VllmEngineConfig(base_port=base_port)
    return RolloutPool("ports", tmp_path, engine, tmp_path, max_model_len=64, dtype="float32")


def test_a_replacement_past_port_65535_is_refused_naming_base_port(tmp_path: Path) -> None:
    pool = _pool(tmp_path, 65534)
    pool._next_index = 2  # two instances started on 65534 and 65535; a replacement would take 65536
    with pytest.raises(EngineStartError, match=r"port 65536: rollout\.engine\.base_port 65534 \+ 2"):
        pool.resize(1)
    assert pool.servers == [] and pool._next_index == 3  # nothing started, nothing left to stop


def test_the_last_port_is_still_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """65535 itself is a valid port: the guard refuses only past it (the start is cut short here by
    a stand-in server, so no engine runs)."""
    ports: list[int] = []

    class Stop(Exception):
        pass

    def fake_server(iid, start_dir, engine, log, max_len, dtype, port, cpu_slot):  # noqa: ANN001
        ports.append(port)
        raise Stop

    monkeypatch.setattr("libra_core.pools.rollout.VllmServer", fake_server)
    pool = _pool(tmp_path, 65534)
    pool._next_index = 1
    with pytest.raises(Stop):
        pool.resize(1)
    assert ports == [65535]
