import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from libra_core.config.training import GRPOConfig, OptimizerConfig, TrainingConfig
from libra_core.data.schema import table_from_rows
from libra_core.training.advantages import group_advantages
from libra_core.training.batch import build_batch
from libra_core.training.checkpoint import OPTIMIZER_FILE, WEIGHTS_FILE, load_policy
from libra_core.training.logprobs import token_logprobs
from libra_core.training.update import run_grpo_update, warmup_lr
from tests.training.builders import make_row

PROMPTS = {"a": [1, 2, 3], "b": [4, 5]}
RESPONSES = [  # (group, response, loss_mask); the 0-masked tokens play tool results
    ("a", [6, 7, 8, 9], [1, 1, 0, 1]),
    ("a", [10, 11, 12], [1, 1, 1]),
    ("b", [13, 14, 15, 16, 17], [1, 0, 0, 1, 1]),
    ("b", [18, 19], [1, 1]),
]
NUM_POLICY_TOKENS = 3 + 3 + 3 + 2


def _table(policy_dir: Path, rewards: list[float]) -> pa.Table:
    """Trajectories whose behaviour log-probs are the policy's own (ratio 1 at the first step)."""
    rows = [
        make_row(
            prompt_ids=PROMPTS[g],
            response_ids=r,
            loss_mask=m,
            group_id=g,
            sample_index=i,
            reward=rewards[i],
            behavior_logprobs=[0.0] * len(r),
        )
        for i, (g, r, m) in enumerate(RESPONSES)
    ]
    draft = table_from_rows([{**row, "loss_mask": [0] * len(row["response_ids"])} for row in rows])
    batch = build_batch(draft, np.zeros(len(rows)), pad_id=0)
    with torch.no_grad():
        logp = token_logprobs(load_policy(policy_dir, "cpu"), batch.input_ids, batch.attention_mask)
    for i, row in enumerate(rows):
        start = len(row["prompt_ids"]) - 1
        own = logp[i, start : start + len(row["response_ids"])].tolist()
        row["behavior_logprobs"] = [lp if m else 0.0 for lp, m in zip(own, row["loss_mask"], strict=True)]
    return table_from_rows(rows)


def _cfg(*, minibatches: int = 2, lr: float = 1e-3, kl_coef: float = 0.0) -> TrainingConfig:
    return TrainingConfig(
        device="cpu",
        threads=1,
        optimizer=OptimizerConfig(lr=lr),
        grpo=GRPOConfig(minibatches=minibatches, kl_coef=kl_coef),
    )


def _surrogate(policy_dir: Path, table: pa.Table) -> float:
    """sum_i A_i * mean log-prob of trajectory i's policy tokens: what a GRPO step should increase."""
    adv = group_advantages(
        np.asarray(table.column("reward").to_pylist()),
        table.column("group_id").to_pylist(),
        scale_by_std=True,
    )
    batch = build_batch(table, adv, pad_id=0)
    with torch.no_grad():
        logp = token_logprobs(load_policy(policy_dir, "cpu"), batch.input_ids, batch.attention_mask)
    per_traj = (logp * batch.loss_mask).sum(1) / batch.loss_mask.sum(1)
    return float((batch.advantages * per_traj).sum())


def _assert_same_weights(a_dir: Path, b_dir: Path) -> None:
    a, b = load_file(str(a_dir / WEIGHTS_FILE)), load_file(str(b_dir / WEIGHTS_FILE))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_update_changes_weights_and_resumes_optimizer(policy_dir: Path, tmp_path: Path):
    state_dir = tmp_path / "state"
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    before = load_file(str(policy_dir / WEIGHTS_FILE))

    result = run_grpo_update(policy_dir, state_dir, table, _cfg(), version=3, seed=0)

    after = load_file(str(policy_dir / WEIGHTS_FILE))
    assert after.keys() == before.keys() and "lm_head.weight" in after
    assert all(after[k].dtype == torch.float32 for k in after)
    assert not torch.equal(after["lm_head.weight"], before["lm_head.weight"])
    assert not torch.equal(
        after["model.layers.0.mlp.down_proj.weight"], before["model.layers.0.mlp.down_proj.weight"]
    )
    assert sorted(p.name for p in policy_dir.iterdir()) == [
        "config.json",
        "generation_config.json",
        WEIGHTS_FILE,
    ]
    # The folder still loads as an HF model, with the new weights.
    reloaded = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    assert torch.equal(reloaded.lm_head.weight.detach(), after["lm_head.weight"])

    assert result.new_version == 3 + 2  # one version per optimizer step
    assert result.num_optimizer_steps == 2
    assert result.num_tokens_trained == NUM_POLICY_TOKENS
    assert result.num_trajectories == 4
    assert result.reward_mean == pytest.approx(0.525)
    assert result.mixed_group_share == 1.0
    assert result.kl_ref is None
    assert result.grad_norm > 0
    assert 0.9 < result.ratio_mean < 1.1  # 1 exactly on the first minibatch, near 1 on the second

    saved = torch.load(state_dir / OPTIMIZER_FILE, weights_only=True)
    assert int(saved["state"][0]["step"]) == 2

    second = run_grpo_update(policy_dir, state_dir, table, _cfg(), version=result.new_version, seed=1)
    assert second.new_version == 5 + 2
    assert int(torch.load(state_dir / OPTIMIZER_FILE, weights_only=True)["state"][0]["step"]) == 4


def test_warmup_lr_ramps_then_holds() -> None:
    assert [warmup_lr(step, 1e-4, 4) for step in range(6)] == pytest.approx(
        [2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4]
    )
    assert warmup_lr(0, 1e-4, 0) == 1e-4


@pytest.mark.parametrize(("version", "expected_lr"), [(0, 2.5e-4), (2, 7.5e-4), (9, 1e-3)])
def test_update_uses_the_warmed_up_lr_for_its_step(
    policy_dir: Path, tmp_path: Path, version: int, expected_lr: float
) -> None:
    # A fresh AdamW's first step moves every weight with a non-zero gradient by exactly the lr
    # (m/sqrt(v) = sign(g)), so the largest weight change reads back the lr the step used.
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    before = load_file(str(policy_dir / WEIGHTS_FILE))
    cfg = _cfg(minibatches=1).model_copy(update={"optimizer": OptimizerConfig(lr=1e-3, lr_warmup_steps=4)})
    run_grpo_update(policy_dir, tmp_path / "state", table, cfg, version=version, seed=0)
    after = load_file(str(policy_dir / WEIGHTS_FILE))
    largest = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert largest == pytest.approx(expected_lr, rel=1e-3)


def test_update_increases_the_surrogate(policy_dir: Path, tmp_path: Path):
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    before = _surrogate(policy_dir, table)
    result = run_grpo_update(
        policy_dir, tmp_path / "state", table, _cfg(minibatches=1, lr=1e-3), version=0, seed=0
    )
    # One on-policy step: ratio exactly 1, nothing clipped, and the advantage-weighted log-prob goes up.
    assert result.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert result.clip_fraction == 0.0
    assert result.approx_kl == pytest.approx(0.0, abs=1e-6)
    assert _surrogate(policy_dir, table) > before + 1e-4


def test_zero_advantages_leave_weights_untouched(policy_dir: Path, tmp_path: Path):
    state_dir = tmp_path / "state"
    table = _table(policy_dir, rewards=[1.0, 1.0, 0.1, 0.1])  # each group uniform: no signal
    weights = (policy_dir / WEIGHTS_FILE).read_bytes()

    result = run_grpo_update(policy_dir, state_dir, table, _cfg(), version=7, seed=0)

    assert (policy_dir / WEIGHTS_FILE).read_bytes() == weights
    assert not (state_dir / OPTIMIZER_FILE).exists()
    assert result.new_version == 7
    assert result.num_optimizer_steps == 0 and result.num_tokens_trained == 0
    assert result.mixed_group_share == 0.0
    assert result.reward_mean == pytest.approx(0.55)
    # no step, no ratio: 1, as the update stage's result for an all-filtered batch (it read 0)
    assert result.ratio_mean == 1.0 and result.behavior_weight_mean == 1.0


def test_kl_penalty_uses_the_reference(policy_dir: Path, tmp_path: Path):
    reference_dir = tmp_path / "reference"
    shutil.copytree(policy_dir, reference_dir)
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    with pytest.raises(ValueError, match="reference_dir"):
        run_grpo_update(policy_dir, tmp_path / "state", table, _cfg(kl_coef=0.1), version=0, seed=0)

    # One minibatch from a policy identical to the reference: KL is 0 before the step.
    first = run_grpo_update(
        policy_dir,
        tmp_path / "state",
        table,
        _cfg(minibatches=1, kl_coef=0.1),
        version=0,
        seed=0,
        reference_dir=reference_dir,
    )
    assert first.kl_ref == pytest.approx(0.0, abs=1e-7)
    # The policy has moved away from the reference now, so the next update sees a positive KL.
    second = run_grpo_update(
        policy_dir,
        tmp_path / "state",
        table,
        _cfg(minibatches=1, kl_coef=0.1),
        version=1,
        seed=0,
        reference_dir=reference_dir,
    )
    assert second.kl_ref is not None and second.kl_ref > 1e-9
    assert second.loss == pytest.approx(second.pg_loss + 0.1 * second.kl_ref, rel=1e-5)


def test_rejects_unrewarded_table(policy_dir: Path, tmp_path: Path, row):
    table = table_from_rows([row(prompt_ids=[1], response_ids=[2], reward=None)])
    with pytest.raises(ValueError, match="reward is null"):
        run_grpo_update(policy_dir, tmp_path / "state", table, _cfg(), version=0, seed=0)


def test_decoupled_update_on_fresh_data_matches_on_policy(policy_dir: Path, tmp_path: Path):
    """Zero staleness: proximal == behaviour, so decoupled PPO takes the same steps."""
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    other = tmp_path / "other"
    shutil.copytree(policy_dir, other)
    plain = run_grpo_update(policy_dir, tmp_path / "s1", table, _cfg(), version=0, seed=0)
    dec = run_grpo_update(other, tmp_path / "s2", table, _cfg(), version=0, seed=0, decoupled=True)
    assert dec.behavior_weight_mean == pytest.approx(1.0, abs=1e-5)
    assert plain.behavior_weight_mean == 1.0
    _assert_same_weights(policy_dir, other)


def test_recompute_replaces_stale_behaviour_logprobs(policy_dir: Path, tmp_path: Path):
    """Rows marked for recompute train as if their behaviour log-probs were the policy's own."""
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.1, 1.0])
    rows = table.to_pylist()
    rows[1]["behavior_logprobs"] = [-9.0] * len(rows[1]["response_ids"])  # a very stale sample
    stale = table_from_rows(rows)
    other = tmp_path / "other"
    shutil.copytree(policy_dir, other)
    run_grpo_update(policy_dir, tmp_path / "s1", table, _cfg(), version=0, seed=0)
    mask = np.array([False, True, False, False])
    run_grpo_update(other, tmp_path / "s2", stale, _cfg(), version=0, seed=0, recompute=mask)
    _assert_same_weights(policy_dir, other)


def test_rows_without_signal_are_left_out_of_the_steps(policy_dir: Path, tmp_path: Path):
    """Group b's rewards are equal (advantage 0): the update trains on group a's tokens only and
    ends where an update on group a alone ends; with a KL term every row is kept."""
    table = _table(policy_dir, rewards=[1.0, 0.0, 0.5, 0.5])
    only_a = table.filter(pc.equal(table.column("group_id"), "a"))
    other = tmp_path / "other"
    shutil.copytree(policy_dir, other)
    full = run_grpo_update(policy_dir, tmp_path / "s1", table, _cfg(minibatches=1), version=0, seed=0)
    alone = run_grpo_update(other, tmp_path / "s2", only_a, _cfg(minibatches=1), version=0, seed=0)
    assert full.num_tokens_trained == alone.num_tokens_trained == 3 + 3
    assert full.num_trajectories == 4 and full.mixed_group_share == 0.5
    _assert_same_weights(policy_dir, other)
    shutil.copytree(policy_dir, tmp_path / "reference")
    with_kl = run_grpo_update(
        policy_dir,
        tmp_path / "s3",
        table,
        _cfg(minibatches=1, kl_coef=0.1),
        version=1,
        seed=0,
        reference_dir=tmp_path / "reference",
    )
    assert with_kl.num_tokens_trained == NUM_POLICY_TOKENS


def test_reported_pg_loss_is_weighted_by_the_tokens_with_an_advantage() -> None:
    """With the KL term on, zero-advantage groups ride along in the steps (many tokens, none in the
    policy-gradient term): weighted by all tokens, they pulled the reported pg_loss towards 0."""
    from libra_core.training.update import _Accumulator

    acc = _Accumulator()
    acc.add({"pg_loss": -1.0, "num_tokens": 10.0, "pg_tokens": 10.0, "approx_kl": 0.2, "kl_ref": 0.1}, 1.0)
    acc.add({"pg_loss": 0.5, "num_tokens": 90.0, "pg_tokens": 10.0, "approx_kl": 0.0, "kl_ref": 0.2}, 1.0)
    assert acc.mean("pg_loss") == pytest.approx(-0.25)  # (-1.0 x 10 + 0.5 x 10) / 20; was -0.05
    assert acc.mean("approx_kl") == pytest.approx(0.02)  # every trained token: 0.2 x 10 / 100
    assert acc.mean("kl_ref") == pytest.approx(0.19)  # (0.1 x 10 + 0.2 x 90) / 100
    assert acc.total_loss(0.5) == pytest.approx(-0.25 + 0.5 * 0.19)
