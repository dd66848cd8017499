from __future__ import annotations

import os
from pathlib import Path

import pytest

from libra_core.config import load_config, write_resolved_config
from libra_core.pipeline.resume import apply_resume, plan_resume
from libra_core.pipeline.run_dir import (
    RunLayout,
    RunState,
    checkpoint_dirs,
    load_run_config,
    new_run_dir,
    read_state,
    save_checkpoint,
    write_state,
)


def make_run(tmp_path: Path) -> RunLayout:
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}"])
    root = new_run_dir(cfg)
    write_resolved_config(cfg, root)
    layout = RunLayout(root)
    layout.policy.mkdir()
    (layout.policy / "config.json").write_text("{}")
    layout.trainer.mkdir()
    return layout


def write_optimizer_state(path: Path, label: str) -> None:
    """A small `torch.save` archive standing for an optimizer state: a resume refuses a checkpoint
    whose copy is not a whole archive."""
    import torch

    torch.save({"label": label}, path)


def optimizer_label(path: Path) -> str:
    import torch

    return torch.load(path, weights_only=True)["label"]


def test_checkpoint_restore_roundtrip_and_retention(tmp_path: Path) -> None:
    layout = make_run(tmp_path)
    for it in (1, 2, 3):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        write_optimizer_state(layout.trainer / "optimizer.pt", f"adam-{it}")
        state = RunState(it, it, "running")
        write_state(layout.root, state)
        save_checkpoint(layout.root, it, state, keep=2)
    assert [p.name for p in sorted(layout.checkpoints.iterdir())] == ["iter_00002", "iter_00003"]
    assert checkpoint_dirs(layout.root)[-1] == layout.checkpoint(3)

    # the run went on past the checkpoint and then died
    (layout.policy / "model.safetensors").write_text("weights-4-partial")
    write_state(layout.root, RunState(4, 4, "failed"))
    state = apply_resume(layout.root, plan_resume(layout.root))
    assert state == RunState(3, 3, "running")
    assert read_state(layout.root) == state
    assert (layout.policy / "model.safetensors").read_text() == "weights-3"
    assert optimizer_label(layout.trainer / "optimizer.pt") == "adam-3"


def test_restore_without_checkpoint_starts_over(tmp_path: Path) -> None:
    layout = make_run(tmp_path)
    assert apply_resume(layout.root, plan_resume(layout.root)) == RunState(0, 0, "running")


def test_run_dirs_are_unique_and_config_readable(tmp_path: Path) -> None:
    a = make_run(tmp_path)
    b = make_run(tmp_path)
    assert a.root != b.root
    assert load_run_config(a.root).experiment.output_dir == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        load_run_config(tmp_path / "nope")


def test_decoupled_ppo_runs_its_proximal_pass_only_when_async() -> None:
    from libra_core.config.pipeline import PipelineConfig
    from libra_core.pipeline.update_stage import uses_decoupled_ppo

    assert uses_decoupled_ppo(PipelineConfig(mode="async", max_staleness=4, decoupled_ppo=True))
    assert not uses_decoupled_ppo(PipelineConfig(mode="async", max_staleness=4, decoupled_ppo=False))
    assert not uses_decoupled_ppo(PipelineConfig(mode="sync", decoupled_ppo=True))


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    from datetime import datetime

    cfg = load_config(None, [f"experiment.output_dir={tmp_path / 'runs'}"])
    now = datetime(2026, 12, 6, 4, 45, 40)
    # new_run_dir used to return a free name and leave the mkdir to its caller: two callers in one
    # second both got ...-2 and the slower one failed with FileExistsError.
    folders = [new_run_dir(cfg, now) for _ in range(3)]
    assert [f.name for f in folders] == [f"arith-grpo-20261206-044540{s}" for s in ("", "-2", "-3")]
    assert all(f.is_dir() and not any(f.iterdir()) for f in folders)


def test_a_state_entry_that_is_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    layout = make_run(tmp_path)
    layout.state.mkdir()  # was an IsADirectoryError traceback from `libra report`
    with pytest.raises(ValueError, match=r"run state .*state\.json cannot be read: Is a directory"):
        read_state(layout.root)


def test_a_tilde_output_dir_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--set experiment.output_dir=~/runs` reaches the config unexpanded; runs went to ./~/runs
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["experiment.output_dir=~/runs"])
    run = new_run_dir(cfg)
    assert run.parent == tmp_path / "home" / "runs"
    assert not (tmp_path / "~").exists()


def test_a_checkpoint_keeps_the_tree_its_own_rollout_left(tmp_path: Path) -> None:
    """Async: the next rollout has already updated the live tree when iteration N's checkpoint is
    taken; a resume from it redoes that rollout, whose trajectories were then counted twice."""
    layout = make_run(tmp_path)
    layout.scheduler_tree.parent.mkdir(parents=True)
    layout.scheduler_tree.write_text("tree after rollout 4")  # the overlapped rollout's
    layout.scheduler_tree_at(3).parent.mkdir(parents=True)
    layout.scheduler_tree_at(3).write_text("tree after rollout 3")
    ckpt = save_checkpoint(layout.root, 3, RunState(3, 3, "running"), keep=2)
    assert (ckpt / "scheduler" / layout.scheduler_tree.name).read_text() == "tree after rollout 3"
    # sync mode keeps no snapshot: the live tree is the one its rollout left
    ckpt = save_checkpoint(layout.root, 4, RunState(4, 4, "running"), keep=2)
    assert (ckpt / "scheduler" / layout.scheduler_tree.name).read_text() == "tree after rollout 4"


def test_an_async_rollout_keeps_its_own_copy_of_the_tree(tmp_path: Path) -> None:
    from libra_core.config.models import SchedulerConfig
    from libra_core.pipeline.rollout_stage import _save_scheduler
    from libra_core.scheduling.base import FinishedTrajectory, SchedRequest, Turn
    from libra_core.scheduling.cmlfq import CMLFQScheduler
    from libra_core.scheduling.tree_io import load_tree

    layout = make_run(tmp_path)
    s = CMLFQScheduler(SchedulerConfig(type="cmlfq", buckets=(100,)))
    s.admit(SchedRequest("r", "p", 10, 0))
    s.on_finish(FinishedTrajectory("r", "p", 10, 0, 0, (Turn(20, None, 0, None),)))
    _save_scheduler(s, layout)  # sync: the live tree only
    assert layout.scheduler_tree.is_file() and not layout.scheduler_tree_at(3).exists()
    _save_scheduler(s, layout, 3)  # async: and iteration 3's own
    assert load_tree(layout.scheduler_tree_at(3)).prompts.keys() == {"p"}


def test_checkpoints_are_ordered_by_iteration_past_five_digits(tmp_path: Path) -> None:
    # By name iter_100000 came before iter_99999: the newest was deleted as the oldest.
    layout = make_run(tmp_path)
    for it in (99_998, 99_999, 100_000):
        save_checkpoint(layout.root, it, RunState(it, it, "running"), keep=2)
    (layout.checkpoints / "iter_notes.txt").write_text("not a checkpoint")  # left alone, not read
    assert checkpoint_dirs(layout.root)[-1] == layout.checkpoint(100_000)
    assert [p.name for p in checkpoint_dirs(layout.root)] == ["iter_99999", "iter_100000"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_a_checkpoint_is_synced_before_its_name_appears(tmp_path: Path, monkeypatch) -> None:
    layout = make_run(tmp_path)
    (layout.policy / "model.safetensors").write_text("weights")
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    seen: list[list[str]] = []
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(list(synced)), real_replace(a, b)))
    save_checkpoint(layout.root, 1, RunState(1, 1, "running"), keep=2)
    staging = str(layout.checkpoints / ".iter_00001.staging")
    assert f"{staging}/policy/model.safetensors" in seen[-1] and f"{staging}/state.json" in seen[-1]
    assert synced[-1] == str(layout.checkpoints)  # the new name, after the rename


def test_a_failed_checkpoint_copy_leaves_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk mid-copy left `.iter_N.staging` holding the space until a resume, and the error
    # was shutil.Error's list of tuples (until 2026-12-07).
    import errno
    import shutil

    layout = make_run(tmp_path)
    (layout.policy / "model.safetensors").write_text("weights")
    copy = shutil.copyfile

    def full(src: str, dst: str, **kwargs: object) -> object:
        if os.fspath(src).endswith("model.safetensors"):  # copytree passes DirEntry objects
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "copyfile", full)  # what copytree's copy2 calls
    with pytest.raises(
        OSError, match=r"copying .*policy to .*failed: .*model.safetensors -> .*No space left"
    ) as err:
        save_checkpoint(layout.root, 1, RunState(1, 1, "running"), keep=2)
    assert "[(" not in str(err.value)
    assert list(layout.checkpoints.iterdir()) == []  # no staging copy, no checkpoint


def test_a_kill_while_rotating_leaves_no_half_deleted_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The oldest checkpoint was deleted in place: a kill mid-delete left it half gone under its real
    # name, and a resume that met it refused it as incomplete (until 2026-12-07).
    import shutil

    layout = make_run(tmp_path)
    for it in (1, 2):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        save_checkpoint(layout.root, it, RunState(it, it, "running"), keep=2)
    rmtree = shutil.rmtree

    def killed(path: object, *args: object, **kwargs: object) -> None:
        weights = Path(str(path)) / "policy" / "model.safetensors"
        if Path(str(path)).name in {"iter_00001", ".iter_00001.old"} and weights.exists():
            weights.unlink()  # dies half-way through
            raise KeyboardInterrupt
        rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", killed)
    (layout.policy / "model.safetensors").write_text("weights-3")
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(layout.root, 3, RunState(3, 3, "running"), keep=2)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    for ckpt in checkpoint_dirs(layout.root):  # every checkpoint under its real name is whole
        assert (ckpt / "policy" / "model.safetensors").exists(), ckpt


def test_an_output_dir_under_a_file_names_the_setting_and_makes_nothing(tmp_path: Path) -> None:
    # A run started from the UI or a schedule skips the CLI's output check: start_run failed with
    # a bare "NotADirectoryError: [Errno 20] Not a directory" naming no setting (until 2026-12-07).
    from libra_core.pipeline.run_start import start_run

    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "sub"
    with pytest.raises(ValueError, match=r"experiment.output_dir '.*afile/sub': cannot make the run folder"):
        start_run(None, [f"experiment.output_dir={bad}"], None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
