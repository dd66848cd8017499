"""Scheduled runs made for an earlier `libra serve`, given the parameters served now (or deleted).

Prefect's scheduler makes a deployment's scheduled runs ahead of time, each with a copy of the
deployment's parameters (`config_path`, `overrides`, `base_dir`). When `libra serve` registers the
deployment again (its runner applies it), Prefect (3.7) deletes the runs still to come and makes
them again with the new parameters, but keeps those whose time has passed: a nightly run missed
while `libra serve` was stopped (the server it starts stops with it). They are due, so the new
serve's runner starts them at once, and until 2026-12-07 they ran with the parameters of the serve
that had stopped: other `--set` overrides, another CONFIG, another working folder; and they ran
even with `schedule.active: false` or no cron. An edited stages.yaml is not such a change: the
parameters name the file, which a run reads when it runs.

`libra serve` calls `refresh_scheduled_runs` once at start, before its runner registers the
deployments (and so before it polls for runs). Of each served deployment's runs that are
SCHEDULED, made by the schedule (`auto_scheduled`) and never started (`run_count == 0`; a run
awaiting a retry has run), those whose parameters differ from the ones about to be registered get
them instead; the missed nightly run still runs, with the config served now. When the served
deployment has no active schedule, they are deleted, as Prefect deletes them when a deployment is
paused. Runs started from the UI or the API (not `auto_scheduled`) keep what they were given.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import ObjectNotFound

from flows.serve_orphans import deployment_runs

log = logging.getLogger(__name__)


def refresh_scheduled_runs(deployments: list[Any]) -> list[UUID]:
    """Give the stale scheduled runs of `deployments` (Prefect `RunnerDeployment`s, not registered
    yet, or registered by an earlier serve) the deployment's parameters, or delete them when it
    has no active schedule; one log line per deployment that had any. Returns the ids changed.
    Called once by `libra serve` before its runner starts; an API error is logged and ends the
    refresh (serving goes on: those runs only stay as they were)."""
    for deployment in deployments:
        # A scheduled run carries the deployment's parameters updated by its schedule's own; the
        # schedules `build_deployments` makes have none, so the deployment's are the whole set.
        assert not any(s.parameters for s in deployment.schedules), (
            f"{deployment.full_name}: a schedule with parameters of its own"
        )
    try:
        with get_client(sync_client=True) as client:
            changed: list[UUID] = []
            for deployment in deployments:
                changed += _refresh(client, deployment)
            return changed
    except Exception as err:  # the API down or refusing: the runs stay; serving is unaffected
        log.warning("could not refresh the runs an earlier `libra serve` scheduled: %s", err)
        return []


def _refresh(client: Any, deployment: Any) -> list[UUID]:
    """Refresh the stale scheduled runs of one deployment; returns their ids."""
    name = deployment.full_name
    try:
        registered = client.read_deployment_by_name(name)
    except ObjectNotFound:  # first registration: no run made for it yet
        return []
    wanted = dict(deployment.parameters)
    active = not deployment.paused and any(s.active for s in deployment.schedules)
    stale = [
        run
        for run in _scheduled(client, registered.id)
        if run.auto_scheduled and run.run_count == 0 and (not active or run.parameters != wanted)
    ]
    for run in stale:
        if active:
            client.update_flow_run(run.id, parameters=wanted)
        else:
            client.delete_flow_run(run.id)
    if stale:
        now = datetime.now(UTC)
        due = sum(1 for r in stale if r.expected_start_time is not None and r.expected_start_time <= now)
        what = (
            "had an earlier `libra serve`'s parameters: given the ones served now"
            if active
            else "deleted: the schedule is paused or has no cron now"
        )
        log.warning("%d scheduled run(s) of %s (%d due now) %s", len(stale), name, due, what)
    return [run.id for run in stale]


def _scheduled(client: Any, deployment_id: UUID) -> list[FlowRun]:
    """The deployment's SCHEDULED flow runs, all pages (read before any is changed)."""
    return deployment_runs(client, [deployment_id], [StateType.SCHEDULED])
