"""Reward stage: score each trajectory, write the rewarded IPC file and the lake partition."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from libra_core.data.io import read_ipc, write_ipc, write_lake
from libra_core.envs.registry import build_environment
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.training.advantages import mixed_group_share


@dataclass(frozen=True)
class RewardResult:
    path: str
    lake_path: str
    reward_mean: float
    accuracy: float
    mixed_group_share: float


def run_reward(run_dir: str, rollout_path: str, *, iteration: int) -> RewardResult:
    cfg = load_run_config(run_dir)
    env = build_environment(cfg.environment)
    table = read_ipc(rollout_path)
    refs = table.column("reference_answer").to_pylist()
    answers = table.column("final_answer").to_pylist()
    scores = [env.reward(r, a) for r, a in zip(refs, answers, strict=True)]
    rewards = np.array(scores, dtype=np.float32)
    idx = table.schema.get_field_index("reward")
    table = table.set_column(idx, table.schema.field("reward"), pa.array(rewards, type=pa.float32()))
    path = write_ipc(
        table, RunLayout(Path(run_dir)).stage_dir(iteration) / "rewarded.arrow", require_reward=True
    )
    lake = write_lake(table, run_dir, iteration)
    # counted on the environment's own floats: float32(0.7) < 0.7 wherever the comparison is not
    # made in float32 (NumPy before 2's scalar rules), and a `correct: 0.7` would count nothing
    best = cfg.environment.reward.correct
    correct = sum(s >= best for s in scores) / len(scores) if scores else 0.0
    return RewardResult(
        path=str(path),
        lake_path=str(lake),
        reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
        accuracy=correct,
        mixed_group_share=mixed_group_share(rewards, table.column("group_id").to_pylist()),
    )
