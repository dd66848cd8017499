"""Cancels seen between iterations: the experiment reads its own state and the state of the
iteration it just ran from Prefect's API (a Cancel on an `iteration-N` page reaches no process)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest


def test_cancel_requested_follows_the_flow_runs_state(prefect_quiet) -> None:
    from prefect import flow, get_client
    from prefect.context import FlowRunContext
    from prefect.states import Cancelling

    from flows.rl_experiment import cancel_requested

    seen: list[str | None] = []

    @flow
    def probe() -> None:
        seen.append(cancel_requested())
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        with get_client(sync_client=True) as client:  # what the UI's Cancel button does
            client.set_flow_run_state(ctx.flow_run.id, Cancelling(), force=True)
        seen.append(cancel_requested())

    probe(return_state=True)  # its final state stays CANCELLING: the server keeps the forced one
    assert seen == [None, "rl-experiment"]
    assert cancel_requested() is None  # outside a flow run there is nothing to cancel


class _Task:
    """A stand-in for a task: called directly or through `.fn`, it records its arguments."""

    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]], name: str, result: Any = None) -> None:
        self.calls, self.name, self.result = calls, name, result

    def __call__(self, *args: Any) -> Any:
        self.calls.append((self.name, args))
        return self.result

    fn = __call__


def _experiment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cancel: dict[int, str]) -> dict[str, Any]:
    """rl_experiment with its tasks faked and a real `iteration-N` subflow; at iteration i,
    `cancel[i]` ("iteration" or "experiment") is set to CANCELLING through the API, as the UI does."""
    from prefect import flow, get_client
    from prefect.context import FlowRunContext
    from prefect.states import Cancelling

    import flows.rl_experiment as rx

    seen: dict[str, Any] = {"calls": [], "iterations": [], "ids": {}}
    calls = seen["calls"]

    def create(*args: Any) -> Any:
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        seen["experiment_id"] = ctx.flow_run.id
        return types.SimpleNamespace(
            run_dir=str(tmp_path), start_iteration=1, resumed=False, policy_version=0
        )

    @flow(name="rl-iteration", flow_run_name="iteration-{iteration}")
    def iteration_flow(run_dir: str, iteration: int, version: int, rollout: Any = None) -> dict[str, Any]:
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        seen["iterations"].append(iteration)
        seen["ids"][iteration] = ctx.flow_run.id
        which = cancel.get(iteration)
        if which is not None:
            target = ctx.flow_run.id if which == "iteration" else seen["experiment_id"]
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(target, Cancelling(), force=True)
        row = {"policy_version": version + 1}
        return {"row": row, "next_rollout": None, "flow_run_id": str(ctx.flow_run.id)}

    monkeypatch.setattr(rx, "create_run_task", create)
    monkeypatch.setattr(
        rx,
        "load_run_config",
        lambda run_dir: types.SimpleNamespace(experiment=types.SimpleNamespace(iterations=4)),
    )
    monkeypatch.setattr(rx, "rl_iteration", iteration_flow)
    for name in (
        "prepare_policy_task",
        "finish_run_task",
        "stop_pool_task",
        "run_artifacts_task",
        "release_run",
    ):
        monkeypatch.setattr(rx, name, _Task(calls, name))
    return seen


def _state_of(run_id: Any) -> str:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state is not None
    return state.type.value


def test_a_cancel_on_an_iteration_page_stops_the_experiment_after_it(
    prefect_quiet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.rl_experiment import rl_experiment

    seen = _experiment(monkeypatch, tmp_path, {2: "iteration"})
    state = rl_experiment(return_state=True)
    assert state.is_cancelled(), state  # before: COMPLETED after all 4 iterations
    assert "iteration-2" in (state.message or "")
    assert seen["iterations"] == [1, 2]
    names = [(name, args[1:]) for name, args in seen["calls"] if name != "prepare_policy_task"]
    # the folder is made consistent as after a UI cancel: state first, then the engines
    assert names == [("finish_run_task", ("cancelled",)), ("stop_pool_task", ()), ("release_run", ())]
    assert _state_of(seen["ids"][2]) == "CANCELLED"  # its page no longer says "Cancelling"
    assert _state_of(seen["ids"][1]) == "COMPLETED"


def test_a_cancel_of_the_experiment_seen_between_iterations_ends_it_cancelled(
    prefect_quiet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from prefect.exceptions import CancelledRun

    from flows.rl_experiment import rl_experiment

    seen = _experiment(monkeypatch, tmp_path, {3: "experiment"})
    with pytest.raises(CancelledRun):  # what `libra run` catches (exit 130, a resume hint)
        rl_experiment()
    assert seen["iterations"] == [1, 2, 3]
    assert _state_of(seen["experiment_id"]) == "CANCELLED"  # before: CRASHED (TerminationSignal)
    assert ("finish_run_task", (str(tmp_path), "cancelled")) in seen["calls"]


def test_a_cancel_on_the_last_iterations_page_comes_too_late(
    prefect_quiet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.rl_experiment import rl_experiment

    seen = _experiment(monkeypatch, tmp_path, {4: "iteration"})
    state = rl_experiment(return_state=True)
    assert state.is_completed() and seen["iterations"] == [1, 2, 3, 4]
    assert ("finish_run_task", (str(tmp_path), "finished")) in seen["calls"]
