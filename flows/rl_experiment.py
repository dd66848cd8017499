"""The experiment flow: create or resume a run, warm up the policy, run N iterations.

`libra run` and (later) deployments triggered from the Prefect UI call this same flow. The rollout
pool is stopped whatever happens, and the run's state says how it ended; a failed or cancelled run
resumes from its last checkpoint with `libra run --resume RUN_DIR`.
"""

from __future__ import annotations

from prefect import flow

from flows.rl_iteration import rl_iteration
from libra_core.pipeline.run_dir import load_run_config
from tasks.record import record_iteration_task
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
            record_iteration_task(run_dir, row)
            version = int(row["policy_version"])
        status = "finished"
    except KeyboardInterrupt:
        status = "cancelled"
        raise
    finally:
        stop_pool_task(run_dir)
        finish_run_task(run_dir, status)
    return run_dir
