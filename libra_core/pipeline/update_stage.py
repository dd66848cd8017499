"""Update stage: one GRPO update of the policy folder from the rewarded trajectories."""

from __future__ import annotations

from pathlib import Path

from libra_core.data.io import read_ipc
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.training.update import UpdateResult, run_grpo_update


def run_update(run_dir: str, rewarded_path: str, *, iteration: int, version: int) -> UpdateResult:
    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    table = read_ipc(rewarded_path, require_reward=True)
    reference = layout.reference if cfg.training.grpo.kl_coef > 0 else None
    return run_grpo_update(
        layout.policy,
        layout.trainer,
        table,
        cfg.training,
        version=version,
        seed=cfg.experiment.seed * 7919 + iteration,
        reference_dir=reference,
    )
