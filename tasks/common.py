"""Shared task options."""

from __future__ import annotations

from typing import Any

from prefect.cache_policies import NONE

# Stages have side effects on the run folder and on engines, so they are never served from cache.
TASK_OPTIONS: dict[str, Any] = {"cache_policy": NONE, "persist_result": False}
