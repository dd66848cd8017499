from pathlib import Path

import pytest
import torch

from libra_core.training.checkpoint import (
    OPTIMIZER_FILE,
    load_optimizer_state,
    save_optimizer_state,
)


def _stepped_optimizer(shape: tuple[int, ...], lr: float) -> torch.optim.AdamW:
    param = torch.nn.Parameter(torch.ones(shape))
    optimizer = torch.optim.AdamW([param], lr=lr)
    param.grad = torch.full(shape, 0.5)
    optimizer.step()
    return optimizer


def test_optimizer_round_trip_keeps_config_hyperparameters(tmp_path: Path):
    save_optimizer_state(_stepped_optimizer((3,), lr=1e-3), tmp_path / "state")
    assert [p.name for p in (tmp_path / "state").iterdir()] == [OPTIMIZER_FILE]  # no temp file left

    fresh = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=5e-4)
    assert load_optimizer_state(fresh, tmp_path / "state", "cpu")
    assert fresh.param_groups[0]["lr"] == 5e-4  # the current config wins over the saved lr
    state = next(iter(fresh.state.values()))
    assert int(state["step"]) == 1
    torch.testing.assert_close(state["exp_avg"], torch.full((3,), 0.05))  # (1 - 0.9) * 0.5


def test_missing_state_is_not_an_error(tmp_path: Path):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    assert not load_optimizer_state(optimizer, tmp_path / "nothing", "cpu")


def test_mismatched_state_is_refused(tmp_path: Path):
    save_optimizer_state(_stepped_optimizer((3,), lr=1e-3), tmp_path)
    other = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="delete it"):
        load_optimizer_state(other, tmp_path, "cpu")


def test_a_killed_write_leaves_a_temp_file_that_a_resume_deletes(tmp_path: Path, monkeypatch):  # noqa: ANN001
    """The temp files of the policy weights and the optimizer state are named as `atomic_path`
    names them, so `libra run --resume` finds and deletes what a killed update left (before
    2026-12-06 they were `.NAME.PID.tmp`, which it did not look for)."""
    from libra_core.pipeline import resume
    from libra_core.pipeline.run_dir import RunLayout
    from tests.pipeline.test_run_dir import make_run

    layout: RunLayout = make_run(tmp_path)
    written: list[Path] = []

    def killed(obj, path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        Path(path).write_bytes(b"half a file")
        written.append(Path(path))
        raise KeyboardInterrupt  # stands in for the kill: what follows never runs

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_optimizer_state(_stepped_optimizer((3,), lr=1e-3), layout.trainer)
    (tmp,) = written
    assert tmp.parent == layout.trainer and tmp.name.startswith(f".{OPTIMIZER_FILE}.tmp-")
    # atomic_path deletes it on an exception; a SIGKILL would not: put it back as a kill leaves it
    tmp.write_bytes(b"half a file")
    resume._remove_leftovers(layout)
    assert not tmp.exists()


def test_a_policy_folder_without_its_config_is_named(tmp_path: Path) -> None:
    # transformers read the missing folder as a hub repo id: "Repo id must be in the form ..."
    from libra_core.training.checkpoint import load_policy

    with pytest.raises(FileNotFoundError, match=rf"policy folder {tmp_path / 'policy'} holds no config.json"):
        load_policy(tmp_path / "policy", "cpu")
