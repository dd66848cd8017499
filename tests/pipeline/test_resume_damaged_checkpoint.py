"""A checkpoint's optimizer state or C-MLFQ tree that is damaged (a bad disk, a partial rsync): the
resume refuses it, naming the file, before it changes anything; the update names a damaged live
optimizer state. Both were accepted, copied over the live files, and failed later with torch's
"failed reading zip archive" or an error naming only the live copy."""

from __future__ import annotations

import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from libra_core.config import load_config, write_resolved_config
from libra_core.pipeline.resume import ResumeError, apply_resume, plan_resume
from libra_core.pipeline.run_dir import RunLayout, RunState, new_run_dir, save_checkpoint, write_state
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, save_tree
from libra_core.training.checkpoint import load_optimizer_state, save_optimizer_state


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4)


def _stepped(model: torch.nn.Module, steps: int) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
    return optimizer


def _run(tmp_path: Path) -> RunLayout:
    """4 iterations completed, the last failed; checkpoints at 2 and 3, each with a real optimizer
    state (iteration N: N steps) and a real C-MLFQ tree (version N)."""
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}"])
    root = new_run_dir(cfg)
    write_resolved_config(cfg, root)
    layout = RunLayout(root)
    layout.policy.mkdir()
    (layout.policy / "config.json").write_text("{}")
    layout.scheduler_tree.parent.mkdir()
    for it in range(1, 5):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        save_optimizer_state(_stepped(_model(), it), layout.trainer)
        tree = PrefixTree()
        tree.version = it
        save_tree(tree, layout.scheduler_tree)
        write_state(layout.root, RunState(it, it, "running"))
        if it in (2, 3):
            save_checkpoint(layout.root, it, RunState(it, it, "running"), keep=2)
    write_state(layout.root, RunState(4, 4, "failed"))
    return layout


def _flip_member_byte(path: Path, member_suffix: str) -> None:
    """Flip one byte of a zip member's data: the archive still opens, its CRC-32 no longer holds."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member_suffix))
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "half":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "text":
        path.write_text("adam-3")
    elif how == "storage_byte":  # a tensor's bytes: torch.load reads it without an error
        _flip_member_byte(path, "/data/0")
    elif how == "pickle_byte":
        _flip_member_byte(path, "/data.pkl")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("file", "how", "message"),
    [
        ("trainer/optimizer.pt", "truncated", r"trainer/optimizer.pt is damaged: not a readable torch.save"),
        ("trainer/optimizer.pt", "empty", r"trainer/optimizer.pt is damaged: not a readable torch.save"),
        (
            "trainer/optimizer.pt",
            "storage_byte",
            r"trainer/optimizer.pt is damaged: its member .*/data/0 fails",
        ),
        ("scheduler/cmlfq_tree.json", "json", r"scheduler/cmlfq_tree.json is not a JSON C-MLFQ tree"),
        ("scheduler/cmlfq_tree.json", "not_a_tree", r"scheduler/cmlfq_tree.json: not a C-MLFQ tree"),
    ],
)
def test_a_damaged_checkpoint_file_is_named_and_the_resume_changes_nothing(
    tmp_path: Path, file: str, how: str, message: str
) -> None:
    layout = _run(tmp_path)
    damaged = layout.checkpoint(3) / file
    if how == "json":
        damaged.write_text('{"trunc')
    elif how == "not_a_tree":
        damaged.write_text("{}")
    else:
        _damage(damaged, how)
    before = _snapshot(layout.root)
    with pytest.raises(ResumeError, match=message) as err:
        plan_resume(layout.root)
    assert str(damaged) in str(err.value)
    assert "nothing was changed. Delete it to resume from the checkpoint before it" in str(err.value)
    assert _snapshot(layout.root) == before

    # The remedy the message gives: without the damaged checkpoint, the one before it is restored.
    shutil.rmtree(layout.checkpoint(3))
    plan = plan_resume(layout.root)
    assert plan.checkpoint == layout.checkpoint(2)
    assert apply_resume(layout.root, plan) == RunState(2, 2, "running")
    model = _model()
    fresh = torch.optim.AdamW(model.parameters())
    assert load_optimizer_state(fresh, layout.trainer, "cpu")
    expected = _stepped(_model(), 2).state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], expected)
    assert fresh.state_dict()["state"][0]["step"].item() == 2.0
    assert load_tree(layout.scheduler_tree).version == 2


@pytest.mark.parametrize("how", ["truncated", "half", "empty", "text", "pickle_byte"])
def test_load_optimizer_state_names_a_damaged_file(tmp_path: Path, how: str) -> None:
    path = save_optimizer_state(_stepped(_model(), 1), tmp_path)
    _damage(path, how)
    with pytest.raises(ValueError, match=r"optimizer.pt is damaged \(") as err:
        load_optimizer_state(torch.optim.AdamW(_model().parameters()), tmp_path, "cpu")
    assert str(path) in str(err.value)
    assert "resume the run from a checkpoint" in str(err.value)
    assert "delete the file to restart the optimizer" in str(err.value)


def test_load_optimizer_state_passes_on_a_failure_that_is_not_the_files(tmp_path: Path) -> None:
    # A whole archive that weights_only refuses (an object, not tensors): the file is not damaged,
    # and torch's own error is what the caller gets, not a "damaged" one.
    path = tmp_path / "optimizer.pt"
    torch.save({"state": {0: {"exp_avg": _Foreign()}}, "param_groups": []}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_optimizer_state(torch.optim.AdamW(_model().parameters()), tmp_path, "cpu")
    # ... while a damaged one is named (a RuntimeError naming no file until 2026-12-07)
    _damage(path, "truncated")
    with pytest.raises(ValueError, match=f"{path} is damaged"):
        load_optimizer_state(torch.optim.AdamW(_model().parameters()), tmp_path, "cpu")


class _Foreign:
    pass
