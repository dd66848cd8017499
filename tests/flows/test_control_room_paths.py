"""Where served runs write and what their summaries are called: the folders of experiment and
simulate runs started from the UI (fixed when `libra serve` starts, and a run given another
`config_path` writes under that config's `output_dir`), and the artifact key of an experiment name
(names that slug alike must not share one).

The deployments' default parameters come from flows/serve.py as `libra serve` builds them; the runs
call the flows' functions (`.fn`) in this process, with the working folder changed after "serve
time", as a served run's may be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import flows.rl_experiment as rl_module
from flows.serve import build_deployments, experiment_parameters, simulate_parameters
from libra_core.config import load_config
from libra_core.pipeline.run_dir import load_run_config
from libra_core.pipeline.run_lock import unlock_run
from libra_core.pipeline.run_start import RunStart, anchor_paths
from tasks.artifacts import artifact_key
from tasks.setup import create_run_task

# --- the run-summary artifact key ---------------------------------------------------------------


def test_names_that_slug_alike_get_distinct_valid_keys() -> None:
    from prefect.types.names import ArtifactKey
    from pydantic import TypeAdapter

    names = ["arith-grpo", "arith_grpo", "Arith.GRPO", "ARITH-GRPO", "arith--grpo"]
    keys = [artifact_key(n, "summary") for n in names]
    assert len(set(keys)) == len(names), keys  # one run's summary never overwrites another's
    valid = TypeAdapter(ArtifactKey)
    assert [valid.validate_python(k) for k in keys] == keys  # Prefect accepts every one
    assert all(k.startswith("libra-arith-grpo-") and k.endswith("-summary") for k in keys)


def test_a_name_that_is_a_slug_keeps_its_plain_key_and_others_a_pinned_hash() -> None:
    # nightly runs of one experiment version one artifact: the key must not change between runs
    # or releases (docs/control-room.md quotes `libra-<experiment name>-summary`)
    assert artifact_key("arith-grpo", "summary") == "libra-arith-grpo-summary"
    assert artifact_key("arith_grpo", "summary") == "libra-arith-grpo-6125a7e2-summary"
    assert artifact_key("Arith.GRPO", "summary") == "libra-arith-grpo-1573cc9d-summary"
    assert artifact_key("__", "summary") == "libra-run-9911f4d2-summary"


# --- experiment runs started from the UI -------------------------------------------------------


class Stop(Exception):
    """Raised after the run folder is made: these tests are about where it is, not the run."""


@pytest.fixture
def made_runs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Run folders the experiment flow makes (with the real create-run task), newest last; the flow
    stops right after."""
    made: list[Path] = []

    def create_then_stop(
        config_path: str | None, overrides: list[str], resume: str | None, base_dir: str | None
    ) -> RunStart:
        start = create_run_task.fn(config_path, overrides, resume, base_dir)
        unlock_run(start.run_dir)
        made.append(Path(start.run_dir))
        raise Stop

    monkeypatch.setattr(rl_module, "create_run_task", create_then_stop)
    return made


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`libra serve configs/served.yaml` started in `tmp/serve-cwd`, whose config's output_dir is
    relative, then the working folder changed: what the experiment deployment's defaults are."""
    base = tmp_path / "serve-cwd"
    _config(base / "configs" / "served.yaml", "served", "served-runs")
    _config(base / "configs" / "other.yaml", "other", "other-runs")
    _config(base / "configs" / "absolute.yaml", "absolute", str(tmp_path / "elsewhere-runs"))
    monkeypatch.chdir(base)
    params = experiment_parameters("configs/served.yaml", ["experiment.iterations=2"])
    monkeypatch.chdir(_mkdir(tmp_path / "later-cwd"))
    return params


def _config(path: Path, name: str, output_dir: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"experiment:\n  name: {name}\n  output_dir: {output_dir}\n")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _run(params: dict[str, Any]) -> None:
    with pytest.raises(Stop):
        rl_module.rl_experiment.fn(**params)


def test_the_served_configs_runs_land_under_its_output_dir_at_serve_time(
    served: dict[str, Any], made_runs: list[Path], tmp_path: Path
) -> None:
    base = tmp_path / "serve-cwd"
    assert served == {
        "config_path": str(base / "configs" / "served.yaml"),
        "overrides": ["experiment.iterations=2"],  # no output_dir pinned
        "base_dir": str(base),
    }
    _run(served)
    (run,) = made_runs
    assert run.parent == base / "served-runs" and run.name.startswith("served-")
    cfg = load_run_config(run)
    assert (cfg.experiment.output_dir, cfg.experiment.iterations) == (str(base / "served-runs"), 2)


@pytest.mark.parametrize("config_path", ["configs/other.yaml", "ABS"])
def test_another_config_chosen_in_the_ui_writes_under_its_own_output_dir(
    served: dict[str, Any], made_runs: list[Path], tmp_path: Path, config_path: str
) -> None:
    # The served deployment used to pin experiment.output_dir to the served config's folder in
    # its default overrides, so this run landed in serve-cwd/served-runs.
    base = tmp_path / "serve-cwd"
    other = str(base / "configs" / "other.yaml") if config_path == "ABS" else config_path
    _run({**served, "config_path": other})  # a relative path resolves against base_dir too
    (run,) = made_runs
    assert run.parent == base / "other-runs" and run.name.startswith("other-")


def test_an_absolute_output_dir_or_one_from_the_ui_overrides_is_kept(
    served: dict[str, Any], made_runs: list[Path], tmp_path: Path
) -> None:
    base = tmp_path / "serve-cwd"
    _run({**served, "config_path": str(base / "configs" / "absolute.yaml")})
    _run({**served, "overrides": [*served["overrides"], "experiment.output_dir=ui-runs"]})
    assert [r.parent for r in made_runs] == [tmp_path / "elsewhere-runs", base / "ui-runs"]


def test_libra_run_passes_its_paths_through_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def record(*args: Any) -> RunStart:
        seen.append(args)
        raise Stop

    monkeypatch.setattr(rl_module, "create_run_task", record)
    _run({"config_path": "x.yaml", "overrides": ["experiment.iterations=1"], "resume": None})
    _run({"config_path": None, "overrides": None, "resume": "runs/r-1"})
    assert seen == [("x.yaml", ["experiment.iterations=1"], None, None), (None, [], "runs/r-1", None)]


def test_a_resume_from_the_ui_resolves_its_folder_against_base_dir(tmp_path: Path) -> None:
    anchored = anchor_paths(None, ["experiment.iterations=9"], "runs/r-1", str(tmp_path))
    assert anchored == (None, ["experiment.iterations=9"], str(tmp_path / "runs" / "r-1"))


# --- simulate runs started from the UI -----------------------------------------------------------


@pytest.fixture
def simulate_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(_mkdir(tmp_path / "serve-cwd"))
    params = simulate_parameters()
    monkeypatch.chdir(_mkdir(tmp_path / "later-cwd"))
    return params


@pytest.mark.parametrize("out_dir", [None, "sims/a"])
def test_a_simulate_run_writes_under_the_serve_time_folder(
    prefect_quiet: None, simulate_defaults: dict[str, Any], tmp_path: Path, out_dir: str | None
) -> None:
    # The default out_dir, runs/simulate/SCENARIO-TIMESTAMP, was relative to the working folder of
    # the serve process at the time the run ran.
    from flows.simulate_flow import simulate_flow

    base = tmp_path / "serve-cwd"
    assert simulate_defaults == {"out_dir": None, "base_dir": str(base)}
    out = Path(simulate_flow("tiny", "8xA800", 2, "greedy", **{**simulate_defaults, "out_dir": out_dir}))
    assert (out / "summary.json").is_file()
    if out_dir is None:
        assert out.parent == base / "runs" / "simulate" and out.name.startswith("tiny-")
    else:
        assert out == base / "sims" / "a"
    assert not list((tmp_path / "later-cwd").iterdir())  # nothing under the working folder


def test_serve_builds_deployments_with_the_serve_time_base_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    experiment, sim = build_deployments(None, [], load_config(None))
    assert experiment.parameters == {"config_path": None, "overrides": [], "base_dir": str(tmp_path)}
    assert sim.parameters == {"out_dir": None, "base_dir": str(tmp_path)}
