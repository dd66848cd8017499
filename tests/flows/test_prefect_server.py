"""Finding the Prefect server: an unreachable PREFECT_API_URL falls back to an ephemeral API."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.prefect_server import api_healthy, choose_api_for_run, free_port, start_server
from tests.support import fake_prefect_api


def test_unreachable_server_falls_back_to_ephemeral(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", dead)
    message = choose_api_for_run()
    assert message is not None and dead in message and "ephemeral" in message
    import os

    assert "PREFECT_API_URL" not in os.environ  # Prefect will start its own ephemeral API


def test_no_server_configured_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert choose_api_for_run() is None


def test_start_server_refuses_a_port_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_prefect_api() as api_url:
        port = int(api_url.rsplit(":", 1)[1].removesuffix("/api"))
        assert api_healthy(api_url)
        with pytest.raises(RuntimeError, match="already answers"):
            start_server("127.0.0.1", port, tmp_path / "server.log")
