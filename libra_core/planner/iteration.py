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

With `sync_overlaps` (the simulator's pipeline: the weights stream into a staging copy while the
rollout runs, and the next rollout starts on them at once) the sync no longer stops the rollout
side. It shows only in the pipeline's cycle: rollout k+s+1 needs update k's synced weights, so
s+1 periods hold a rollout, an update and a sync, and
`T_iter = max(T_rollout, T_train, (T_rollout + T_train + T_sync) / (s + 1))`. Under a spread the
first two terms are the expected maximum and the cycle is taken at the means. With iterations of
minutes the two forms differ by under a second; with iterations of a second (a trace of a CPU run
replayed on GPUs) the pause form hides the training time behind `T_rollout + T_sync` and ranks
splits by rollout alone.
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
    sync_overlaps: bool = False,
) -> float:
    """Steady-state seconds per iteration (module docstring gives the formulas)."""
    if colocated or staleness == 0:
        return t_rollout_s + t_train_s + t_sync_s
    paused_s = 0.0 if sync_overlaps else t_sync_s  # the rollout side's stop to load the weights
    if spread is None:
        sides = max(t_rollout_s + paused_s, t_train_s)
    else:
        sides = expected_max(
            t_rollout_s + paused_s, spread.rollout_cv * t_rollout_s, t_train_s, spread.train_cv * t_train_s
        )
    if not sync_overlaps:
        return sides
    return max(sides, (t_rollout_s + t_train_s + t_sync_s) / (staleness + 1))


def weight_sync_s(model: ModelSpec, hw: HardwareSpec, colocated: bool) -> float:
    """Broadcasting the new weights (in the model spec's dtype) to the rollout instances (pipelined over
    the NICs)."""
    if colocated:
        return model.weight_bytes / (hw.mem_bw_bytes_per_s * hw.mem_bw_eff)
    return model.weight_bytes / (hw.inter_bw_bytes_per_s * hw.inter_allreduce_eff)
