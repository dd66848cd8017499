"""Fixtures for the training tests: a tiny random Qwen2 policy folder and trajectory-row builders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.training.builders import make_row, tiny_qwen2


@pytest.fixture
def row() -> Callable[..., dict[str, Any]]:
    return make_row


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A tiny untied float32 Qwen2 saved as an HF folder (config.json + model.safetensors)."""
    path = tmp_path / "policy"
    tiny_qwen2(seed=0).save_pretrained(path)
    return path
