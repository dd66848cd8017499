"""Flow runs a `libra serve` killed outright left unfinished: RUNNING or PENDING ones marked
Crashed, CANCELLING ones Cancelled.

A graceful stop ends the runs in progress (flows/serve_shutdown.py); a SIGKILL or a machine crash
does not. Prefect's runner records no process id for the runs it starts (Prefect 3.7), and its
flow-run heartbeats are off by default and need an automation to act on them (Prefect's "detect
zombie flows" guide), so those runs stayed RUNNING in the server for good, and their run folders
said `running`. A run the user cancelled (the UI sets CANCELLING; the runner kills its process and
marks it Cancelled) whose serve was killed first stayed CANCELLING for good the same way. `libra
serve` calls `mark_orphaned_runs` once at start, before it serves: a run of a deployment it is about
to serve that is RUNNING, PENDING or CANCELLING then was started by an earlier serve process (one
serve process serves a deployment), and it is an orphan unless its process still runs:

- a flow-run process is `python -m prefect.engine` with `PREFECT__FLOW_RUN_ID=<run id>` in its
  environment (how the runner starts it); one found in /proc is alive (a serve killed alone leaves
  it running), and its run is left alone. Its vLLM engines inherit the variable but are no
  flow-run process: they do not keep a dead run alive. Without /proc nothing can be checked, and
  the one-serve rule alone decides;
- a run folder whose lock (`RUN_DIR/.lock`, held while a process runs it) is held is in use (the
  run, or a `libra run --resume` of it started since), and that run is left alone too. The check
  takes the lock itself and holds it until the folder is written, so no resume can start between.

An orphan is marked Crashed with `ORPHAN_MESSAGE`, and so are its RUNNING, PENDING or CANCELLING
subflow runs (`iteration-N`, which ran in its process). Its run folder, when it can be told
(`_run_folder`), gets `status: failed` in `state.json`, what a run that raised records
(`run_start.finish_run`), if it still says `running`. A CANCELLING orphan was asked to stop, so it
ends as the cancel would have ended it: Cancelled with `CANCELLED_MESSAGE`, its unfinished subflow
runs too, and its folder `cancelled` (what rl_experiment.py records on a cancel). Runs of other
deployments, and runs with no deployment, are never touched.
"""

from __future__ import annotations

import contextlib
import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    TaskRunFilter,
    TaskRunFilterName,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Crashed, State

from libra_core.config import ConfigError, load_config
from libra_core.pipeline.run_dir import RunLayout, read_state
from libra_core.pipeline.run_lock import RunLockedError, lock_run, unlock_run
from libra_core.pipeline.run_start import anchor_paths, finish_run

log = logging.getLogger(__name__)

EXPERIMENT_FLOW = "rl-experiment"  # the flow whose runs have run folders
ORPHAN_MESSAGE = "The `libra serve` that ran it stopped without ending it"
CANCELLED_MESSAGE = "Cancel requested; the `libra serve` that ran it stopped before ending it"
_UNFINISHED = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]
_PAGE = 200  # flow runs per API call (the server's default limit)
_PROC = Path("/proc")


def mark_orphaned_runs(deployment_names: list[str]) -> list[UUID]:
    """Mark the orphaned runs of `deployment_names` ("flow/deployment"; not registered yet: none)
    Crashed (CANCELLING ones Cancelled), with one log line each and a count; returns their ids
    (subflow runs included). Called once by `libra serve` before its runner starts; an API error is
    logged and ends the check (serving goes on: the orphans only stay as they were)."""
    marked: list[UUID] = []
    ended = {"Crashed": 0, "Cancelled": 0}  # orphans (not their subflow runs) by how they ended
    try:
        with get_client(sync_client=True) as client:
            live = _live_flow_run_ids()
            for name in deployment_names:
                try:
                    deployment = client.read_deployment_by_name(name)
                except ObjectNotFound:
                    continue
                for run in _read_all(client, FlowRunFilterDeploymentId(any_=[deployment.id])):
                    if live is not None and run.id in live:
                        continue
                    ids = _mark_orphan(client, run, name)
                    if ids:
                        ended["Cancelled" if run.state_type is StateType.CANCELLING else "Crashed"] += 1
                    marked += ids
    except Exception as err:  # the API down or refusing: the orphans stay; serving is unaffected
        log.warning("could not check for flow runs left by an earlier `libra serve`: %s", err)
    if marked:
        log.warning(
            "flow runs left by an earlier `libra serve`: %d marked Crashed, %d cancelling marked Cancelled",
            ended["Crashed"],
            ended["Cancelled"],
        )
    return marked


def _read_all(client: Any, deployment_id: FlowRunFilterDeploymentId) -> list[FlowRun]:
    """The deployment's RUNNING, PENDING and CANCELLING flow runs, all pages (read before any is
    changed)."""
    return deployment_runs(client, deployment_id.any_ or [], _UNFINISHED)


def deployment_runs(client: Any, deployment_ids: list[UUID], states: list[StateType]) -> list[FlowRun]:
    """The flow runs of `deployment_ids` in `states`, all pages (read before any is changed; also
    serve_schedule_refresh.py's)."""
    flt = FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=deployment_ids),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states)),
    )
    runs: list[FlowRun] = []
    while True:
        page = client.read_flow_runs(
            flow_run_filter=flt, sort=FlowRunSort.ID_DESC, limit=_PAGE, offset=len(runs)
        )
        runs += page
        if len(page) < _PAGE:
            return runs


def _mark_orphan(client: Any, run: FlowRun, deployment: str) -> list[UUID]:
    """Mark `run`, whose process is gone, and its unfinished subflow runs Crashed, and its folder
    `failed` (a CANCELLING run: Cancelled, `cancelled`); returns the ids marked (none when another
    process holds its folder)."""
    has_folder = deployment.startswith(f"{EXPERIMENT_FLOW}/")  # a simulate run keeps no state.json
    folder = _run_folder(client, run) if has_folder else None
    # Held from here to the folder's write: a resume that took it between a check and the write
    # would have had its folder marked while it ran (until 2026-12-07 the lock was only looked at).
    held = False
    if folder is not None:
        try:
            lock_run(folder)
            held = True
        except RunLockedError as err:  # the run, or a resume of its folder since, is running it
            log.info("flow run %s (%s) left alone: %s", run.name, run.id, err)
            return []
        except OSError:  # the folder is gone: `_end_folder` says so
            pass
    try:
        return _end_orphan(client, run, deployment, folder, has_folder)
    finally:
        if held and folder is not None:
            unlock_run(folder)


def _end_orphan(
    client: Any, run: FlowRun, deployment: str, folder: Path | None, has_folder: bool
) -> list[UUID]:
    """`_mark_orphan`'s work, the folder's lock held (when there is a folder)."""
    parent = FlowRunFilterParentFlowRunId(any_=[run.id])
    unfinished = FlowRunFilterState(type=FlowRunFilterStateType(any_=_UNFINISHED))
    children = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(parent_flow_run_id=parent, state=unfinished)
    )
    for each in [run, *children]:  # a new state each: a state object is one row in the server
        client.set_flow_run_state(each.id, _end_state(run), force=True)
    cancelled = run.state_type is StateType.CANCELLING
    notes = ["run folder not known"] if has_folder else []
    if folder is not None:  # what the run records when it ends so (rl_experiment.py)
        notes = [_end_folder(folder, "cancelled" if cancelled else "failed")]
    if children:
        notes.append(f"{len(children)} subflow run(s) too")
    message = CANCELLED_MESSAGE if cancelled else ORPHAN_MESSAGE
    log.warning(
        "marked flow run %s (%s) of %s %s: %s%s",
        run.name,
        run.id,
        deployment,
        "Cancelled" if cancelled else "Crashed",
        message[0].lower() + message[1:],
        f" ({'; '.join(notes)})" if notes else "",
    )
    return [run.id, *(c.id for c in children)]


def _end_state(run: FlowRun) -> State:
    """How an orphan and its subflow runs end: Cancelled when a cancel was asked for (it is
    CANCELLING), else Crashed."""
    if run.state_type is StateType.CANCELLING:
        return Cancelled(message=f"{CANCELLED_MESSAGE}.")
    return Crashed(message=f"{ORPHAN_MESSAGE}.")


def _run_folder(client: Any, run: FlowRun) -> Path | None:
    """The run folder of an experiment run: a resumed one's `resume` parameter (anchored as the run
    anchored it), else the `run_dir` its iterations were given, else the folder its create-run task
    made (`_made_folder`); None when none of them says."""
    params = run.parameters
    if params.get("resume"):
        try:
            _, _, resume = anchor_paths(
                None, list(params.get("overrides") or []), params["resume"], params.get("base_dir") or "."
            )
        except (ConfigError, ValueError):  # overrides the run itself would have refused
            return None
        return Path(resume) if resume else None
    parent = FlowRunFilterParentFlowRunId(any_=[run.id])
    for child in client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=parent), limit=1):
        run_dir = child.parameters.get("run_dir")  # every iteration has the same
        if isinstance(run_dir, str) and run_dir:
            return Path(run_dir)
    return _made_folder(client, run)


def _made_folder(client: Any, run: FlowRun) -> Path | None:
    """The new folder of a run killed before its first iteration, which Prefect records nowhere:
    `new_run_dir` names it `<experiment.name>-<stamp>[-N]` under the `output_dir` of the config the
    run loaded, the stamp (local time, in seconds) taken while its create-run task ran. The one such
    folder that says `running`; None when there is none, or more than one (runs started in the
    same second)."""
    made = client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
        task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="create-run")),
    )
    started = [t for t in made if t.start_time is not None]
    if len(started) != 1:
        return None
    params = run.parameters
    try:
        config_path, overrides, _ = anchor_paths(
            params.get("config_path"),
            list(params.get("overrides") or []),
            None,
            params.get("base_dir") or ".",
        )
        cfg = load_config(config_path, overrides)
        folders = list(cfg.experiment.output_path.iterdir())
    except (ConfigError, ValueError, OSError):  # the config changed or went since: no folder known
        return None
    task = started[0]
    assert task.start_time is not None
    first = task.start_time.astimezone().replace(tzinfo=None, microsecond=0)
    last = task.end_time.astimezone().replace(tzinfo=None) if task.end_time else datetime.now()
    name = re.compile(re.escape(cfg.experiment.name) + r"-(\d{8}-\d{6})(?:-\d+)?")
    found = []
    for folder in folders:
        m = name.fullmatch(folder.name)
        if m is None:
            continue
        with contextlib.suppress(ValueError, OSError):  # no date; no state.json, a damaged one
            made_at = datetime.strptime(m.group(1), "%Y%m%d-%H%M%S")
            if first <= made_at <= last and read_state(folder).status == "running":
                found.append(folder)
    return found[0] if len(found) == 1 else None


def _end_folder(folder: Path, status: str) -> str:
    """`status` (`failed`, `cancelled`) into the folder's state.json if it says `running`; says
    what was done."""
    if not RunLayout(folder).state.is_file():
        return f"its run folder {folder} has no state.json"
    try:
        was = read_state(folder).status
        if was != "running":
            return f"its run folder {folder} says {was}"
        finish_run(str(folder), status)
    except (ValueError, OSError) as err:  # a damaged state.json: resume refuses it with this message
        return f"its run folder {folder} was left: {err}"
    return f"its run folder {folder} now says {status}"


def _live_flow_run_ids() -> set[UUID] | None:
    """The flow runs whose flow-run process runs on this machine (readable ones: this user's);
    None without /proc."""
    if not (_PROC / "self" / "environ").exists():
        return None
    live = set()
    for proc in _PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"prefect.engine" not in argv:
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or another user's
            continue
        for var in environ:
            if var.startswith(b"PREFECT__FLOW_RUN_ID="):
                with contextlib.suppress(ValueError):  # not a run id: no flow-run process of ours
                    live.add(UUID(var.split(b"=", 1)[1].decode()))
    return live
