"""The experiment flow: create or resume a run, warm up the policy, run N iterations.

`libra run` and the deployments of `libra serve` (UI, API, nightly schedule) call this same flow.
The rollout pool is stopped whatever happens, and the run's state says how it ended (a run
cancelled from the UI gets SIGTERM, which Prefect raises as TerminationSignal); a failed or
cancelled run resumes from its last checkpoint with `libra run --resume RUN_DIR`.
"""

from __future__ import annotations

from prefect import flow
from prefect.exceptions import TerminationSignal

from flows.rl_iteration import rl_iteration
from libra_core.pipeline.run_dir import load_run_config
from tasks.artifacts import run_artifacts_task
from tasks.setup import create_run_task, finish_run_task, prepare_policy_task
from tasks.stages import stop_pool_task


@flow(name="rl-experiment", log_prints=False)
def rl_experiment(
    config_path: str | None = None, overrides: list[str] | None = None, resume: str | None = None
) -> str:
    start = create_run_task(config_path, list(overrides or []), resume)
    run_dir = start.run_dir
    cfg = load_run_config(run_dir)
    status = "failed"
    try:
        if not start.resumed or start.start_iteration == 1:
            prepare_policy_task(run_dir)
        version = start.policy_version
        next_rollout = None  # async pipeline: the rollout that overlapped the previous update
        for iteration in range(start.start_iteration, cfg.experiment.iterations + 1):
            out = rl_iteration(run_dir, iteration, version, next_rollout)
            row, next_rollout = out["row"], out["next_rollout"]
            version = int(row["policy_version"])
        status = "finished"
    except (KeyboardInterrupt, TerminationSignal):
        status = "cancelled"
        raise
    finally:
        if status == "cancelled":
            # Cancelled from the UI (SIGTERM) or Ctrl-C: no more task runs, just make the folder
            # consistent: engines stopped, state says cancelled, resumable from its checkpoint.
            stop_pool_task.fn(run_dir)
            finish_run_task.fn(run_dir, status)
        else:
            stop_pool_task(run_dir)
            finish_run_task(run_dir, status)
            run_artifacts_task(run_dir)
    return run_dir
