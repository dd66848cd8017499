"""Which minibatches one GRPO update steps on, and what its history reports for them.

The rows with signal (a nonzero advantage and at least one policy token) set the optimizer steps;
zero-advantage rows kept for the KL term ride along in those steps and never add one.
"""

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from libra_core.config.training import GRPOConfig, OptimizerConfig, TrainingConfig
from libra_core.data.schema import table_from_rows
from libra_core.training.checkpoint import OPTIMIZER_FILE
from libra_core.training.update import run_grpo_update
from tests.training.builders import make_row, tiny_qwen2

# Two groups with mixed rewards (signal) and six whose rewards are all equal (advantage 0).
GROUPS = {
    "m1": [1.0, 0.0],
    "m2": [0.0, 1.0, 1.0],
    "u1": [1.0, 1.0],
    "u2": [0.0, 0.0],
    "u3": [1.0, 1.0, 1.0],
    "u4": [0.0, 0.0],
    "u5": [1.0, 1.0],
    "u6": [0.0, 0.0],
}


def _table(groups: dict[str, list[float]]) -> pa.Table:
    """One row per reward; responses of 1 to 3 tokens, so minibatches differ in their token counts."""
    rows = []
    for k, (group, rewards) in enumerate(groups.items()):
        for i, reward in enumerate(rewards):
            response = [4 + i, 10 + k, 20 + (i + k) % 10][: 1 + (i + k) % 3]
            rows.append(
                make_row(
                    prompt_ids=[1, 2, 3], response_ids=response, group_id=group, sample_index=i, reward=reward
                )
            )
    return table_from_rows(rows)


def _cfg(*, minibatches: int, kl_coef: float = 0.0, whole_groups: bool = True) -> TrainingConfig:
    return TrainingConfig(
        device="cpu",
        threads=1,
        optimizer=OptimizerConfig(lr=1e-3),
        grpo=GRPOConfig(minibatches=minibatches, kl_coef=kl_coef, whole_groups=whole_groups),
    )


def _adam_steps(state_dir: Path) -> int:
    return int(torch.load(state_dir / OPTIMIZER_FILE, weights_only=True)["state"][0]["step"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kl_term_adds_no_optimizer_step(tmp_path: Path, seed: int) -> None:
    """Two groups with signal give two steps whatever kl_coef is. The zero-advantage groups kept for
    the KL term were dealt as groups of their own, so with kl_coef=1e-12 a step could hold only them:
    no policy gradient, yet Adam's momentum moved the weights and the version advanced."""
    table = _table(GROUPS)
    all_tokens = sum(len(r) for r in table.column("response_ids").to_pylist())
    signal_tokens = sum(
        len(r)
        for r, g in zip(*table.select(["response_ids", "group_id"]).to_pydict().values(), strict=True)
        if g.startswith("m")
    )
    reference = tmp_path / "reference"
    tiny_qwen2(0).save_pretrained(reference)
    for kl_coef in (0.0, 1e-12, 0.1):
        policy, state = tmp_path / f"policy{kl_coef}", tmp_path / f"state{kl_coef}"
        shutil.copytree(reference, policy)
        result = run_grpo_update(
            policy,
            state,
            table,
            _cfg(minibatches=4, kl_coef=kl_coef),
            version=0,
            seed=seed,
            reference_dir=reference,
        )
        assert result.num_optimizer_steps == 2, kl_coef
        assert result.new_version == 2 and _adam_steps(state) == 2
        # every zero-advantage row still feeds the KL term when there is one
        assert result.num_tokens_trained == (all_tokens if kl_coef > 0 else signal_tokens)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_minibatch_without_policy_tokens_takes_no_step(policy_dir: Path, tmp_path: Path, seed: int) -> None:
    """An empty response (cut off before its first token) has a nonzero advantage but nothing to
    train: it used to become a minibatch of its own, with a zero gradient that Adam still stepped
    on (momentum moved the weights) and counted as a version."""
    table = table_from_rows(
        [
            make_row(prompt_ids=[1, 2, 3], response_ids=[6, 7, 8], group_id="a", sample_index=0, reward=1.0),
            make_row(prompt_ids=[1, 2, 3], response_ids=[], group_id="a", sample_index=1, reward=0.0),
        ]
    )
    state = tmp_path / "state"
    result = run_grpo_update(
        policy_dir, state, table, _cfg(minibatches=2, whole_groups=False), version=0, seed=seed
    )
    assert result.num_optimizer_steps == 1 and result.new_version == 1
    assert _adam_steps(state) == 1
    assert result.num_tokens_trained == 3


def test_reported_loss_is_pg_loss_plus_kl_coef_times_kl_ref(policy_dir: Path, tmp_path: Path) -> None:
    """`loss` is documented as pg_loss + kl_coef * kl_ref, each the history's own mean. It was the
    mean of the per-step losses weighted by all trained tokens, while pg_loss is weighted by the
    tokens with an advantage, so the two disagreed whenever the steps' shares of those differed."""
    reference = tmp_path / "reference"
    tiny_qwen2(1).save_pretrained(reference)  # another policy: the KL term is not 0
    result = run_grpo_update(
        policy_dir,
        tmp_path / "state",
        _table(GROUPS),
        _cfg(minibatches=2, kl_coef=0.5),
        version=0,
        seed=0,
        reference_dir=reference,
    )
    assert result.num_optimizer_steps == 2
    assert result.kl_ref is not None and result.kl_ref > 1e-3
    assert result.loss == pytest.approx(result.pg_loss + 0.5 * result.kl_ref, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_a_zero_advantage_row_of_a_mixed_group_stays_with_its_group(seed: int) -> None:
    # A reward equal to its group's mean has advantage 0: with the KL term on, the row was dealt
    # round-robin apart from its group's rows with signal, splitting the group (`whole_groups`).
    import numpy as np

    from libra_core.training.advantages import group_advantages
    from libra_core.training.update import _deal_minibatches

    rewards = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 1.0])
    groups = ["a"] * 3 + ["b"] * 3 + ["c"] * 2
    advantages = group_advantages(rewards, groups, scale_by_std=True, negative_weight=1.0)
    signal = advantages.astype(np.float32) != 0
    labels = np.asarray(groups, dtype=str)
    parts = _deal_minibatches(signal, labels, 4, True, seed)
    assert sorted(int(i) for part in parts for i in part) == list(range(8))  # every row once
    for group in ("a", "b", "c"):
        assert sum(group in set(labels[part].tolist()) for part in parts) == 1, (group, parts)
    assert all(signal[part].any() for part in parts)  # no part without a policy gradient
