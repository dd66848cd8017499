"""`libra serve` starts a Prefect server in its own session: an interrupt while it starts must stop
it (no signal reaches it, and it would keep the port)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import flows.prefect_server as ps


def test_an_interrupt_while_the_server_starts_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(cmd: list[str], **kw: object) -> subprocess.Popen:  # a server that never answers
        proc = real_popen(["sleep", "60"], **kw)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    answers = iter([False, False])  # nothing on the port yet, then not healthy yet

    def healthy(url: str, timeout_s: float = 1.0) -> bool:
        try:
            return next(answers)
        except StopIteration:
            raise KeyboardInterrupt from None  # Ctrl-C while it starts

    monkeypatch.setattr(ps.subprocess, "Popen", popen)
    monkeypatch.setattr(ps, "api_healthy", healthy)
    with pytest.raises(KeyboardInterrupt):
        ps.start_server("127.0.0.1", 1, tmp_path / "server.log", timeout_s=30)
    (proc,) = started
    assert proc.poll() is not None  # stopped, not left running in its own session
