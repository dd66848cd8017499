"""Starting an engine: checks made before any process is spawned (no vLLM needed)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from libra_core.config.models import RolloutConfig, VllmEngineConfig
from libra_core.rollout.vllm_server import EngineStartError, VllmServer, port_is_free


def test_a_fixed_port_something_listens_on_is_refused_before_the_engine_starts(tmp_path: Path) -> None:
    """The health check took whatever answered on the port (another run's engine) for this
    instance, and the pool then sent it rollouts and weight syncs."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        cfg = VllmEngineConfig(base_port=port)
        server = VllmServer("pool-0", tmp_path / "policy", cfg, tmp_path / "pool-0.log", 256, port=port)
        in_use = rf"port {port} on 127.0.0.1 is already in use .*base_port"
        with pytest.raises(EngineStartError, match=in_use):
            server.start()
        assert server.process is None
    assert port_is_free("127.0.0.1", port)  # closed: free again


def test_top_p_below_one_is_refused_naming_why() -> None:
    assert RolloutConfig(top_p=1.0).top_p == 1.0
    with pytest.raises(ValueError, match="top_p=0.9: only 1.0 is supported; .*truncated distribution"):
        RolloutConfig(top_p=0.9)
