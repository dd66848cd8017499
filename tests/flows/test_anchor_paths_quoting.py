"""`anchor_paths` pins a relative `experiment.output_dir` (and the planner's spec files) to the
working folder as `--set` overrides: the folder's name must reach the config as it is, whatever it
holds (` #` was read as a YAML comment and cut the path, `: ` made a mapping)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config import load_config
from libra_core.config.overrides import parse_overrides
from libra_core.pipeline.run_lock import unlock_run
from libra_core.pipeline.run_start import _anchored_specs, anchor_paths
from tasks.setup import create_run_task

ODD_NAMES = ["proj #2", "exp: v2", "a 'b' \"c\"", "é😀"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_relative_output_dir_lands_under_the_working_folder_whatever_its_name(
    tmp_path: Path, name: str
) -> None:
    base = tmp_path / name
    base.mkdir()
    _, overrides, _ = anchor_paths(None, [], None, str(base))
    assert load_config(None, overrides).experiment.output_path == base / "runs"


def test_the_run_folder_is_made_there(tmp_path: Path) -> None:
    base = tmp_path / "proj #2"
    base.mkdir()
    start = create_run_task.fn(None, ["experiment.iterations=1"], None, str(base))
    unlock_run(start.run_dir)
    assert Path(start.run_dir).parent == base / "runs"  # was tmp_path/"proj"/..., outside the project


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_spec_file_is_anchored_as_it_is_named(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.yaml").write_text("x: 1\n")
    (tmp_path / f"{name}-gpu.yaml").write_text("x: 1\n")
    overrides = _anchored_specs(f"8x{name}-gpu.yaml", f"{name}.yaml", tmp_path)
    assert parse_overrides(overrides) == {
        "planner.hardware": f"8x{tmp_path / f'{name}-gpu.yaml'}",
        "planner.model_spec": str(tmp_path / f"{name}.yaml"),
    }
