"""iteration_row: one history column per field of the schema, each from its own stage result."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from libra_core.data.history import HISTORY_SCHEMA, append_history, read_history
from libra_core.pipeline.iteration_row import StageSeconds, iteration_row


class _Distinct(SimpleNamespace):
    """A stage result whose every attribute read gives a value no other read gives."""

    counter = itertools.count(1)

    def __getattr__(self, name: str) -> Any:
        value = next(self.counter)
        setattr(self, name, value)
        return value


def test_the_row_has_the_schemas_columns_each_from_a_different_field(tmp_path: Path) -> None:
    rollout = _Distinct(routing=_Distinct())
    stage = _Distinct(update=_Distinct(), selection=_Distinct())
    seconds = StageSeconds(0.5, 1.0, 1.5, 2.5, 3.5, 4.5, 5.5, eval_s=None)
    row = iteration_row(7, _Distinct(), rollout, _Distinct(), stage, seconds, eval_accuracy=None)  # type: ignore[arg-type]
    assert list(row) == HISTORY_SCHEMA.names
    assert row["iteration"] == 7 and row["eval_s"] is None and row["eval_accuracy"] is None
    assert [row[f"{s}_s"] for s in ("plan", "pool", "rollout", "reward", "update", "sync")] == [
        0.5,
        1.0,
        1.5,
        2.5,
        3.5,
        4.5,
    ]
    read = [
        v
        for k, v in row.items()
        if k not in {"iteration", "eval_s", "eval_accuracy"} and not k.endswith("_s")
    ]
    assert len(read) == len(set(read))  # no two columns copy the same attribute
    assert row["policy_version"] == stage.update.new_version
    assert row["rollout_instances"] == rollout.instances  # the pool the rollout ran on, not the plan's
    append_history(tmp_path, row)
    assert read_history(tmp_path)[0]["migration_token_ratio"] == rollout.routing.migration_token_ratio


def test_every_column_comes_from_its_own_stage_result_field() -> None:
    # Each column against the one attribute it must copy, written out by hand: swapping two columns'
    # sources (reward_mean <-> accuracy, stale_dropped <-> stale_recomputed) kept every value distinct,
    # so the test above could not see it.
    plan, reward = _Distinct(), _Distinct()
    rollout = _Distinct(routing=_Distinct())
    update, selection = _Distinct(), _Distinct()
    stage = _Distinct(update=update, selection=selection)
    seconds = StageSeconds(0.5, 1.25, 1.5, 2.5, 3.5, 4.5, 5.5, eval_s=6.5)
    row = iteration_row(7, plan, rollout, reward, stage, seconds, eval_accuracy=0.25)  # type: ignore[arg-type]
    sources: dict[str, tuple[Any, str]] = {
        "policy_version": (update, "new_version"),
        "plan_s": (seconds, "plan_s"),
        "pool_s": (seconds, "pool_s"),
        "rollout_s": (seconds, "rollout_s"),
        "reward_s": (seconds, "reward_s"),
        "update_s": (seconds, "update_s"),
        "sync_s": (seconds, "sync_s"),
        "iteration_s": (seconds, "iteration_s"),
        "eval_s": (seconds, "eval_s"),
        "tokens_generated": (rollout, "tokens_generated"),
        "tokens_trained": (update, "num_tokens_trained"),
        "num_trajectories": (rollout, "num_trajectories"),
        "reward_mean": (reward, "reward_mean"),
        "accuracy": (reward, "accuracy"),
        "mixed_group_share": (reward, "mixed_group_share"),
        "mean_response_tokens": (rollout, "mean_response_tokens"),
        "tool_failure_share": (rollout, "tool_failure_share"),
        "loss": (update, "loss"),
        "clip_fraction": (update, "clip_fraction"),
        "grad_norm": (update, "grad_norm"),
        "rollout_tokens_per_s": (rollout, "tokens_per_s"),
        "routing_moves": (rollout.routing, "moves"),
        "routing_migrations": (rollout.routing, "migrations"),
        "migrated_tokens": (rollout.routing, "migrated_tokens"),
        "routing_class_accuracy": (rollout.routing, "class_accuracy"),
        "migration_token_ratio": (rollout.routing, "migration_token_ratio"),
        "optimizer_steps": (update, "num_optimizer_steps"),
        "stale_dropped": (selection, "stale_dropped"),
        "stale_recomputed": (selection, "stale_recomputed"),
        "groups_filtered": (selection, "groups_filtered"),
        "max_staleness_seen": (selection, "max_staleness_seen"),
        "behavior_weight_mean": (update, "behavior_weight_mean"),
        "train_reward_mean": (selection, "train_reward_mean"),
        "train_response_tokens_mean": (selection, "train_response_tokens_mean"),
        "response_tokens_p90": (selection, "all_response_tokens_p90"),
        "train_response_tokens_p90": (selection, "train_response_tokens_p90"),
        "rollout_instances": (rollout, "instances"),  # the pool the rollout ran on, not the plan's
        "predicted_iteration_s": (plan, "predicted_iteration_s"),
    }
    assert set(row) == set(sources) | {"iteration", "eval_accuracy"}  # a new column needs a source here
    assert row["iteration"] == 7 and row["eval_accuracy"] == 0.25
    # An attribute the row did not read gets a fresh value on the read below, so a column copied
    # from any other field (or any other object) fails here.
    wrong = {
        col: (row[col], getattr(obj, attr))
        for col, (obj, attr) in sources.items()
        if row[col] != getattr(obj, attr)
    }
    assert not wrong
