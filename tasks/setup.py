"""Tasks that create or restore a run and bring up its policy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task

from libra_core.config import load_config, write_resolved_config
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
from tasks.common import TASK_OPTIONS


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
    overrides') becomes one more override, `base_dir/output_dir`. A resume keeps its run's folder."""
    base = Path(base_dir)
    if resume is not None:
        return config_path, overrides, str((base / resume).resolve())
    if config_path is not None:
        config_path = str((base / config_path).resolve())
    output_dir = load_config(config_path, overrides).experiment.output_path
    if not output_dir.is_absolute():
        overrides = [*overrides, f"experiment.output_dir={(base / output_dir).resolve()}"]
    return config_path, overrides, resume


@task(name="create-run", **TASK_OPTIONS)
def create_run_task(
    config_path: str | None, overrides: list[str], resume: str | None, base_dir: str | None = None
) -> RunStart:
    """New run: validate config, make the folder, write the resolved config. Resume: check, then
    restore (pipeline/resume.py). Either way this process takes the folder's lock (run_lock.py),
    which the experiment flow releases when the run ends. `base_dir` (set by `libra serve`): the
    folder relative paths resolve against (`anchor_paths`); None: this process's working folder."""
    if base_dir is not None:
        config_path, overrides, resume = anchor_paths(config_path, overrides, resume, base_dir)
    if resume:
        root = Path(resume).resolve()
        lock_run(root)
        try:
            state = apply_resume(root, plan_resume(root, overrides), overrides)
        except BaseException:
            unlock_run(root)
            raise
        return RunStart(str(root), state.completed_iterations + 1, state.policy_version, True)
    cfg = load_config(config_path, overrides)
    if cfg.planner.type == "libra":
        # As `libra run` does: a wrong model, GPU or workload name (say, edited in the UI) fails
        # here, not after the warm-up at the first plan stage, and leaves no run folder behind.
        from libra_core.planner.service import LibraPlanner

        LibraPlanner.resolve_specs(cfg)
    root = new_run_dir(cfg)
    lock_run(root)
    write_resolved_config(cfg, root)
    write_state(root, RunState(status="running"))
    return RunStart(str(root), 1, 0, False)


@task(name="prepare-policy", **TASK_OPTIONS)
def prepare_policy_task(run_dir: str) -> dict[str, object]:
    """Tokenizer + tiny model + SFT warm-up (or cache hit) into the run's policy folder."""
    import shutil

    from libra_core.model.prepare import prepare_initial_policy

    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    from libra_core.observability.progress import report

    def progress(step: int, total: int, loss: float) -> None:
        report("warm-up", 1, total)

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


@task(name="finish-run", **TASK_OPTIONS)
def finish_run_task(run_dir: str, status: str) -> None:
    state = read_state(run_dir)
    write_state(run_dir, RunState(state.completed_iterations, state.policy_version, status))


@task(name="release-run", **TASK_OPTIONS)
def release_run(run_dir: str) -> None:
    """Release the run folder's lock (the experiment flow's last step, whatever the outcome)."""
    unlock_run(run_dir)
