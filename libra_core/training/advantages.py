"""GRPO advantages: each trajectory's reward relative to the other samples of the same prompt.

Called once per iteration by the update stage, on the `reward` and `group_id` columns of the
trajectory table, before any minibatching; the result is one scalar per trajectory that the loss
broadcasts over that trajectory's policy tokens. Pure numpy, so the planner and the simulator can use
it without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _group_index(rewards: np.ndarray, group_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"rewards must be one-dimensional, got shape {values.shape}")
    if len(group_ids) != len(values):
        raise ValueError(f"got {len(values)} rewards but {len(group_ids)} group ids; pass one id per reward")
    if not np.all(np.isfinite(values)):
        raise ValueError("rewards contain NaN or inf; the reward stage must fill every trajectory")
    if len(values) == 0:
        return values, np.zeros(0, dtype=np.int64), 0
    _, inverse = np.unique(np.asarray(list(group_ids), dtype=object).astype(str), return_inverse=True)
    inverse = inverse.reshape(-1)
    return values, inverse, int(inverse.max()) + 1


# Rewards closer than this (relative to their size, at least 1) are one value: 0.1 + 0.2 and 0.3 differ
# by 5.6e-17, and a group of them carries no signal, only a rounding residue.
REWARD_TOLERANCE = 1e-9


def _one_value(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether rewards from `lo` to `hi` (elementwise) are one value up to `REWARD_TOLERANCE`."""
    return hi - lo <= REWARD_TOLERANCE * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))


def rewards_uniform(values: np.ndarray) -> bool:
    """True when the rewards are one value up to `REWARD_TOLERANCE` (no learning signal)."""
    return len(values) == 0 or bool(_one_value(np.min(values), np.max(values)))


def _uniform_groups(values: np.ndarray, inverse: np.ndarray, num_groups: int) -> np.ndarray:
    """Per group: True when its rewards are one value, as `rewards_uniform` says."""
    lo = np.full(num_groups, np.inf)
    hi = np.full(num_groups, -np.inf)
    np.minimum.at(lo, inverse, values)
    np.maximum.at(hi, inverse, values)
    return _one_value(lo, hi)


def group_advantages(
    rewards: np.ndarray,
    group_ids: Sequence[str],
    *,
    scale_by_std: bool,
    negative_weight: float = 1.0,
    eps: float = 1e-6,
) -> np.ndarray:
    """Per-trajectory GRPO advantage: `r - mean_g(r)`, divided by `std_g(r) + eps` if `scale_by_std`.

    `rewards` has shape [N]; `group_ids[i]` names the prompt group of trajectory i (groups need not be
    contiguous or equally sized). The std is the population std (ddof=0). A group whose rewards are
    all equal, up to `REWARD_TOLERANCE` (including a group of one), gets exactly 0.0 for every
    member, never a rounding residue, so callers can test `adv != 0` to find trajectories that carry
    signal. `negative_weight` scales the negative advantages (1: plain GRPO; below 1 the update
    leans on reinforcing the group's better samples, which sharpens the policy, rather than on
    pushing its worse ones down, which spreads their probability over every other continuation).
    Returns float64 [N].
    """
    if not 0.0 <= negative_weight <= 1.0:
        raise ValueError(f"negative_weight must be in [0, 1], got {negative_weight}")
    values, inverse, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return np.zeros(0, dtype=np.float64)
    counts = np.bincount(inverse, minlength=num_groups).astype(np.float64)
    means = np.bincount(inverse, weights=values, minlength=num_groups) / counts
    centred = values - means[inverse]
    if scale_by_std:
        variances = np.bincount(inverse, weights=centred**2, minlength=num_groups) / counts
        centred = centred / (np.sqrt(variances)[inverse] + eps)
    if negative_weight != 1.0:
        centred = np.where(centred < 0, centred * negative_weight, centred)
    uniform = _uniform_groups(values, inverse, num_groups)
    return np.where(uniform[inverse], 0.0, centred)


def mixed_group_share(rewards: np.ndarray, group_ids: Sequence[str]) -> float:
    """Share of prompt groups whose rewards are not all equal, in [0, 1]; 0.0 for an empty batch.

    Only mixed groups give GRPO a gradient, so this is the health signal to watch next to reward:
    near 0 means the task is too easy or too hard for the current policy.
    """
    values, inverse, num_groups = _group_index(rewards, group_ids)
    if num_groups == 0:
        return 0.0
    return float(1.0 - _uniform_groups(values, inverse, num_groups).mean())
