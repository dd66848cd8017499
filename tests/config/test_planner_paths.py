"""The planner's spec files (`planner.hardware` COUNTxFILE, `planner.model_spec`) are recorded as
absolute paths when a run's config is resolved (tasks/setup.py `anchor_paths`): a resumed run
re-reads them from its resolved config, maybe from another folder. Built-in names stay as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config import load_config
from libra_core.pipeline.run_dir import load_run_config
from libra_core.pipeline.run_lock import unlock_run
from libra_core.pipeline.run_start import anchor_paths
from libra_core.planner.service import LibraPlanner
from tasks.setup import create_run_task

LIBRA = ["planner.type=libra", "planner.initial_workload=math-short"]


@pytest.fixture
def started_in(tmp_path: Path) -> Path:
    """A folder with a hardware spec and a model spec under `specs/`."""
    base = tmp_path / "a"
    (base / "specs").mkdir(parents=True)
    (base / "specs" / "gpu.yaml").write_text("base: H100\nnvlink_gbps_per_dir: 200\n")
    (base / "specs" / "deep.yaml").write_text("base: qwen3-8b\nnum_layers: 72\n")
    return base


def _planner(config_path: str | None, overrides: list[str], base: Path) -> tuple[str, str | None]:
    _, anchored, _ = anchor_paths(config_path, overrides, None, str(base))
    p = load_config(config_path, anchored).planner
    return p.hardware, p.model_spec


def test_relative_spec_files_are_anchored_to_the_base_folder(started_in: Path, tmp_path: Path) -> None:
    overrides = [*LIBRA, f"experiment.output_dir={tmp_path / 'runs'}"]
    got = _planner(
        None,
        [*overrides, "planner.hardware=16xspecs/gpu.yaml", "planner.model_spec=specs/deep.yaml"],
        started_in,
    )
    assert got == (f"16x{started_in / 'specs' / 'gpu.yaml'}", str(started_in / "specs" / "deep.yaml"))
    # from a config file too, and `./` paths
    cfg = started_in / "run.yaml"
    cfg.write_text(
        "planner:\n  type: libra\n  hardware: 8x./specs/gpu.yaml\n  model_spec: ./specs/deep.yaml\n"
    )
    got = _planner(str(cfg), [f"experiment.output_dir={tmp_path / 'runs'}"], started_in)
    assert got == (f"8x{started_in / 'specs' / 'gpu.yaml'}", str(started_in / "specs" / "deep.yaml"))


@pytest.mark.parametrize(
    ("hardware", "model_spec"),
    [
        ("48xA800", "qwen3-8b"),
        ("16xh100-sxm", "Qwen/Qwen3-8B"),  # an alias; a Hugging Face id holds a slash but is built in
        ("16xspecs/missing.yaml", "specs/missing.json"),  # no such file: the check names it as written
    ],
)
def test_built_in_names_and_missing_files_stay_as_written(
    started_in: Path, tmp_path: Path, hardware: str, model_spec: str
) -> None:
    overrides = [*LIBRA, f"experiment.output_dir={tmp_path}", f"planner.hardware={hardware}"]
    assert _planner(None, [*overrides, f"planner.model_spec={model_spec}"], started_in) == (
        hardware,
        model_spec,
    )


def test_a_file_named_like_a_built_in_stays_the_built_in(started_in: Path, tmp_path: Path) -> None:
    (started_in / "qwen3-8b").write_text("base: qwen3-8b\nnum_layers: 2\n")  # get_model reads the built-in
    (started_in / "A800").write_text("base: A800\n")
    overrides = [
        *LIBRA,
        f"experiment.output_dir={tmp_path}",
        "planner.hardware=8xA800",
        "planner.model_spec=qwen3-8b",
    ]
    assert _planner(None, overrides, started_in) == ("8xA800", "qwen3-8b")


def test_a_resumes_overrides_are_anchored_and_its_folder_resolved(started_in: Path) -> None:
    _, overrides, resume = anchor_paths(
        None, ["planner.model_spec=specs/deep.yaml"], "runs/r-1", str(started_in)
    )
    assert resume == str(started_in / "runs" / "r-1")
    assert overrides == [
        "planner.model_spec=specs/deep.yaml",
        f'planner.model_spec="{started_in / "specs" / "deep.yaml"}"',
    ]
    assert anchor_paths(None, ["experiment.iterations=9"], "r", str(started_in))[1] == [
        "experiment.iterations=9"
    ]


def test_a_run_started_in_one_folder_resolves_its_specs_from_another(
    started_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `libra run` (no base_dir): the resolved config stored `16xspecs/gpu.yaml`, and a resume from
    # another folder failed: "hardware 'specs/gpu.yaml' is neither a built-in hardware name nor an
    # existing file".
    monkeypatch.chdir(started_in)
    overrides = [
        *LIBRA,
        "experiment.output_dir=runs",
        "planner.hardware=16xspecs/gpu.yaml",
        "planner.model_spec=specs/deep.yaml",
    ]
    start = create_run_task.fn(None, overrides, None)
    unlock_run(start.run_dir)
    cfg = load_run_config(start.run_dir)
    assert cfg.planner.hardware == f"16x{started_in / 'specs' / 'gpu.yaml'}"
    assert cfg.experiment.output_dir == str(started_in / "runs")
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cluster, model, _ = LibraPlanner.resolve_specs(cfg)
    assert (cluster.label, cluster.hardware.nvlink_gbps_per_dir, model.num_layers) == ("16xgpu", 200, 72)


def test_a_config_and_a_resume_folder_given_with_a_tilde_are_the_home_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # They were joined to base_dir as typed: `~/exp.yaml` became `<base>/~/exp.yaml`, not found.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "exp.yaml").write_text(f"experiment:\n  output_dir: {tmp_path / 'runs'}\n")
    config_path, _, _ = anchor_paths("~/exp.yaml", [], None, str(tmp_path / "base"))
    assert config_path == str(tmp_path / "home" / "exp.yaml")
    _, _, resume = anchor_paths(None, [], "~/runs/x", str(tmp_path / "base"))
    assert resume == str(tmp_path / "home" / "runs" / "x")
