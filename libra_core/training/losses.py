"""The GRPO policy loss: token-level PPO-clip against the behaviour policy, plus an optional k3 KL.

Called by the update stage once per minibatch, on log-probs from `token_logprobs` and the
behaviour log-probs recorded by the rollout engine (so stale, off-policy tokens are corrected by the
importance ratio rather than assumed on-policy). The loss is a mean over every masked token of the
minibatch (DAPO-style token-level mean), so long trajectories are not down-weighted per token.
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return (scalar loss to minimise, metrics).

    Shapes: `logprobs`, `behavior_logprobs`, `mask` and `ref_logprobs` are [B, T] (T = token
    positions, aligned with each other); `advantages` is [B] and is broadcast over a trajectory's
    tokens. `mask` is 1 for tokens that are trained (policy tokens) and 0 for tool tokens and padding;
    masked-out positions contribute nothing to the loss, its gradient or the metrics, whatever values
    they hold. Only `logprobs` should carry gradient.

    Per token: ratio = exp(logp - logp_behaviour); loss = -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A).
    With `ref_logprobs` and `kl_coef > 0`, adds kl_coef * mean k3(ref || current), where
    k3 = exp(ref - logp) - (ref - logp) - 1 (non-negative, unbiased for KL(current || ref)).

    Metrics (floats, means over masked tokens): `pg_loss`; `clip_fraction`, the share of tokens whose
    clipped branch is active (ratio > 1+eps with A > 0, or ratio < 1-eps with A < 0: no gradient);
    `ratio_mean`; `approx_kl`, the k3 estimate of KL(behaviour || current); `kl_ref` when a reference
    is given; `num_tokens`. With no masked token the loss is 0 (still attached to the graph).
    """
    assert logprobs.shape == behavior_logprobs.shape == mask.shape, (
        f"logprobs {tuple(logprobs.shape)}, behavior_logprobs {tuple(behavior_logprobs.shape)} and mask "
        f"{tuple(mask.shape)} must have the same [B, T] shape"
    )
    assert advantages.shape == logprobs.shape[:1], (
        f"advantages {tuple(advantages.shape)} must be [B] for logprobs {tuple(logprobs.shape)}"
    )
    keep = mask.to(torch.bool)
    weight = keep.to(logprobs.dtype)
    num_tokens = weight.sum()
    denom = num_tokens.clamp(min=1.0)

    # Zero the log-ratio outside the mask so padding or tool positions can never produce inf/NaN
    # (an inf in the unselected branch would still poison the backward pass).
    log_ratio = torch.where(keep, logprobs - behavior_logprobs.to(logprobs.dtype), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype).unsqueeze(1).expand_as(ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    pg_loss = (per_token * weight).sum() / denom
    loss = pg_loss

    metrics: dict[str, float] = {}
    if ref_logprobs is not None and kl_coef > 0.0:
        assert ref_logprobs.shape == logprobs.shape, (
            f"ref_logprobs {tuple(ref_logprobs.shape)} must match logprobs {tuple(logprobs.shape)}"
        )
        ref_diff = torch.where(keep, ref_logprobs.to(logprobs.dtype) - logprobs, torch.zeros_like(logprobs))
        k3 = torch.exp(ref_diff) - ref_diff - 1.0
        kl_ref = (k3 * weight).sum() / denom
        loss = loss + kl_coef * kl_ref
        metrics["kl_ref"] = float(kl_ref.detach())

    with torch.no_grad():
        is_clipped = ((ratio > 1.0 + clip_eps) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
        approx_kl = ratio - 1.0 - log_ratio
        metrics.update(
            {
                "pg_loss": float(pg_loss.detach()),
                "clip_fraction": float((is_clipped & keep).sum() / denom),
                "ratio_mean": float((ratio * weight).sum() / denom),
                "approx_kl": float((approx_kl * weight).sum() / denom),
                "num_tokens": float(num_tokens),
            }
        )
    return loss, metrics
