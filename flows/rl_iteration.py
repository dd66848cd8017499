"""One RL iteration as a Prefect flow: plan -> rollout -> reward -> update -> sync (-> eval).

Returns the iteration's history row (stage wall times, tokens, rewards, update metrics). Each
stage is a task, so the Prefect UI shows the per-stage timeline of every iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prefect import flow

from libra_core.pipeline.run_dir import load_run_config
from tasks.stages import (
    eval_task,
    plan_task,
    reward_task,
    rollout_pool_task,
    rollout_task,
    sync_task,
    update_task,
)

T = TypeVar("T")


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@flow(name="rl-iteration", flow_run_name="iteration-{iteration}", log_prints=False)
def rl_iteration(run_dir: str, iteration: int, version: int) -> dict[str, Any]:
    start = time.perf_counter()
    cfg = load_run_config(run_dir)
    plan, plan_s = _timed(plan_task, run_dir, iteration)
    pool, pool_s = _timed(rollout_pool_task, run_dir, plan.rollout_instances)
    rollout, rollout_s = _timed(rollout_task, run_dir, pool, iteration, version)
    reward, reward_s = _timed(reward_task, run_dir, rollout.path, iteration)
    update, update_s = _timed(update_task, run_dir, reward.path, iteration, version)
    sync_s = 0.0
    if update.new_version != version:
        _, sync_s = _timed(sync_task, run_dir, pool)
    eval_acc = eval_s = None
    if cfg.eval.every and (iteration % cfg.eval.every == 0 or iteration == cfg.experiment.iterations):
        eval_acc, eval_s = _timed(eval_task, run_dir, pool, iteration, update.new_version)
    return {
        "iteration": iteration,
        "policy_version": update.new_version,
        "plan_s": plan_s + pool_s,
        "rollout_s": rollout_s,
        "reward_s": reward_s,
        "update_s": update_s,
        "sync_s": sync_s,
        "iteration_s": time.perf_counter() - start,
        "eval_s": eval_s,
        "tokens_generated": rollout.tokens_generated,
        "tokens_trained": update.num_tokens_trained,
        "num_trajectories": rollout.num_trajectories,
        "reward_mean": reward.reward_mean,
        "accuracy": reward.accuracy,
        "mixed_group_share": reward.mixed_group_share,
        "mean_response_tokens": rollout.mean_response_tokens,
        "tool_failure_share": rollout.tool_failure_share,
        "loss": update.loss,
        "clip_fraction": update.clip_fraction,
        "grad_norm": update.grad_norm,
        "eval_accuracy": eval_acc,
        "rollout_tokens_per_s": rollout.tokens_per_s,
    }
