"""The stage tasks of one RL iteration: plan -> rollout -> reward -> update -> sync (+ eval)."""

from __future__ import annotations

import threading
from pathlib import Path

from prefect import task

from libra_core.pipeline.cpu_split import cpu_threads
from libra_core.pipeline.plan_stage import Plan, make_plan
from libra_core.pipeline.reward_stage import RewardResult, run_reward
from libra_core.pipeline.rollout_stage import RolloutResult, run_greedy_eval, run_rollout
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.pipeline.sync_stage import SyncResult, sync_pool
from libra_core.pipeline.update_stage import UpdateStageResult, run_update
from libra_core.pools.rollout import (
    PoolInfo,
    ensure_rollout_pool,
    live_pool,
    replacing_unresponsive,
    served_version,
    stop_rollout_pool,
)
from libra_core.pools.trainer import run_on_trainer, stop_trainer_pool, trainer_pid, warm_trainer
from tasks.common import TASK_OPTIONS


def pool_id(run_dir: str) -> str:
    return f"rollout:{Path(run_dir).name}"


def trainer_pool_id(run_dir: str) -> str:
    return f"trainer:{Path(run_dir).name}"


@task(name="plan", **TASK_OPTIONS)
def plan_task(run_dir: str, iteration: int) -> Plan:
    return make_plan(load_run_config(run_dir), iteration, run_dir)


@task(name="rollout-pool", **TASK_OPTIONS)
def rollout_pool_task(run_dir: str, size: int, version: int) -> PoolInfo:
    """Bring the rollout pool to `size` healthy vLLM instances serving the run's policy folder
    (which holds `version`)."""
    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    max_len = getattr(cfg.model, "max_position_embeddings", cfg.rollout.max_total_tokens)
    engine_threads, train_threads = cpu_threads(cfg)
    warming = None
    # async: the trainer process starts while the engines do (once; this task runs every iteration)
    if cfg.pipeline.mode == "async" and trainer_pid(trainer_pool_id(run_dir)) is None:
        warming = threading.Thread(
            target=warm_trainer,
            args=(trainer_pool_id(run_dir), cfg.pools.local, train_threads, run_update.__module__),
            name="warm-trainer",
            daemon=True,
        )
        warming.start()
    try:
        return ensure_rollout_pool(
            pool_id(run_dir),
            layout.policy,
            cfg.rollout.engine.model_copy(update={"cpu_threads": engine_threads}),
            layout.logs,
            size=size,
            max_model_len=max_len,
            dtype=cfg.model.dtype,
            version=version,
        )
    finally:
        # Also when the engines fail to start: a trainer registered after the run's clean-up has
        # stopped the pools would outlive it.
        if warming is not None:
            warming.join()


@task(name="stop-rollout-pool", **TASK_OPTIONS)
def stop_pool_task(run_dir: str) -> None:
    stop_rollout_pool(pool_id(run_dir))
    stop_trainer_pool(trainer_pool_id(run_dir))


@task(name="rollout", retries=1, retry_delay_seconds=2, **TASK_OPTIONS)
def rollout_task(run_dir: str, pool: PoolInfo, iteration: int) -> RolloutResult:
    """Sample the iteration's trajectories; tokens are labelled with the version the pool serves at
    the start of each turn (a sync during the rollout advances it)."""
    live = live_pool(pool.pool_id)  # on a retry, a crashed or hung engine has been replaced
    with replacing_unresponsive(pool.pool_id):
        return run_rollout(
            run_dir,
            live.urls,
            live.instance_ids,
            iteration=iteration,
            version=lambda: served_version(pool.pool_id),
        )


@task(name="reward", **TASK_OPTIONS)
def reward_task(run_dir: str, rollout_path: str, iteration: int) -> RewardResult:
    return run_reward(run_dir, rollout_path, iteration=iteration)


@task(name="update", **TASK_OPTIONS)
def update_task(run_dir: str, rewarded_path: str, iteration: int, version: int) -> UpdateStageResult:
    """One GRPO update. In async mode it runs in the run's trainer process (it overlaps the next
    rollout, whose client code would otherwise share this process's interpreter lock)."""
    cfg = load_run_config(run_dir)
    if cfg.pipeline.mode != "async":
        return run_update(run_dir, rewarded_path, iteration=iteration, version=version)
    _, threads = cpu_threads(cfg)
    return run_on_trainer(
        trainer_pool_id(run_dir),
        cfg.pools.local,
        threads,
        run_update,
        run_dir,
        rewarded_path,
        iteration=iteration,
        version=version,
    )


@task(name="sync", retries=2, retry_delay_seconds=1, **TASK_OPTIONS)
def sync_task(run_dir: str, pool: PoolInfo, version: int) -> SyncResult:
    cfg = load_run_config(run_dir)
    with replacing_unresponsive(pool.pool_id):  # a retry syncs the hung engine's replacement
        return sync_pool(
            pool.pool_id,
            str(RunLayout(Path(run_dir)).policy),
            version,
            timeout_s=cfg.rollout.engine.request_timeout_s,
        )


@task(name="eval", **TASK_OPTIONS)
def eval_task(run_dir: str, pool: PoolInfo, iteration: int, version: int) -> float:
    live = live_pool(pool.pool_id)
    with replacing_unresponsive(pool.pool_id):
        return run_greedy_eval(run_dir, live.urls, live.instance_ids, iteration=iteration, version=version)
