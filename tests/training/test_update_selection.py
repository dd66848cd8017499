"""What an update trains on: the staleness bound (drop or recompute) and dynamic sampling."""

from __future__ import annotations

import random
from typing import Any

import pytest

from libra_core.config.pipeline import DynamicSamplingConfig, PipelineConfig
from libra_core.data.schema import table_from_rows
from libra_core.training.selection import select_for_update
from tests.data.test_schema import row


def _traj(i: int, group: str, reward: float, versions: tuple[int, int], length: int = 5) -> dict[str, Any]:
    """A trajectory whose first policy span was generated at versions[0] and second at versions[1]."""
    lo, hi = versions
    return row(
        trajectory_id=f"t{i}",
        group_id=group,
        sample_index=i,
        reward=reward,
        response_ids=list(range(4, 4 + length)),
        behavior_logprobs=[-0.5, -0.25, 0.0, 0.0] + [-1.0] * (length - 4),
        loss_mask=[1, 1, 0, 0] + [1] * (length - 4),
        version_spans=[{"start": 0, "end": 2, "version": lo}, {"start": 4, "end": length, "version": hi}],
        min_version=lo,
        max_version=hi,
    )


def test_stale_groups_are_dropped_whole() -> None:
    table = table_from_rows(
        [
            _traj(0, "a", 1.0, (9, 10)),
            _traj(1, "a", 0.0, (10, 10)),
            _traj(2, "b", 1.0, (5, 10)),  # 10 - 5 = 5 steps old > 4: drops group b
            _traj(3, "b", 0.0, (10, 10)),
        ]
    )
    sel = select_for_update(table, version=10, pipeline=PipelineConfig(max_staleness=4))
    assert sel.table.column("trajectory_id").to_pylist() == ["t0", "t1"]
    assert (sel.stats.stale_dropped, sel.stats.stale_recomputed, sel.stats.max_staleness_seen) == (2, 0, 1)
    assert not sel.recompute.any()
    assert sel.stats.all_reward_mean == 0.5 and sel.stats.train_reward_mean == 0.5


def test_stale_trajectories_can_be_recomputed() -> None:
    table = table_from_rows([_traj(0, "a", 1.0, (2, 10)), _traj(1, "a", 0.0, (10, 10))])
    sel = select_for_update(table, version=10, pipeline=PipelineConfig(max_staleness=4, stale="recompute"))
    assert sel.table.num_rows == 2
    assert sel.recompute.tolist() == [True, False]
    assert sel.stats.stale_recomputed == 1 and sel.stats.stale_dropped == 0
    assert sel.stats.max_staleness_seen == 8


def test_dynamic_sampling_filters_equal_reward_groups_and_caps_the_batch() -> None:
    rows = [
        _traj(0, "same", 1.0, (3, 3)),
        _traj(1, "same", 1.0, (3, 3)),
        _traj(2, "mixed1", 1.0, (3, 3), length=9),
        _traj(3, "mixed1", 0.1, (3, 3), length=9),
        _traj(4, "zero", 0.0, (3, 3)),
        _traj(5, "zero", 0.0, (3, 3)),
        _traj(6, "mixed2", 0.0, (3, 3)),
        _traj(7, "mixed2", 1.0, (3, 3)),
    ]
    on = PipelineConfig(dynamic_sampling=DynamicSamplingConfig(enabled=True))
    sel = select_for_update(table_from_rows(rows), version=3, pipeline=on, max_groups=1)
    assert sel.table.column("group_id").to_pylist() == ["mixed1", "mixed1"]  # first group with signal
    assert sel.stats.groups_filtered == 2
    assert sel.stats.groups_over_cap == 1  # mixed2: signal, but the cap was reached
    # the bias report: trained trajectories are longer than the average generated one
    assert sel.stats.train_response_tokens_mean == 9.0
    assert sel.stats.all_response_tokens_mean == pytest.approx((6 * 5 + 2 * 9) / 8)
    off = select_for_update(table_from_rows(rows), version=3, pipeline=PipelineConfig())
    assert off.table.num_rows == 8 and off.stats.groups_filtered == 0 and off.stats.groups_over_cap == 0


def test_newer_than_the_update_is_a_bookkeeping_error() -> None:
    table = table_from_rows([_traj(0, "a", 1.0, (7, 7))])
    with pytest.raises(AssertionError, match="newer than the update"):
        select_for_update(table, version=6, pipeline=PipelineConfig())


@pytest.mark.parametrize("seed", range(20))
def test_staleness_bound_holds_under_random_interleavings(seed: int) -> None:
    """A randomised async schedule: the rollout of iteration i+1 runs while update i takes a random
    number of optimizer steps, and the sync lands at a random point among each trajectory's turns
    (possibly inside a turn). Turns are labelled by the agent loop's rule, the version served when
    the turn started, so a straddling turn is labelled older than its newest tokens. Whatever the
    interleaving, no trajectory the update keeps is older than the bound in *true* versions, and
    when updates never take more steps than the bound, nothing is dropped."""
    rng = random.Random(seed)
    max_steps = rng.randint(1, 4)
    bound = max(0, max_steps + rng.choice([-1, 0, 1]))
    pipeline = PipelineConfig(max_staleness=bound)
    served = 0  # the version the engines serve
    pending: list[tuple[dict[str, Any], int]] = []  # (row, true oldest version) awaiting training
    kept = dropped = 0
    for iteration in range(1, 10):
        start = served  # update `iteration` starts from the served version
        if pending:
            sel = select_for_update(
                table_from_rows([r for r, _ in pending]), version=start, pipeline=pipeline
            )
            true_min = {r["trajectory_id"]: v for r, v in pending}
            for tid in sel.table.column("trajectory_id").to_pylist():
                assert start - true_min[tid] <= bound
            kept += sel.table.num_rows
            dropped += sel.stats.stale_dropped
            if max_steps <= bound:
                assert sel.stats.stale_dropped == 0
        steps = rng.randint(0, max_steps)  # 0: the update had no signal
        pending = []
        for k in range(6):  # the next rollout, overlapping this update; the sync lands mid-way
            turns = rng.randint(2, 5)
            cut = rng.uniform(0, turns)  # sync time in units of turns; inside turn floor(cut)
            labels = [start if t < cut else start + steps for t in range(turns)]  # start-of-turn rule
            true_versions = [start if t + 1 <= cut else start + steps for t in range(turns)]
            true_versions += [start] if 0 < cut < turns and cut % 1 else []  # early tokens of the straddler
            group = f"it{iteration}-g{k // 2}"
            traj = _traj(k, group, float(k % 2), (min(labels), max(labels)))
            traj["trajectory_id"] = f"it{iteration}-t{k}"
            pending.append((traj, min(true_versions)))
        served = start + steps
    assert kept > 0
    if max_steps <= bound:
        assert dropped == 0


def test_every_stale_trajectory_of_a_kept_group_is_counted_as_recomputed() -> None:
    # Group a has two stale trajectories: counting groups instead of trajectories (any() for sum())
    # reported 2 recomputed where 3 are.
    table = table_from_rows(
        [
            _traj(0, "a", 1.0, (2, 10)),  # 8 steps old > 4
            _traj(1, "a", 0.0, (5, 10)),  # 5 steps old > 4
            _traj(2, "a", 0.5, (10, 10)),
            _traj(3, "b", 1.0, (1, 10)),  # 9 steps old > 4
            _traj(4, "b", 0.0, (9, 10)),
        ]
    )
    sel = select_for_update(table, version=10, pipeline=PipelineConfig(max_staleness=4, stale="recompute"))
    assert sel.recompute.tolist() == [True, True, False, True, False]
    assert (sel.stats.stale_recomputed, sel.stats.stale_dropped, sel.stats.max_staleness_seen) == (3, 0, 9)
    dropped = select_for_update(table, version=10, pipeline=PipelineConfig(max_staleness=4))
    assert (dropped.stats.stale_dropped, dropped.stats.stale_recomputed, dropped.table.num_rows) == (5, 0, 0)


def test_response_length_p90_of_all_and_of_trained_trajectories() -> None:
    # Both are history columns (the training set's length bias): the equal-reward group of short
    # trajectories is filtered out, so the trained p90 is over lengths [9, 13] only.
    rows = [
        _traj(0, "same", 1.0, (3, 3), length=5),
        _traj(1, "same", 1.0, (3, 3), length=5),
        _traj(2, "mixed", 1.0, (3, 3), length=9),
        _traj(3, "mixed", 0.0, (3, 3), length=13),
    ]
    on = PipelineConfig(dynamic_sampling=DynamicSamplingConfig(enabled=True))
    sel = select_for_update(table_from_rows(rows), version=3, pipeline=on)
    assert sel.table.column("trajectory_id").to_pylist() == ["t2", "t3"]
    # numpy's linear p90: all [5, 5, 9, 13] at position 2.7 -> 9 + 0.7 * 4; trained [9, 13] at 0.9.
    assert sel.stats.all_response_tokens_p90 == pytest.approx(11.8)
    assert sel.stats.train_response_tokens_p90 == pytest.approx(12.6)
    assert sel.stats.all_response_tokens_mean == pytest.approx(8.0)
    assert sel.stats.train_response_tokens_mean == pytest.approx(11.0)
