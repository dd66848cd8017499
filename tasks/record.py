"""The record task: one iteration's bookkeeping (libra_core/pipeline/record.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import task

from libra_core.observability.timeline import Span
from libra_core.pipeline.record import record_iteration
from tasks.common import TASK_OPTIONS


@task(name="record-iteration", **TASK_OPTIONS)
def record_iteration_task(run_dir: str, row: dict[str, Any], spans: Sequence[Span] = ()) -> None:
    record_iteration(run_dir, row, spans)
