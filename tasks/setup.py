"""Tasks that create or restore a run and bring up its policy (one core call each:
libra_core/pipeline/run_start.py)."""

from __future__ import annotations

from prefect import task

from libra_core.pipeline.run_lock import unlock_run
from libra_core.pipeline.run_start import RunStart, finish_run, prepare_run_policy, start_run
from tasks.common import TASK_OPTIONS


@task(name="create-run", **TASK_OPTIONS)
def create_run_task(
    config_path: str | None, overrides: list[str], resume: str | None, base_dir: str | None = None
) -> RunStart:
    """A new run's folder, or a resumed one restored (`run_start.start_run`), locked by this process."""
    return start_run(config_path, overrides, resume, base_dir)


@task(name="prepare-policy", **TASK_OPTIONS)
def prepare_policy_task(run_dir: str) -> dict[str, object]:
    """Tokenizer + tiny model + SFT warm-up (or cache hit) into the run's policy folder."""
    from libra_core.observability.progress import report

    def progress(step: int, total: int, loss: float) -> None:
        report("warm-up", 1, total)

    return prepare_run_policy(run_dir, progress)


@task(name="finish-run", **TASK_OPTIONS)
def finish_run_task(run_dir: str, status: str) -> None:
    finish_run(run_dir, status)


@task(name="release-run", **TASK_OPTIONS)
def release_run(run_dir: str) -> None:
    """Release the run folder's lock (the experiment flow's last step, whatever the outcome)."""
    unlock_run(run_dir)
