"""A nightly run missed while `libra serve` was stopped ran, at the next `libra serve`, with the
parameters of the serve that had stopped (until 2026-12-07): Prefect replaces a deployment's
scheduled runs still to come when it is registered again, but keeps the ones already due. Now
`libra serve` gives them the parameters it serves, or deletes them when its schedule is paused.

A real server (the tests' ephemeral one, which runs no scheduler): the runs are made by Prefect's
own scheduling endpoint (`POST /deployments/{id}/schedule`, the scheduler's run generator), from
three days back, as a stopped serve leaves them. `serve_forever` runs as `libra serve` calls it,
with its runner only registering the deployments (Prefect's `Runner.add_deployment`), not started:
a started one would execute the due runs."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

CRON = "0 2 * * *"


def _deployments(*overrides: str, edited: tuple[str, ...] = ()) -> list[Any]:
    """The deployments `libra serve --set ...` registers; `edited`: changes to the config file
    itself, which its parameters (the file's path) do not show."""
    from flows.serve import build_deployments
    from libra_core.config import load_config

    sets = [f"schedule.cron={CRON}", "schedule.timezone=UTC", *overrides]
    return build_deployments(None, sets, load_config(None, [*sets, *edited]))


def _register_only(deployments: list[Any], limit: int) -> None:
    """`serve_until_interrupted` without starting the runner (it would execute the due runs)."""
    from prefect.runner import Runner

    runner = Runner(limit=limit)
    for deployment in deployments:
        runner.add_deployment(deployment)


def _scheduled(client: Any, deployment_id: Any) -> dict[Any, Any]:
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    flt = FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
    )
    return {r.id: r for r in client.read_flow_runs(flow_run_filter=flt, limit=200)}


def _as_a_stopped_serve_left_it(client: Any) -> tuple[Any, list[Any], Any]:
    """The experiment deployment registered by a serve with `experiment.name=old`, its nightly runs
    made from three days back (due ones and ones to come), and a run started from the UI for the
    same night with its own parameters. Returns the deployment id, the due runs and the UI run."""
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Scheduled

    old = _deployments("experiment.name=old")
    with contextlib.suppress(ObjectNotFound):  # a fresh deployment: other tests' runs are no concern
        client.delete_deployment(client.read_deployment_by_name(old[0].full_name).id)
    for deployment in old:
        deployment.apply()
    dep_id = client.read_deployment_by_name(old[0].full_name).id
    start = datetime.now(UTC) - timedelta(days=3)
    made = client.request(
        "POST",
        "/deployments/{id}/schedule",
        path_params={"id": dep_id},
        json={"start_time": start.isoformat(), "min_runs": 6, "max_runs": 6},
    )
    made.raise_for_status()
    now = datetime.now(UTC)
    runs = _scheduled(client, dep_id).values()
    due = [r for r in runs if r.expected_start_time <= now]
    assert len(due) >= 2 and len(runs) > len(due), [r.expected_start_time for r in runs]
    assert all(r.auto_scheduled and r.parameters == old[0].parameters for r in runs)
    ui_params = {**old[0].parameters, "overrides": ["experiment.iterations=1"]}
    ui_run = client.create_flow_run_from_deployment(
        dep_id, parameters=ui_params, state=Scheduled(scheduled_time=now - timedelta(hours=1))
    )
    return dep_id, due, ui_run


class _Lines(logging.Handler):
    """The lines logged to one logger (Prefect's logging set-up replaces pytest's root handler)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _serve(deployments: list[Any]) -> list[str]:
    """`serve_forever` as `libra serve` calls it (its runner only registering); the refresh's lines."""
    from flows.serve import serve_forever

    logged, logger = _Lines(), logging.getLogger("flows.serve_schedule_refresh")
    logger.addHandler(logged)
    try:
        serve_forever(deployments, 1)
    finally:
        logger.removeHandler(logged)
    return logged.lines


def test_serve_gives_due_scheduled_runs_the_served_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import get_client

    monkeypatch.setattr("flows.serve_shutdown.serve_until_interrupted", _register_only)
    new = _deployments("experiment.name=new", "schedule.catch_up=all")  # every missed night kept
    with get_client(sync_client=True) as client:
        dep_id, due, ui_run = _as_a_stopped_serve_left_it(client)
        lines = _serve(new)
        after = _scheduled(client, dep_id)
        # What the new serve's runner polls for (Runner._get_scheduled_flow_runs): due runs.
        polled = client.get_scheduled_flow_runs_for_deployments([dep_id], scheduled_before=datetime.now(UTC))
    # The missed nights are kept (they run now, as Prefect runs late runs), with the new parameters.
    for run in due:
        assert run.id in after, run.expected_start_time
        assert after[run.id].parameters == new[0].parameters, after[run.id].parameters
    auto = [r for r in after.values() if r.auto_scheduled]
    assert all(r.parameters == new[0].parameters for r in auto), [r.parameters for r in auto]
    assert after[ui_run.id].parameters == ui_run.parameters  # a UI run keeps its own
    assert {r.id for r in polled} == {r.id for r in due} | {ui_run.id}
    assert {tuple(r.parameters["overrides"]) for r in polled} == {
        tuple(new[0].parameters["overrides"]),
        ("experiment.iterations=1",),
    }
    assert len(lines) == 1, lines
    assert f"scheduled run(s) of rl-experiment/experiment ({len(due)} due now)" in lines[0], lines[0]
    assert lines[0].endswith("had an earlier `libra serve`'s parameters: given the ones served now")


def test_serve_with_its_schedule_paused_deletes_the_due_scheduled_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect import get_client

    monkeypatch.setattr("flows.serve_shutdown.serve_until_interrupted", _register_only)
    # The config file edited to `active: false`: the same parameters, the schedule paused.
    paused = _deployments("experiment.name=old", edited=("schedule.active=false",))
    with get_client(sync_client=True) as client:
        dep_id, due, ui_run = _as_a_stopped_serve_left_it(client)
        assert paused[0].parameters == client.read_deployment(dep_id).parameters
        lines = _serve(paused)
        after = _scheduled(client, dep_id)
    # "false: the schedule is registered but paused": no nightly run starts, not even a missed one.
    assert not any(r.auto_scheduled for r in after.values()), [r.expected_start_time for r in after.values()]
    assert list(after) == [ui_run.id]
    assert len(lines) == 1, lines
    assert f"rl-experiment/experiment ({len(due)} due now) deleted: the schedule is paused" in lines[0], lines
