"""The start of a run, new or resumed, and its policy: what the experiment flow's first tasks
(tasks/setup.py) wrap, one call each.

`start_run` validates and checks a config, makes the run folder (or restores one for a resume,
pipeline/resume.py) and takes its lock (run_lock.py); `prepare_run_policy` brings up the initial
policy (and the KL reference); `finish_run` records how the run ended. Paths a served deployment
passes are resolved against the folder `libra serve` was started in (`anchor_paths`).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libra_core.config import load_config, write_resolved_config
from libra_core.config.loader import apply_overrides
from libra_core.config.overrides import parse_overrides, yaml_quoted
from libra_core.pipeline.preflight import check_before_run
from libra_core.pipeline.resume import apply_resume, plan_resume
from libra_core.pipeline.run_dir import (
    RunLayout,
    RunState,
    load_run_config,
    new_run_dir,
    read_state,
    write_state,
)
from libra_core.pipeline.run_lock import lock_run, unlock_run


@dataclass(frozen=True)
class RunStart:
    run_dir: str
    start_iteration: int  # first iteration to run (1-based)
    policy_version: int
    resumed: bool


def anchor_paths(
    config_path: str | None, overrides: list[str], resume: str | None, base_dir: str
) -> tuple[str | None, list[str], str | None]:
    """`config_path`, `overrides` and `resume` with their relative paths resolved against
    `base_dir`: a relative `experiment.output_dir` of the config they load (its file's or the
    overrides') becomes one more override, `base_dir/output_dir`, and so does a planner spec file
    (`planner.model_spec`, the FILE of `planner.hardware` COUNTxFILE) given as a relative path of a
    file under `base_dir`: a resumed run re-reads its specs from its resolved config, maybe from
    another folder. A resume keeps its run's folder and anchors the spec files of its overrides."""
    base = Path(base_dir)
    if resume is not None:
        raw = apply_overrides({}, parse_overrides(overrides)).get("planner")
        if isinstance(raw, dict):
            hardware, model_spec = raw.get("hardware"), raw.get("model_spec")
            overrides = [*overrides, *_anchored_specs(hardware, model_spec, base)]
        # `~` as a shell would: `base / "~/runs/x"` was a folder named `~` under base_dir
        return config_path, overrides, str((base / Path(resume).expanduser()).resolve())
    if config_path is not None:
        config_path = str((base / Path(config_path).expanduser()).resolve())
    cfg = load_config(config_path, overrides)
    output_dir = cfg.experiment.output_path
    if not output_dir.is_absolute():
        # quoted: a working folder with ` #` or `: ` in it is no YAML comment or mapping
        overrides = [*overrides, f"experiment.output_dir={yaml_quoted(str((base / output_dir).resolve()))}"]
    overrides = [*overrides, *_anchored_specs(cfg.planner.hardware, cfg.planner.model_spec, base)]
    return config_path, overrides, resume


def _anchored_specs(hardware: object, model_spec: object, base: Path) -> list[str]:
    """Overrides giving the planner's spec files as absolute paths under `base`. Built-in names
    (`48xA800`, `qwen3-8b`, `Qwen/Qwen3-8B`), absolute or `~` paths and text that names no file
    under `base` stay as written (the planner's check names a missing file as the user wrote it)."""
    from libra_core.planner.specs import builtin_hardware, builtin_model

    def anchored(path_text: str) -> Path | None:
        path = Path(path_text)
        if path.expanduser().is_absolute() or not (base / path).is_file():
            return None
        return (base / path).resolve()

    out = []
    match = re.match(r"^([0-9]+)x(.*)$", hardware) if isinstance(hardware, str) else None
    if match and builtin_hardware(match.group(2)) is None:
        path = anchored(match.group(2).strip())
        if path is not None:
            out.append(f"planner.hardware={yaml_quoted(f'{match.group(1)}x{path}')}")
    if isinstance(model_spec, str) and builtin_model(model_spec) is None:
        path = anchored(model_spec.strip())
        if path is not None:
            out.append(f"planner.model_spec={yaml_quoted(str(path))}")
    return out


def start_run(
    config_path: str | None, overrides: list[str], resume: str | None, base_dir: str | None = None
) -> RunStart:
    """New run: validate and check the config, make the folder, write the resolved config. Resume:
    check, then restore (pipeline/resume.py). Either way this process takes the folder's lock
    (run_lock.py), which the experiment flow releases when the run ends. `base_dir` (set by `libra
    serve`): the folder relative paths resolve against (`anchor_paths`); None: this process's
    working folder. The resolved config records them absolute, so a resume from another folder
    reads the same."""
    base = base_dir if base_dir is not None else str(Path.cwd())
    config_path, overrides, resume = anchor_paths(config_path, overrides, resume, base)
    if resume:  # `config_path` is not read: the run's own resolved config resumes
        root = Path(resume).resolve()
        # Checked before the lock, which would name `.lock` for a folder that does not exist and
        # leave one in a folder that is no run's (`libra run --resume` checks it earlier too).
        load_run_config(root)
        lock_run(root)
        try:
            plan = plan_resume(root, overrides)
            # checked before the folder changes: a bad override would be written into the run's
            # config, and every later resume of it refused
            check_before_run(plan.cfg)
            state = apply_resume(root, plan, overrides)
        except BaseException:
            unlock_run(root)
            raise
        return RunStart(str(root), state.completed_iterations + 1, state.policy_version, True)
    cfg = load_config(config_path, overrides)
    # As `libra run` does: a wrong model, GPU or workload name (say, edited in the UI) or a missing
    # data file fails here, not after the warm-up, and leaves no run folder behind.
    check_before_run(cfg)
    root = new_run_dir(cfg)
    lock_run(root)
    write_resolved_config(cfg, root)
    write_state(root, RunState(status="running"))
    return RunStart(str(root), 1, 0, False)


def prepare_run_policy(
    run_dir: str, progress: Callable[[int, int, float], None] | None = None
) -> dict[str, object]:
    """Tokenizer + tiny model + SFT warm-up (or a cache hit, or a copy of an `hf_local` model) into
    the run's policy folder, and the KL reference beside it when `kl_coef > 0`."""
    from libra_core.model.prepare import prepare_initial_policy

    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    prepared = prepare_initial_policy(
        cfg, layout.policy, cfg.experiment.output_path / ".cache", progress=progress
    )
    if cfg.training.grpo.kl_coef > 0:
        shutil.copytree(layout.policy, layout.reference, dirs_exist_ok=True)
    return {
        "num_params": prepared.num_params,
        "from_cache": prepared.from_cache,
        "greedy_accuracy": prepared.greedy_accuracy,
    }


def finish_run(run_dir: str, status: str) -> None:
    """Record how the run ended (`finished`, `failed`, `cancelled`) in its state.json."""
    state = read_state(run_dir)
    write_state(run_dir, RunState(state.completed_iterations, state.policy_version, status))
