"""The objective the plan search minimises: steady-state seconds per RL iteration, and the weight
sync inside it.

For a staleness bound s (weights move to rollout after every update, taking T_sync = weight bytes
/ inter-node bandwidth):
- s = 0 (on-policy): rollout k+1 needs the weights of update k, so nothing overlaps:
  `T_iter = T_rollout + T_train + T_sync`;
- s >= 1: rollout of step k+1 runs while step k trains; rollout pauses only to load weights:
  `T_iter = max(T_rollout + T_sync, T_train)`. Larger s only absorbs variance between iterations,
  which this deterministic model does not see, so s = 1 and s = 8 price the same. With
  `SearchSettings.plan_for_spread` the objective is the expected iteration under one iteration's
  spread instead, `E[max(T_rollout + T_sync, T_train)]`, and a heterogeneous layout's rollout
  ends with the slowest of its buckets (spread.py).
- a single device (local CPU run) is colocated: both sides share it, `T_rollout + T_train + T_sync`.
"""

from __future__ import annotations

from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.spread import Spread, expected_max


def iteration_time_s(
    t_rollout_s: float,
    t_train_s: float,
    t_sync_s: float,
    staleness: int,
    colocated: bool = False,
    spread: Spread | None = None,
) -> float:
    """Steady-state seconds per iteration (module docstring gives the formulas)."""
    if colocated or staleness == 0:
        return t_rollout_s + t_train_s + t_sync_s
    if spread is None:
        return max(t_rollout_s + t_sync_s, t_train_s)
    return expected_max(
        t_rollout_s + t_sync_s, spread.rollout_cv * t_rollout_s, t_train_s, spread.train_cv * t_train_s
    )


def weight_sync_s(model: ModelSpec, hw: HardwareSpec, colocated: bool) -> float:
    """Broadcasting the new bf16 weights to the rollout instances (pipelined over the NICs)."""
    if colocated:
        return model.weight_bytes / (hw.mem_bw_bytes_per_s * hw.mem_bw_eff)
    return model.weight_bytes / (hw.inter_bw_bytes_per_s * hw.inter_allreduce_eff)
