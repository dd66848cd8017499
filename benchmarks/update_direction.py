"""Does one GRPO update move the policy the right way on a real rewarded batch?

    .venv/bin/python benchmarks/update_direction.py RUN_DIR [--iteration 5] [--lr 3e-4]

Copies the policy that generated `stages/iteration=N/rewarded.arrow` (checkpoint `iter_{N-1}`,
which must be a kept checkpoint) and the run's AdamW state, applies one update on that batch with
the given learning rate, and prints the mean change of each trajectory's summed policy-token
log-prob, split by the sign of its GRPO advantage. Positive-advantage trajectories should gain
relative to negative-advantage ones.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    import torch

    from libra_core.config.models import OptimizerConfig, TrainingConfig
    from libra_core.data.io import read_ipc
    from libra_core.training.advantages import group_advantages
    from libra_core.training.checkpoint import load_policy
    from libra_core.training.logprobs import token_logprobs
    from libra_core.training.update import run_grpo_update

    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--iteration", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    table = read_ipc(
        args.run_dir / "stages" / f"iteration={args.iteration:05d}" / "rewarded.arrow", require_reward=True
    )
    rows = table.to_pylist()

    def summed_logprobs(policy: Path) -> np.ndarray:
        model = load_policy(policy, torch.device("cpu"))
        out = []
        with torch.no_grad():
            for r in rows:
                ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
                lp = token_logprobs(model, ids, torch.ones_like(ids))[0].numpy()[len(r["prompt_ids"]) - 1 :]
                out.append(float((lp * np.array(r["loss_mask"])).sum()))
        return np.array(out)

    adv = group_advantages(
        np.array([r["reward"] for r in rows]), [r["group_id"] for r in rows], scale_by_std=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy"
        source = args.run_dir / "checkpoints" / f"iter_{args.iteration - 1:05d}" / "policy"
        if not source.is_dir():
            kept = sorted(p.name for p in (args.run_dir / "checkpoints").glob("iter_*"))
            raise SystemExit(f"{source} is missing; pick --iteration one past a kept checkpoint: {kept}")
        shutil.copytree(source, policy)
        if (source.parent / "trainer").is_dir():  # continue with the run's AdamW state
            shutil.copytree(source.parent / "trainer", Path(tmp) / "state")
        before = summed_logprobs(policy)
        cfg = TrainingConfig(optimizer=OptimizerConfig(lr=args.lr))
        result = run_grpo_update(policy, Path(tmp) / "state", table, cfg, version=0, seed=0)
        delta = summed_logprobs(policy) - before
    print(f"optimizer steps {result.num_optimizer_steps}, clip fraction {result.clip_fraction:.3f}")
    print(
        f"mean change of summed log-prob: advantage>0 {delta[adv > 0].mean():+.3f}, "
        f"advantage<0 {delta[adv < 0].mean():+.3f}, advantage=0 {delta[adv == 0].mean():+.3f}"
    )


if __name__ == "__main__":
    main()
