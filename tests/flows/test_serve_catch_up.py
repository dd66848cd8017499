"""`schedule.catch_up`: of the nightly runs that fell due while `libra serve` was stopped, "latest"
keeps the newest, "all" every one (Prefect's own behaviour, and libra's until 2026-12-07), "none"
none; runs still to come and runs started from the UI are not touched by it.

As in test_serve_schedule_refresh.py (whose helpers these are): a real server, the runs made by
Prefect's scheduling endpoint from five days back, `serve_forever` as `libra serve` calls it. What
the refresh left is read when the runner would start: after it, before the runner registers the
deployment (registering makes the runs still to come again, under new ids)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.flows.test_serve_schedule_refresh import CRON, _deployments, _register_only, _scheduled, _serve

DAYS = 5  # nights missed: five due runs (02:00 each day), and three still to come


def _as_a_stopped_serve_left_it(client: Any, old: list[Any]) -> tuple[Any, list[Any], list[Any], Any]:
    """`old` registered, its nightly runs made from DAYS back, and a due run started from the UI.
    Returns the deployment id, the due runs (oldest first), the runs to come and the UI run."""
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Scheduled

    with contextlib.suppress(ObjectNotFound):  # a fresh deployment: other tests' runs are no concern
        client.delete_deployment(client.read_deployment_by_name(old[0].full_name).id)
    for deployment in old:
        deployment.apply()
    dep_id = client.read_deployment_by_name(old[0].full_name).id
    made = client.request(
        "POST",
        "/deployments/{id}/schedule",
        path_params={"id": dep_id},
        json={
            "start_time": (datetime.now(UTC) - timedelta(days=DAYS)).isoformat(),
            "min_runs": DAYS + 3,
            "max_runs": DAYS + 3,
        },
    )
    made.raise_for_status()
    now = datetime.now(UTC)
    runs = sorted(_scheduled(client, dep_id).values(), key=lambda r: r.expected_start_time)
    due = [r for r in runs if r.expected_start_time <= now]
    future = [r for r in runs if r.expected_start_time > now]
    assert len(due) >= 3 and future, [r.expected_start_time for r in runs]
    assert all(r.auto_scheduled and r.parameters == old[0].parameters for r in runs)
    ui_run = client.create_flow_run_from_deployment(
        dep_id,
        parameters={**old[0].parameters, "overrides": ["experiment.iterations=1"]},
        state=Scheduled(scheduled_time=now - timedelta(hours=1)),
    )
    return dep_id, due, future, ui_run


def _serve_and_look(
    monkeypatch: pytest.MonkeyPatch, client: Any, dep_id: Any, deployments: list[Any]
) -> tuple[list[str], dict[Any, Any], set[Any]]:
    """`serve_forever(deployments)`; returns the refresh's log lines, the deployment's SCHEDULED
    runs as the refresh left them, and the ids of the runs the runner then polls for (due ones)."""
    left: dict[Any, Any] = {}

    def register(deps: list[Any], limit: int) -> None:
        left.update(_scheduled(client, dep_id))
        _register_only(deps, limit)

    monkeypatch.setattr("flows.serve_shutdown.serve_until_interrupted", register)
    lines = _serve(deployments)
    polled = client.get_scheduled_flow_runs_for_deployments([dep_id], scheduled_before=datetime.now(UTC))
    return lines, left, {r.id for r in polled}


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_catch_up_keeps_the_due_runs_it_names(monkeypatch: pytest.MonkeyPatch, catch_up: str) -> None:
    from prefect import get_client

    new = _deployments("experiment.name=new", f"schedule.catch_up={catch_up}")
    with get_client(sync_client=True) as client:
        dep_id, due, future, ui_run = _as_a_stopped_serve_left_it(client, _deployments("experiment.name=old"))
        lines, left, polled = _serve_and_look(monkeypatch, client, dep_id, new)
    kept = {"latest": due[-1:], "all": due, "none": []}[catch_up]
    assert set(left) == {r.id for r in kept} | {r.id for r in future} | {ui_run.id}
    # The kept runs and the runs to come get the parameters served now, as before catch-up.
    for run in kept + future:
        assert left[run.id].parameters == new[0].parameters, (
            run.expected_start_time,
            left[run.id].parameters,
        )
    for run in future:  # not due: catch-up leaves them, at their time
        assert left[run.id].expected_start_time == run.expected_start_time
    assert left[ui_run.id].parameters == ui_run.parameters  # a UI run keeps its own
    assert polled == {r.id for r in kept} | {ui_run.id}
    refreshed = (
        f"{len(kept) + len(future)} scheduled run(s) of rl-experiment/experiment ({len(kept)} due now) "
        "had an earlier `libra serve`'s parameters: given the ones served now"
    )
    if catch_up == "all":
        assert lines == [refreshed]
    elif catch_up == "latest":
        newest = due[-1]
        assert lines == [
            f"schedule.catch_up=latest: deleted {len(due) - 1} of the {len(due)} scheduled runs of "
            "rl-experiment/experiment that fell due while `libra serve` was stopped; kept the newest, "
            f"{newest.name} ({newest.id}, due {newest.expected_start_time.isoformat()})",
            refreshed,
        ]
    else:
        assert lines == [
            f"schedule.catch_up=none: deleted the {len(due)} scheduled run(s) of rl-experiment/experiment "
            "that fell due while `libra serve` was stopped; kept none: the next run is at the next cron time",
            refreshed,
        ]


@pytest.mark.parametrize(("text", "kept_newest"), [("", True), ("  catch_up: none\n", False)])
def test_catch_up_set_in_the_config_file_with_the_parameters_unchanged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, kept_newest: bool
) -> None:
    """The serve started again with the same CONFIG and `--set`s, the file edited meanwhile (or
    not: the default, "latest"): the setting is read from the file; no parameter changes, so the
    runs kept and the runs to come are not touched at all."""
    from prefect import get_client

    from flows.serve import build_deployments
    from libra_core.config import load_config

    path = tmp_path / "stages.yaml"
    path.write_text(f"schedule:\n  cron: '{CRON}'\n  timezone: UTC\n", encoding="utf-8")
    sets = ["experiment.name=same"]
    old = build_deployments(str(path), sets, load_config(path, sets))
    with get_client(sync_client=True) as client:
        dep_id, due, future, ui_run = _as_a_stopped_serve_left_it(client, old)
        path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")
        served = build_deployments(str(path), sets, load_config(path, sets))
        assert served[0].parameters == old[0].parameters
        lines, left, polled = _serve_and_look(monkeypatch, client, dep_id, served)
    kept = due[-1:] if kept_newest else []
    assert set(left) == {r.id for r in kept} | {r.id for r in future} | {ui_run.id}
    for run in kept + future:
        assert (left[run.id].parameters, left[run.id].expected_start_time, left[run.id].updated) == (
            run.parameters,
            run.expected_start_time,
            run.updated,
        )
    assert polled == {r.id for r in kept} | {ui_run.id}
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"schedule.catch_up={'latest' if kept_newest else 'none'}: deleted "), lines
