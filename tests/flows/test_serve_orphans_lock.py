"""The orphan check holds the run folder's lock from its check to its write: a `libra run --resume`
that took the folder between a look at the lock and the write would have had its folder marked
`failed` while it ran (until 2026-12-07 the lock was only looked at). The real lock (flock) in
another process; the Prefect client is a stand-in that records what the check sets, since what is
under test is the order of the lock and the write, not the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import StateType

from tests.flows.test_serve_orphans import _HOLD_LOCK
from tests.support import ROOT


class _Client:
    def __init__(self) -> None:
        self.set: list[Any] = []

    def read_flow_runs(self, **_: Any) -> list[Any]:
        return []  # no subflow runs

    def set_flow_run_state(self, run_id: Any, state: Any, force: bool) -> None:
        self.set.append((run_id, state.type))


def _orphan(monkeypatch: pytest.MonkeyPatch, folder: Path) -> tuple[Any, _Client]:
    import flows.serve_orphans as so

    monkeypatch.setattr(so, "_run_folder", lambda client, run: folder)
    run = SimpleNamespace(id=uuid4(), name="orphan", state_type=StateType.RUNNING)
    return run, _Client()


def test_the_folder_is_written_under_its_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import flows.serve_orphans as so
    from libra_core.pipeline.run_dir import RunState, read_state, write_state
    from libra_core.pipeline.run_lock import held_runs

    write_state(tmp_path, RunState(2, 2, "running"))
    run, client = _orphan(monkeypatch, tmp_path)
    held_at_write: list[bool] = []
    real = so.finish_run

    def finish(run_dir: str, status: str) -> None:
        held_at_write.append(Path(run_dir).resolve() in held_runs())
        real(run_dir, status)

    monkeypatch.setattr(so, "finish_run", finish)
    assert so._mark_orphan(client, run, "rl-experiment/experiment") == [run.id]
    assert held_at_write == [True]  # before: False, the write made with no lock taken
    assert read_state(tmp_path).status == "failed" and client.set == [(run.id, StateType.CRASHED)]
    assert tmp_path.resolve() not in held_runs()  # released after the write


def test_a_folder_locked_by_another_process_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import flows.serve_orphans as so
    from libra_core.pipeline.run_dir import RunState, read_state, write_state

    write_state(tmp_path, RunState(2, 2, "running"))
    run, client = _orphan(monkeypatch, tmp_path)
    locker = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        assert so._mark_orphan(client, run, "rl-experiment/experiment") == []
    finally:
        locker.kill()
        locker.wait()
    assert read_state(tmp_path).status == "running" and client.set == []
