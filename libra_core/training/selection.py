"""Which rewarded trajectories an update trains on: the staleness bound and dynamic sampling.

Called by the update stage once per iteration, before the GRPO update, on the iteration's rewarded
table. Two filters, both counted so the history shows what was left out and how that biases the
training set (long trajectories are the ones that arrive late, and the ones that go stale):

- staleness: a trajectory whose oldest token was generated more than `max_staleness` optimizer steps
  before the update's starting version is dropped, or kept with its behaviour log-probs to be
  recomputed by the current policy (`stale: recompute`); whole groups are dropped so GRPO's
  group-relative advantages stay defined on complete groups;
- dynamic sampling: groups whose rewards are all equal carry no GRPO signal and are dropped; at most
  `max_groups` of the remaining groups are kept (the rollout over-sampled to fill them; the surplus
  is counted in `groups_over_cap`, which the update stage logs but the history does not keep).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from libra_core.config.pipeline import PipelineConfig
from libra_core.training.advantages import rewards_uniform


@dataclass(frozen=True)
class SelectionStats:
    """What was left out of an update, and the training set's bias against everything generated."""

    stale_dropped: int  # trajectories dropped for staleness (with their whole group)
    stale_recomputed: int  # stale trajectories kept with recomputed behaviour log-probs
    groups_filtered: int  # groups dropped because every reward in them was equal
    groups_over_cap: int  # groups with signal left out because `max_groups` were already kept
    max_staleness_seen: int  # largest (update version - min_version) among trained trajectories
    all_reward_mean: float
    train_reward_mean: float
    all_response_tokens_mean: float
    train_response_tokens_mean: float
    all_response_tokens_p90: float
    train_response_tokens_p90: float


@dataclass(frozen=True)
class Selection:
    table: pa.Table  # the trajectories to train on (a subset of the input rows, same order)
    recompute: np.ndarray  # bool per row of `table`: replace behaviour log-probs by the policy's
    stats: SelectionStats


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0


def _p90(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.9)) if len(values) else 0.0


def select_for_update(
    table: pa.Table, *, version: int, pipeline: PipelineConfig, max_groups: int | None = None
) -> Selection:
    """Apply the staleness bound (always) and dynamic sampling (when enabled) to `table`.

    `version` is the policy version the update starts from; `max_groups` caps the kept groups when
    dynamic sampling is on (None: keep all groups with signal). Groups keep their first-seen order.
    """
    rewards = np.asarray(table.column("reward").to_numpy(zero_copy_only=False), dtype=np.float64)
    group_ids = table.column("group_id").to_pylist()
    staleness = version - np.asarray(table.column("min_version").to_numpy(), dtype=np.int64)
    lengths = np.asarray([len(r) for r in table.column("response_ids").to_pylist()], dtype=np.float64)
    assert (staleness >= 0).all(), (
        f"a trajectory is newer than the update's version {version}: min_version "
        f"{int(version - staleness.min())}; the version bookkeeping is broken"
    )
    stale = staleness > pipeline.max_staleness

    order: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        order.setdefault(g, []).append(i)
    keep: list[int] = []
    stale_dropped = stale_recomputed = filtered = kept_groups = over_cap = 0
    for rows in order.values():
        if pipeline.stale == "drop" and stale[rows].any():
            stale_dropped += len(rows)
            continue
        if pipeline.dynamic_sampling.enabled:
            if rewards_uniform(rewards[rows]):
                filtered += 1
                continue
            if max_groups is not None and kept_groups >= max_groups:
                over_cap += 1
                continue
        kept_groups += 1
        stale_recomputed += int(stale[rows].sum())
        keep.extend(rows)
    keep.sort()
    idx = np.asarray(keep, dtype=np.int64)
    recompute = stale[idx] if pipeline.stale == "recompute" else np.zeros(len(idx), dtype=bool)
    stats = SelectionStats(
        stale_dropped=stale_dropped,
        stale_recomputed=stale_recomputed if pipeline.stale == "recompute" else 0,
        groups_filtered=filtered,
        groups_over_cap=over_cap,
        max_staleness_seen=int(staleness[idx].max()) if len(idx) else 0,
        all_reward_mean=_mean(rewards),
        train_reward_mean=_mean(rewards[idx]),
        all_response_tokens_mean=_mean(lengths),
        train_response_tokens_mean=_mean(lengths[idx]),
        all_response_tokens_p90=_p90(lengths),
        train_response_tokens_p90=_p90(lengths[idx]),
    )
    return Selection(table.take(pa.array(idx, type=pa.int64())), recompute, stats)
