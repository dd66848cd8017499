"""Update stage: choose the trajectories to train on, then one GRPO update of the policy folder.

The selection (libra_core.training.selection) applies the staleness bound and, when enabled,
dynamic sampling; the update uses decoupled PPO when `pipeline.decoupled_ppo` is set and the
pipeline is async (in sync mode every trajectory comes from the policy being updated, so the
proximal policy is the behaviour policy and its recompute pass, about a third of the update's time
on the default experiment, would only reproduce the engine's log-probs). Both results
go to the history, so the bias of what was trained on against what was generated is visible.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libra_core.config.pipeline import PipelineConfig
from libra_core.data.io import read_ipc
from libra_core.pipeline.cpu_split import cpu_threads
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.training.advantages import mixed_group_share
from libra_core.training.selection import SelectionStats, select_for_update
from libra_core.training.update import UpdateResult, run_grpo_update

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateStageResult:
    update: UpdateResult
    selection: SelectionStats


def _skipped(version: int, rewards: np.ndarray, group_ids: list[str], wall_s: float) -> UpdateResult:
    """The result of an update that had nothing to train on (every trajectory filtered out)."""
    return UpdateResult(
        loss=0.0,
        pg_loss=0.0,
        num_tokens_trained=0,
        num_trajectories=0,
        num_optimizer_steps=0,
        clip_fraction=0.0,
        ratio_mean=1.0,
        approx_kl=0.0,
        kl_ref=None,
        grad_norm=0.0,
        reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
        reward_std=float(rewards.std()) if len(rewards) else 0.0,
        mixed_group_share=mixed_group_share(rewards, group_ids),
        new_version=version,
        behavior_weight_mean=1.0,
        wall_s=wall_s,
    )


def uses_decoupled_ppo(pipeline: PipelineConfig) -> bool:
    """Decoupled PPO needs a proximal pass only when trajectories can lag the policy (async)."""
    return pipeline.decoupled_ppo and pipeline.mode == "async"


def run_update(run_dir: str, rewarded_path: str, *, iteration: int, version: int) -> UpdateStageResult:
    start = time.perf_counter()
    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    table = read_ipc(rewarded_path, require_reward=True)
    pipeline = cfg.pipeline
    max_groups = cfg.rollout.prompts_per_iteration if pipeline.dynamic_sampling.enabled else None
    chosen = select_for_update(table, version=version, pipeline=pipeline, max_groups=max_groups)
    if chosen.stats.groups_over_cap:
        log.info(
            "iteration %d: %d groups with reward signal left out over the cap of %s (over-sampled)",
            iteration,
            chosen.stats.groups_over_cap,
            max_groups,
        )
    if chosen.table.num_rows == 0:
        rewards = np.asarray(table.column("reward").to_numpy(zero_copy_only=False), dtype=np.float64)
        skipped = _skipped(
            version, rewards, table.column("group_id").to_pylist(), time.perf_counter() - start
        )
        return UpdateStageResult(skipped, chosen.stats)
    reference = layout.reference if cfg.training.grpo.kl_coef > 0 else None
    _, trainer_threads = cpu_threads(cfg)
    result = run_grpo_update(
        layout.policy,
        layout.trainer,
        chosen.table,
        cfg.training.model_copy(update={"threads": trainer_threads}),
        version=version,
        seed=cfg.experiment.seed * 7919 + iteration,
        reference_dir=reference,
        decoupled=uses_decoupled_ppo(pipeline),
        behavior_weight_cap=pipeline.behavior_weight_cap,
        recompute=chosen.recompute,
        temperature=cfg.rollout.temperature,
    )
    return UpdateStageResult(result, chosen.stats)
