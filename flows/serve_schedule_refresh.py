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
them instead; a missed nightly run that is kept (`schedule.catch_up`, below) runs with the config
served now. When the served deployment has no active schedule, they are deleted, as Prefect
deletes them when a deployment is paused. Runs started from the UI or the API (not
`auto_scheduled`) keep what they were given.

Before that, `schedule.catch_up` decides which of those runs already due (nights missed while
`libra serve` was stopped) run at all (since 2026-12-07; Prefect would run each missed night, one
after another): "latest" keeps only the newest and deletes the others, "all" keeps every one,
"none" deletes them all (the next run is at the next cron time). Runs still to come are not
touched. The setting is read from the config the deployment's parameters name (`config_path`,
`overrides`), as `libra serve` loaded it a moment before; a config that no longer loads keeps
every due run (a deletion cannot be undone) and says why.
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
from libra_core.config import ConfigError, load_config
from libra_core.config.schedule import CatchUp

log = logging.getLogger(__name__)


def refresh_scheduled_runs(deployments: list[Any]) -> list[UUID]:
    """Delete the due scheduled runs of `deployments` (Prefect `RunnerDeployment`s, not registered
    yet, or registered by an earlier serve) that `schedule.catch_up` does not keep, and give the
    stale ones left the deployment's parameters, or delete them all when it has no active
    schedule; a log line for each deletion by catch-up and one per deployment with stale runs.
    Returns the ids deleted or changed.
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
    """Apply `schedule.catch_up` to the due scheduled runs of one deployment, then refresh the
    stale ones left; returns the ids deleted or changed."""
    name = deployment.full_name
    try:
        registered = client.read_deployment_by_name(name)
    except ObjectNotFound:  # first registration: no run made for it yet
        return []
    wanted = dict(deployment.parameters)
    active = not deployment.paused and any(s.active for s in deployment.schedules)
    ours = [run for run in _scheduled(client, registered.id) if run.auto_scheduled and run.run_count == 0]
    dropped = _catch_up(client, deployment, ours) if active else []
    stale = [run for run in ours if run.id not in dropped and (not active or run.parameters != wanted)]
    for run in stale:
        if active:
            client.update_flow_run(run.id, parameters=wanted)
        else:
            client.delete_flow_run(run.id)
    if stale:
        now = datetime.now(UTC)
        due = sum(1 for r in stale if _due(r, now))
        what = (
            "had an earlier `libra serve`'s parameters: given the ones served now"
            if active
            else "deleted: the schedule is paused or has no cron now"
        )
        log.warning("%d scheduled run(s) of %s (%d due now) %s", len(stale), name, due, what)
    return dropped + [run.id for run in stale]


def _catch_up(client: Any, deployment: Any, runs: list[FlowRun]) -> list[UUID]:
    """Delete the due ones of `runs` (the deployment's scheduled runs, never started) that
    `schedule.catch_up` does not keep; returns their ids."""
    now = datetime.now(UTC)
    due = sorted((r for r in runs if _due(r, now)), key=lambda r: (r.expected_start_time, str(r.id)))
    if not due:
        return []
    catch_up = _catch_up_setting(deployment)
    drop = {"all": [], "latest": due[:-1], "none": due}[catch_up]
    for run in drop:
        client.delete_flow_run(run.id)
    name = deployment.full_name
    if drop and catch_up == "latest":
        kept = due[-1]
        log.warning(
            "schedule.catch_up=latest: deleted %d of the %d scheduled runs of %s that fell due while "
            "`libra serve` was stopped; kept the newest, %s (%s, due %s)",
            len(drop),
            len(due),
            name,
            kept.name,
            kept.id,
            kept.expected_start_time.isoformat() if kept.expected_start_time else "?",
        )
    elif drop:
        log.warning(
            "schedule.catch_up=none: deleted the %d scheduled run(s) of %s that fell due while "
            "`libra serve` was stopped; kept none: the next run is at the next cron time",
            len(drop),
            name,
        )
    return [run.id for run in drop]


def _catch_up_setting(deployment: Any) -> CatchUp:
    """`schedule.catch_up` of the config the deployment serves (its `config_path` and `overrides`
    parameters); "all" for one that serves no config, or whose config no longer loads."""
    params = deployment.parameters
    if "config_path" not in params or "overrides" not in params:
        return "all"
    try:
        return load_config(params["config_path"], list(params["overrides"])).schedule.catch_up
    except ConfigError as err:  # the file edited since `libra serve` loaded it
        log.warning(
            "%s: schedule.catch_up not read (%s); every scheduled run that fell due is kept",
            deployment.full_name,
            "; ".join(err.problems),
        )
        return "all"


def _due(run: FlowRun, now: datetime) -> bool:
    return run.expected_start_time is not None and run.expected_start_time <= now


def _scheduled(client: Any, deployment_id: UUID) -> list[FlowRun]:
    """The deployment's SCHEDULED flow runs, all pages (read before any is changed)."""
    return deployment_runs(client, [deployment_id], [StateType.SCHEDULED])
