"""The experiment flow: create or resume a run, warm up the policy, run N iterations.

`libra run` and the deployments of `libra serve` (UI, API, nightly schedule) call this same flow.
The rollout pool is stopped whatever happens, and the run's state says how it ended (a run
cancelled from the UI gets SIGTERM, which Prefect raises as TerminationSignal); a failed or
cancelled run resumes from its last checkpoint with `libra run --resume RUN_DIR`.

A Cancel on an `iteration-N` page stops the experiment after that iteration: the iteration is a
subflow in this process, which Prefect does not signal, so the flow reads its state between
iterations, as it reads its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from uuid import UUID

from prefect import flow, get_client
from prefect.client.schemas.objects import State, StateType
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled

from flows.rl_iteration import rl_iteration
from libra_core.observability.progress import report
from libra_core.pipeline.run_dir import load_run_config, read_state
from libra_core.pipeline.run_lock import held_runs
from tasks.artifacts import run_artifacts_task
from tasks.setup import create_run_task, finish_run_task, prepare_policy_task, release_run
from tasks.stages import stop_pool_task

log = logging.getLogger(__name__)


_STOPPING = (StateType.CANCELLING, StateType.CANCELLED)


def cancel_requested(iteration_run_id: str | None = None) -> str | None:
    """Which run asked to cancel this experiment ("rl-experiment" or "iteration-N"), or None;
    asked between iterations.

    - Its own state: the runner's SIGTERM normally raises TerminationSignal in this flow; should it
      be lost (CI once saw a run marked CANCELLED whose folder still said "running"; not
      reproduced since), the run would go on until the runner's SIGKILL 30 s later, its state
      stale and its engines orphaned.
    - The iteration just finished (`iteration_run_id`): a Cancel on its page reaches no process.
      That run is then marked CANCELLED, its page having said "Cancelling" since the click.
    """
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            own = client.read_flow_run(ctx.flow_run.id).state
            if own is not None and own.type in _STOPPING:
                return "rl-experiment"
            if iteration_run_id is None:
                return None
            child = client.read_flow_run(UUID(iteration_run_id))
            if child.state is None or child.state.type not in _STOPPING:
                return None
            if child.state.type is StateType.CANCELLING:
                done: State = Cancelled(message="The experiment stopped after this iteration.")
                client.set_flow_run_state(child.id, done, force=True)
            return child.name
    except Exception as err:  # an API blip must not stop a run; the next iteration asks again
        log.warning("could not read the flow runs' states: %s", err)
        return None


started_runs: list[str] = []  # run folders this process started or resumed, newest last


@flow(name="rl-experiment", log_prints=False)
def rl_experiment(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    resume: str | None = None,
    base_dir: str | None = None,
) -> str | State:
    """One experiment run, new or resumed; returns its run folder (a CANCELLED state when a cancel
    was seen between iterations).

    Args:
        config_path: the experiment's YAML config (None: the defaults); not read when `resume`
            is set (the run's own resolved config resumes, with `overrides`).
        overrides: `key.path=value` changes to it, as `libra run --set` takes them.
        resume: a run folder to continue from its last checkpoint instead of starting a new run.
        base_dir: the folder that relative paths resolve against: `config_path`, `resume` and the
            config's `experiment.output_dir`. `libra serve` sets it to its working folder at start;
            None (`libra run`): this process's working folder.
    """
    status = "failed"
    cancelled_from = None
    run_dir: str | None = None
    held = set(held_runs())
    try:
        start = create_run_task(config_path, list(overrides or []), resume, base_dir)
        run_dir = start.run_dir
        started_runs.append(run_dir)  # for `libra run`'s interrupt message
        cfg = load_run_config(run_dir)
        if start.start_iteration > 1:  # a resumed run's progress bar starts at the iterations done
            report("iterations", start.start_iteration - 1, cfg.experiment.iterations)
        if not start.resumed or start.start_iteration == 1:
            prepare_policy_task(run_dir)
        version = start.policy_version
        next_rollout = None  # async pipeline: the rollout that overlapped the previous update
        for iteration in range(start.start_iteration, cfg.experiment.iterations + 1):
            out = rl_iteration(run_dir, iteration, version, next_rollout)
            row, next_rollout = out["row"], out["next_rollout"]
            version = int(row["policy_version"])
            if iteration < cfg.experiment.iterations:
                cancelled_from = cancel_requested(out.get("flow_run_id"))
                if cancelled_from is not None:
                    break
        status = "finished" if cancelled_from is None else "cancelled"
    except (KeyboardInterrupt, TerminationSignal):
        status = "cancelled"
        raise
    finally:
        if run_dir is None:
            _end_unreturned_start(held, status)
        else:
            _end_run(run_dir, status)
    if cancelled_from is not None:  # the flow run ends CANCELLED; calling the flow raises CancelledRun
        log.warning("run %s cancelled from %s; resume it with `libra run --resume`", run_dir, cancelled_from)
        return Cancelled(message=f"Cancelled from {cancelled_from}; the run folder is {run_dir}.")
    return run_dir


def _end_run(run_dir: str, status: str) -> None:
    """Make the run folder say how the run ended (`status`), stop its engines, release its lock."""
    try:
        if status == "cancelled":
            # Cancelled from the UI (SIGTERM, or seen between iterations) or Ctrl-C: no more task
            # runs, just make the folder consistent: state says cancelled, engines stopped,
            # resumable from its checkpoint.
            # The state goes first: it takes milliseconds, while stopping engines can outlast the
            # runner's grace period (30 s, then SIGKILL) on a loaded machine.
            try:
                finish_run_task.fn(run_dir, status)
            finally:
                stop_pool_task.fn(run_dir)
        else:
            # Each step whatever the one before did: a pool that fails to stop (or a task call
            # that fails, the API being down) must not leave the state at `running`.
            try:
                stop_pool_task(run_dir)
            finally:
                try:
                    finish_run_task(run_dir, status)
                finally:
                    run_artifacts_task(run_dir)
    finally:
        release_run.fn(run_dir)  # the folder's lock, taken by create_run_task


def _end_unreturned_start(held_before: set[Path], status: str) -> None:
    """End the folder the create-run task made or restored, and locked, if the flow never got it
    back: a Ctrl-C or a cancel's SIGTERM landed after the folder said `running`, before the task
    returned (seen on a loaded machine, a Ctrl-C 2 s after the folder appeared), or the task failed
    after taking the lock. Until 2026-12-07 such a folder said `running` for good."""
    for folder in set(held_runs()) - held_before:
        try:
            if read_state(folder).status == "running":
                finish_run_task.fn(str(folder), status)
        except (OSError, ValueError) as err:  # interrupted before its state.json was written
            log.warning("run folder %s left as it was: %s", folder, err)
        finally:
            release_run.fn(str(folder))
