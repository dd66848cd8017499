"""An interrupt that lands after the create-run task has made the run folder (its state.json says
`running`, its lock held) but before the task returned to the experiment flow. On a loaded machine
a Ctrl-C 2 s after the folder appeared did (tests/flows/test_serve_shutdown.py, once): the flow's
cleanup only knew the folder once the task returned, so it said `running` for good. The real flow
and task run here (Prefect's ephemeral API); only the interrupt is injected, right after the
folder is made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import TEST_OVERRIDES


def _interrupted_after_the_folder(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[Path]:
    """Make `tasks.setup.start_run` raise `error` once the real one has made and locked the
    folder; returns the folders it made."""
    import tasks.setup

    made: list[Path] = []
    real = tasks.setup.start_run

    def start_then_interrupt(*args: object, **kwargs: object) -> object:
        started = real(*args, **kwargs)  # type: ignore[arg-type]
        made.append(Path(started.run_dir))
        raise error

    monkeypatch.setattr(tasks.setup, "start_run", start_then_interrupt)
    return made


@pytest.mark.parametrize(
    ("error", "status"),
    [(KeyboardInterrupt(), "cancelled"), (RuntimeError("disk full"), "failed")],
    ids=["ctrl-c", "error"],
)
def test_a_folder_made_before_an_interrupt_ends_as_the_run_would_have(
    prefect_quiet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException, status: str
) -> None:
    from flows.rl_experiment import rl_experiment
    from libra_core.pipeline.run_dir import read_state
    from libra_core.pipeline.run_lock import held_runs, run_holder

    made = _interrupted_after_the_folder(monkeypatch, error)
    with pytest.raises(type(error)):
        rl_experiment(None, [*TEST_OVERRIDES, f"experiment.output_dir={tmp_path}"])
    (folder,) = made
    assert read_state(folder).status == status  # before: "running"
    assert folder.resolve() not in held_runs() and run_holder(folder) is None  # the lock released
    assert not (folder / "policy").exists()  # nothing ran after the interrupt


def test_a_folder_held_before_the_start_is_not_touched(
    prefect_quiet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Only the folder this start made is ended: another one this process holds (say, a run going on
    # in another thread of `libra serve`'s process) keeps its state and its lock.
    from flows.rl_experiment import rl_experiment
    from libra_core.pipeline.run_dir import RunState, read_state, write_state
    from libra_core.pipeline.run_lock import held_runs, lock_run, unlock_run

    other = tmp_path / "other"
    other.mkdir()
    write_state(other, RunState(3, 3, "running"))
    lock_run(other)
    try:
        made = _interrupted_after_the_folder(monkeypatch, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            rl_experiment(None, [*TEST_OVERRIDES, f"experiment.output_dir={tmp_path / 'runs'}"])
        assert read_state(made[0]).status == "cancelled"
        assert read_state(other) == RunState(3, 3, "running") and other.resolve() in held_runs()
    finally:
        unlock_run(other)
