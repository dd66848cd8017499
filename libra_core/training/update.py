"""One GRPO update: trajectory table in, new policy weights on disk, metrics out.

Called by the update task once per RL iteration, after the reward stage has filled `reward`. It loads
the policy from its HF folder and the AdamW state from the trainer's state folder, takes at most
`cfg.grpo.minibatches` optimizer steps over shuffled minibatches of the table, and writes both back
atomically, so vLLM can reload the folder and the next iteration (possibly in a fresh process)
resumes the optimizer. Nothing is kept in memory between calls.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from libra_core.config.training import TrainingConfig
from libra_core.data.schema import validate_trajectories
from libra_core.training.advantages import group_advantages, mixed_group_share

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateResult:
    """Metrics of one update; loss-side values are token-weighted means over the optimizer steps taken.

    When no trajectory carries signal (every advantage is 0) no step is taken, nothing is written,
    `num_optimizer_steps` is 0 and `new_version` equals the input `version`.
    """

    loss: float  # pg_loss + kl_coef * kl_ref (each its own mean below)
    pg_loss: float  # PPO-clip part only
    # loss-mask-1 tokens that went through an optimizer step (rows with a nonzero advantage; all with KL)
    num_tokens_trained: int
    num_trajectories: int
    num_optimizer_steps: int
    clip_fraction: float  # share of trained tokens whose clipped branch was active
    ratio_mean: float  # mean ratio current / anchor (proximal when decoupled, else behaviour)
    approx_kl: float  # k3 estimate of KL(anchor || current) before each step (anchor as above)
    kl_ref: float | None  # k3 KL to the reference policy; None when no KL penalty is used
    grad_norm: float  # mean over steps of the global grad norm before clipping
    reward_mean: float
    reward_std: float
    mixed_group_share: float  # share of prompt groups whose rewards differ (the ones with signal)
    new_version: int  # policy version now in policy_dir (input version + optimizer steps)
    behavior_weight_mean: float  # mean proximal/behaviour weight (1.0 without decoupled PPO)
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row_roles(table: pa.Table, advantages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (has a policy token, carries signal). A row carries signal when it has a policy
    token and a nonzero advantage as the loss sees it (float32, as `build_batch` stores it)."""
    trained = np.asarray([any(mask) for mask in table.column("loss_mask").to_pylist()], dtype=bool)
    return trained, trained & (np.asarray(advantages, dtype=np.float32) != 0)


def _has_signal(table: pa.Table, advantages: np.ndarray) -> bool:
    """True when some trajectory with a nonzero advantage has at least one policy token."""
    return bool(_row_roles(table, advantages)[1].any())


class _Accumulator:
    """Token-weighted means of the per-minibatch loss metrics: `pg_loss` by the tokens that carry an
    advantage (its own divisor, `pg_tokens`), every other metric by all trained tokens. The total
    loss is not averaged per step but rebuilt from the two means (`total_loss`): averaged by all
    tokens, it disagreed with `pg_loss + kl_coef * kl_ref` whenever the steps' shares of tokens
    with an advantage differed."""

    KEYS = ("pg_loss", "clip_fraction", "ratio_mean", "approx_kl", "kl_ref", "behavior_weight_mean")

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.num_tokens = 0
        self.pg_tokens = 0
        self.grad_norms: list[float] = []

    def add(self, metrics: dict[str, float], grad_norm: float) -> None:
        tokens = int(metrics["num_tokens"])
        pg_tokens = int(metrics["pg_tokens"])
        self.num_tokens += tokens
        self.pg_tokens += pg_tokens
        for key in self.KEYS:
            default = 1.0 if key == "behavior_weight_mean" else 0.0
            self.sums[key] += metrics.get(key, default) * (pg_tokens if key == "pg_loss" else tokens)
        self.grad_norms.append(grad_norm)

    def mean(self, key: str) -> float:
        divisor = self.pg_tokens if key == "pg_loss" else self.num_tokens
        return self.sums[key] / divisor if divisor else 0.0

    def total_loss(self, kl_coef: float) -> float:
        """pg_loss + kl_coef * kl_ref, each its own mean (kl_ref is 0 when no KL term ran)."""
        return self.mean("pg_loss") + kl_coef * self.mean("kl_ref")


def run_grpo_update(
    policy_dir: Path,
    state_dir: Path,
    table: pa.Table,
    cfg: TrainingConfig,
    *,
    version: int,
    seed: int,
    reference_dir: Path | None = None,
    decoupled: bool = False,
    behavior_weight_cap: float | None = None,
    recompute: np.ndarray | None = None,
    temperature: float = 1.0,
) -> UpdateResult:
    """Apply one GRPO update to the policy in `policy_dir`, using the rewarded trajectories in `table`.

    `version` is the policy version currently stored in `policy_dir`; after k optimizer steps the
    folder holds `version + k`. `decoupled` recomputes proximal log-probs with the policy as loaded
    and uses the decoupled PPO loss (see losses.ppo_clip_loss); `recompute` (bool per row) marks
    rows whose behaviour log-probs are replaced by those proximal log-probs (stale trajectories).
    `state_dir/optimizer.pt` is read if present and rewritten after the steps. `temperature` is the
    rollout's sampling temperature: log-probs are scored under it (training/logprobs.py).
    `reference_dir` (an HF folder, e.g. the SFT policy) is required when `cfg.grpo.kl_coef > 0` and
    ignored otherwise. `seed` fixes the minibatch shuffle. Raises TrajectorySchemaError for a
    malformed table, ValueError for an empty one or a bad config/device, FloatingPointError (before
    anything is written) if a gradient is not finite.
    """
    start = time.perf_counter()
    validate_trajectories(table, require_reward=True)
    if table.num_rows == 0:
        raise ValueError("the trajectory table is empty; the update needs at least one rewarded trajectory")
    grpo = cfg.grpo
    if grpo.kl_coef > 0 and reference_dir is None:
        raise ValueError(
            f"grpo.kl_coef is {grpo.kl_coef} but no reference_dir was given; pass the reference "
            "(SFT) policy folder or set kl_coef to 0"
        )

    rewards = np.asarray(table.column("reward").to_numpy(zero_copy_only=False), dtype=np.float64)
    group_ids = table.column("group_id").to_pylist()
    advantages = group_advantages(
        rewards, group_ids, scale_by_std=grpo.scale_by_std, negative_weight=grpo.negative_weight
    )
    acc = _Accumulator()
    if _has_signal(table, advantages):
        _train(
            policy_dir,
            state_dir,
            table,
            advantages,
            cfg,
            seed=seed,
            reference_dir=reference_dir,
            acc=acc,
            first_step=version,
            decoupled=decoupled,
            behavior_weight_cap=behavior_weight_cap,
            recompute=recompute,
            temperature=temperature,
        )
        logger.info(
            "GRPO update v%d -> v%d: %d steps, %d tokens",
            version,
            version + len(acc.grad_norms),
            len(acc.grad_norms),
            acc.num_tokens,
        )
    else:
        logger.warning(
            "GRPO update skipped at v%d: every advantage is 0 (no group has mixed rewards)", version
        )

    stepped = bool(acc.grad_norms)
    return UpdateResult(
        loss=acc.total_loss(grpo.kl_coef),
        pg_loss=acc.mean("pg_loss"),
        num_tokens_trained=acc.num_tokens,
        num_trajectories=table.num_rows,
        num_optimizer_steps=len(acc.grad_norms),
        clip_fraction=acc.mean("clip_fraction"),
        ratio_mean=acc.mean("ratio_mean") if stepped else 1.0,  # no step: no ratio (as _skipped)
        approx_kl=acc.mean("approx_kl"),
        kl_ref=acc.mean("kl_ref") if grpo.kl_coef > 0 and stepped else None,
        grad_norm=float(np.mean(acc.grad_norms)) if stepped else 0.0,
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()),
        mixed_group_share=mixed_group_share(rewards, group_ids),
        new_version=version + len(acc.grad_norms),
        behavior_weight_mean=acc.mean("behavior_weight_mean") if stepped else 1.0,
        wall_s=time.perf_counter() - start,
    )


def _train(
    policy_dir: Path,
    state_dir: Path,
    table: pa.Table,
    advantages: np.ndarray,
    cfg: TrainingConfig,
    *,
    seed: int,
    reference_dir: Path | None,
    acc: _Accumulator,
    first_step: int,
    decoupled: bool,
    behavior_weight_cap: float | None,
    recompute: np.ndarray | None,
    temperature: float,
) -> None:
    """Load, take the minibatch steps (recording into `acc`), and save weights and optimizer state."""
    import torch

    from libra_core.model.policy import resolve_training_device
    from libra_core.training.batch import build_batch
    from libra_core.training.checkpoint import (
        load_optimizer_state,
        load_policy,
        save_optimizer_state,
        save_policy_weights,
    )
    from libra_core.training.logprobs import token_logprobs
    from libra_core.training.losses import ppo_clip_loss

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_training_device(cfg.device)
    grpo, opt = cfg.grpo, cfg.optimizer
    model = load_policy(policy_dir, device)
    reference = None
    if grpo.kl_coef > 0 and reference_dir is not None:
        reference = load_policy(reference_dir, device).requires_grad_(False)
    # A row without a policy token adds nothing to either term, and one with a zero advantage (its
    # group's rewards are all equal) nothing to the policy gradient, so it is left out of the
    # minibatches unless the KL term needs its tokens.
    trained, signal = _row_roles(table, advantages)
    keep = np.flatnonzero(trained if grpo.kl_coef > 0 else signal)
    table, advantages, signal = table.take(keep), advantages[keep], signal[keep]
    recompute = None if recompute is None else recompute[keep]
    pad_id = getattr(model.config, "pad_token_id", None)
    batch = build_batch(table, advantages, pad_id=int(pad_id) if pad_id is not None else 0)
    needs_recompute = recompute is not None and bool(recompute.any())
    if decoupled or needs_recompute:
        proximal = _policy_logprobs(model, batch, device, temperature)
        if needs_recompute:
            assert recompute is not None
            rows = torch.as_tensor(np.flatnonzero(recompute))
            batch.behavior_logprobs[rows] = proximal[rows]
        if decoupled:
            batch = dataclasses.replace(batch, proximal_logprobs=proximal)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)
    resumed = load_optimizer_state(optimizer, state_dir, device)
    logger.debug("optimizer state %s", "resumed" if resumed else "fresh")
    torch.manual_seed(seed)
    labels = np.asarray(table.column("group_id").to_pylist(), dtype=str)
    minibatches = _deal_minibatches(signal, labels, grpo.minibatches, grpo.whole_groups, seed)
    for step, indices in enumerate(minibatches, start=first_step):
        for group in optimizer.param_groups:  # also overrides the lr a resumed state carries
            group["lr"] = warmup_lr(step, opt.lr, opt.lr_warmup_steps)
        mb = batch.select(indices).to(device)
        assert bool(((mb.loss_mask != 0) & (mb.advantages != 0).unsqueeze(1)).any()), (
            f"minibatch {step - first_step} has no policy token with an advantage; every part must "
            "hold a row with signal (_deal_minibatches), or Adam steps on a zero policy gradient"
        )
        ref_logprobs = None
        if reference is not None:
            with torch.no_grad():
                ref_logprobs = token_logprobs(reference, mb.input_ids, mb.attention_mask, temperature)
        logprobs = token_logprobs(model, mb.input_ids, mb.attention_mask, temperature)
        loss, metrics = ppo_clip_loss(
            logprobs,
            mb.behavior_logprobs,
            mb.advantages,
            mb.loss_mask,
            clip_eps=grpo.clip_eps,
            ref_logprobs=ref_logprobs,
            kl_coef=grpo.kl_coef,
            proximal_logprobs=mb.proximal_logprobs,
            behavior_weight_cap=behavior_weight_cap,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip))
        if not np.isfinite(grad_norm):
            raise FloatingPointError(
                f"gradient norm is {grad_norm} at optimizer step {len(acc.grad_norms)}; "
                "nothing was written (check behaviour log-probs and the learning rate)"
            )
        optimizer.step()
        acc.add(metrics, grad_norm)
    save_policy_weights(model, policy_dir)
    save_optimizer_state(optimizer, state_dir)


def _deal_minibatches(
    signal: np.ndarray, labels: np.ndarray, k: int, whole_groups: bool, seed: int
) -> list[np.ndarray]:
    """Row indices of each optimizer step: the rows with signal split into at most `k` parts (whole
    groups with `whole_groups`), then the other rows (zero-advantage ones the KL term keeps) spread
    over those parts by group (with `whole_groups`, a zero-advantage row of a group with signal
    joins its group's part: a reward equal to the group mean). The steps are thus the same
    whatever `kl_coef` is: until 2026-12-07 every row was dealt alike, so a part could hold only
    zero-advantage groups and become a step with no policy gradient (with kl_coef=1e-12, 4 steps
    where kl_coef=0 took 1)."""
    from libra_core.training.batch import split_minibatches, spread_groups

    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(signal)
    parts = [rows[p] for p in split_minibatches(len(rows), k, rng, labels[rows] if whole_groups else None)]
    rest = np.flatnonzero(~signal)
    if whole_groups and len(rest):
        home = {labels[i]: n for n, part in enumerate(parts) for i in part}
        joins = np.asarray([labels[i] in home for i in rest], dtype=bool)
        for i in rest[joins]:
            parts[home[labels[i]]] = np.append(parts[home[labels[i]]], i)
        rest = rest[~joins]
    return spread_groups(parts, rest, labels[rest], rng)


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Learning rate of RL optimizer step `step` (0-based, counted over the run): linear from
    lr / warmup_steps up to `lr` over the first `warmup_steps` steps, then constant."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return lr
    return lr * (step + 1) / warmup_steps


def _policy_logprobs(
    model: Any, batch: Any, device: torch.device, temperature: float, chunk: int = 32
) -> torch.Tensor:
    """Log-probs of the batch's tokens under `model` as it is now (no gradient), aligned like
    `batch.behavior_logprobs`; computed in chunks of rows to bound activation memory."""
    import torch

    from libra_core.training.logprobs import token_logprobs

    out = torch.zeros_like(batch.behavior_logprobs)
    n = batch.input_ids.shape[0]
    with torch.no_grad():
        for lo in range(0, n, chunk):
            rows = np.arange(lo, min(lo + chunk, n))
            mb = batch.select(rows).to(device)
            out[lo : lo + len(rows), : mb.behavior_logprobs.shape[1]] = token_logprobs(
                model, mb.input_ids, mb.attention_mask, temperature
            ).cpu()
    return out
