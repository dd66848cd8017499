"""One iteration's history row, built from its stage results and wall times.

Called once per iteration by the iteration flow, after its last stage; the row then goes to
`record.record_iteration`. Its columns are `libra_core/data/history.py`'s (the history file's
schema), and each says which stage result it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libra_core.pipeline.plan_stage import Plan
from libra_core.pipeline.reward_stage import RewardResult
from libra_core.pipeline.rollout_stage import RolloutResult
from libra_core.pipeline.update_stage import UpdateStageResult


@dataclass(frozen=True)
class StageSeconds:
    """Wall seconds of each stage of one iteration (`eval_s` None: no evaluation ran)."""

    plan_s: float
    pool_s: float  # starting, resizing or waking the rollout engines for the plan
    rollout_s: float
    reward_s: float
    update_s: float
    sync_s: float
    iteration_s: float
    eval_s: float | None = None


def iteration_row(
    iteration: int,
    plan: Plan,
    rollout: RolloutResult,
    reward: RewardResult,
    stage: UpdateStageResult,
    seconds: StageSeconds,
    eval_accuracy: float | None = None,
) -> dict[str, Any]:
    """The history row of `iteration`. In async mode `rollout` ran on the previous plan's pool,
    so `rollout_instances` is that pool's size, not `plan.rollout_instances`."""
    update, selection, routing = stage.update, stage.selection, rollout.routing
    return {
        "iteration": iteration,
        "policy_version": update.new_version,
        "plan_s": seconds.plan_s,
        "pool_s": seconds.pool_s,
        "rollout_s": seconds.rollout_s,
        "reward_s": seconds.reward_s,
        "update_s": seconds.update_s,
        "sync_s": seconds.sync_s,
        "iteration_s": seconds.iteration_s,
        "eval_s": seconds.eval_s,
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
        "eval_accuracy": eval_accuracy,
        "rollout_tokens_per_s": rollout.tokens_per_s,
        "routing_moves": routing.moves,
        "routing_migrations": routing.migrations,
        "migrated_tokens": routing.migrated_tokens,
        "routing_class_accuracy": routing.class_accuracy,
        "migration_token_ratio": routing.migration_token_ratio,
        "optimizer_steps": update.num_optimizer_steps,
        "stale_dropped": selection.stale_dropped,
        "stale_recomputed": selection.stale_recomputed,
        "groups_filtered": selection.groups_filtered,
        "max_staleness_seen": selection.max_staleness_seen,
        "behavior_weight_mean": update.behavior_weight_mean,
        "train_reward_mean": selection.train_reward_mean,
        "train_response_tokens_mean": selection.train_response_tokens_mean,
        "response_tokens_p90": selection.all_response_tokens_p90,
        "train_response_tokens_p90": selection.train_response_tokens_p90,
        "rollout_instances": rollout.instances,
        "predicted_iteration_s": plan.predicted_iteration_s,
    }
