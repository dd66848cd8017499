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
