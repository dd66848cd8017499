"""What the C-MLFQ tree is keyed by (payload-class edges, prompt-size bins) is checked on resume
against the tree the resume makes live: the checkpoint's copy. The live tree was checked: with it
removed (as the rollout's message advised), new keys were accepted and written into the config,
the old-keyed copy was restored, and every later rollout failed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from libra_core.config import load_config, write_resolved_config
from libra_core.pipeline.resume import ResumeError, apply_resume, plan_resume
from libra_core.pipeline.run_dir import (
    RunLayout,
    RunState,
    load_run_config,
    new_run_dir,
    save_checkpoint,
    write_state,
)
from libra_core.scheduling.base import Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, save_tree


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(tmp_path: Path, tree_at_checkpoint: PrefixTree | None) -> RunLayout:
    """A C-MLFQ run: 4 iterations completed, the last failed, a checkpoint at 3 holding
    `tree_at_checkpoint` (None: taken under a static scheduler); the live tree, default-keyed, is
    the abandoned iteration 4's."""
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}", "scheduler.type=cmlfq"])
    root = new_run_dir(cfg)
    write_resolved_config(cfg, root)
    layout = RunLayout(root)
    layout.policy.mkdir()
    (layout.policy / "config.json").write_text("{}")
    (layout.policy / "model.safetensors").write_text("weights-3")
    layout.scheduler_tree.parent.mkdir()
    if tree_at_checkpoint is not None:
        save_tree(tree_at_checkpoint, layout.scheduler_tree)
    write_state(root, RunState(3, 3, "running"))
    save_checkpoint(root, 3, RunState(3, 3, "running"), keep=2)
    save_tree(PrefixTree.from_config(cfg.scheduler), layout.scheduler_tree)
    write_state(root, RunState(4, 4, "failed"))
    return layout


def _first_rollout_loads(layout: RunLayout) -> PrefixTree:
    """What the rollout stage does with a live tree (rollout_stage._load_scheduler)."""
    scheduler = CMLFQScheduler.from_saved(
        load_run_config(layout.root).scheduler, load_tree(layout.scheduler_tree)
    )
    return scheduler.tree


def _sized_tree() -> PrefixTree:
    """A default-keyed tree (4 bins per octave) whose size level holds a prompt."""
    tree = PrefixTree()
    tree.insert("p", [Turn(12, None, 0, None)], 1, prompt_tokens=100)
    assert tree.size_classes
    return tree


@pytest.mark.parametrize(
    ("tree", "override", "message"),
    [
        (
            PrefixTree(),
            "scheduler.payload_class_edges=[8,64]",
            r"built with scheduler.payload_class_edges=\[16, 256, 2048\]; the config asks for "
            r"scheduler.payload_class_edges=\[8, 64\]\); resume with the tree's values "
            r"\(--set scheduler.payload_class_edges=\[16,256,2048\]\)",
        ),
        (
            _sized_tree(),
            "scheduler.prompt_size_bins_per_octave=2",
            r"built with scheduler.prompt_size_bins_per_octave=4.0; the config asks for "
            r"scheduler.prompt_size_bins_per_octave=2.0\); resume with the tree's values "
            r"\(--set scheduler.prompt_size_bins_per_octave=4.0\)",
        ),
    ],
)
def test_the_keys_are_checked_against_the_checkpoints_tree_with_the_live_one_removed(
    tmp_path: Path, tree: PrefixTree, override: str, message: str
) -> None:
    layout = _run(tmp_path, tree)
    layout.scheduler_tree.unlink()  # removed by hand
    before = _snapshot(layout.root)
    with pytest.raises(ResumeError, match=message) as err:
        plan_resume(layout.root, [override])
    assert str(layout.checkpoint(3) / "scheduler" / "cmlfq_tree.json") in str(err.value)
    assert _snapshot(layout.root) == before  # the config was not rewritten, the tree not restored

    # The values the message gives resume the run, and its first rollout loads the restored tree.
    remedy = re.search(r"\((--set \S+)\)", str(err.value))
    assert remedy is not None
    again = [remedy.group(1).removeprefix("--set ")]
    apply_resume(layout.root, plan_resume(layout.root, again), again)
    loaded = _first_rollout_loads(layout)
    assert loaded.payload_edges == (16, 256, 2048) and loaded.size_bins_per_octave == 4.0


def test_new_keys_are_taken_when_the_resume_restores_no_tree(tmp_path: Path) -> None:
    # The checkpoint was taken under a static scheduler: the resume deletes the live tree (it learnt
    # the iterations redone), so nothing is keyed by the old edges any more (refused until 2026-12-07).
    layout = _run(tmp_path, None)
    assert load_tree(layout.scheduler_tree).payload_edges == (16, 256, 2048)
    overrides = ["scheduler.payload_class_edges=[8,64]"]
    apply_resume(layout.root, plan_resume(layout.root, overrides), overrides)
    assert not layout.scheduler_tree.exists()
    assert load_run_config(layout.root).scheduler.payload_class_edges == (8, 64)


def test_an_empty_size_level_takes_the_new_bins(tmp_path: Path) -> None:
    # As the rollout does: a tree whose size level is empty is not keyed by the bins yet. The
    # edges of the same tree still are (the live tree, removed, was checked until 2026-12-07).
    layout = _run(tmp_path, PrefixTree())
    layout.scheduler_tree.unlink()
    with pytest.raises(ResumeError, match=r"scheduler.payload_class_edges cannot change on resume"):
        plan_resume(layout.root, ["scheduler.payload_class_edges=[8,64]"])
    overrides = ["scheduler.prompt_size_bins_per_octave=2"]
    apply_resume(layout.root, plan_resume(layout.root, overrides), overrides)
    assert _first_rollout_loads(layout).size_bins_per_octave == 2.0


def test_the_rollouts_advice_for_a_mismatched_tree_resumes_the_run(tmp_path: Path) -> None:
    # The rollout's message advised removing scheduler/cmlfq_tree.json, which a resume restores
    # from its checkpoint, keyed as before (until 2026-12-07). A config edited by hand:
    layout = _run(tmp_path, PrefixTree())
    config = layout.config.read_text()
    edited = re.sub(r"payload_class_edges:\n(  - \d+\n)+", "payload_class_edges:\n  - 8\n  - 64\n", config)
    assert edited != config
    layout.config.write_text(edited)
    with pytest.raises(ValueError, match=r"the config asks for \[8, 64\]") as err:
        _first_rollout_loads(layout)
    assert "remove scheduler/cmlfq_tree.json" not in str(err.value)
    advice = re.search(r"resume the run with --set (\S+) \(", str(err.value))
    assert advice is not None and advice.group(1) == "scheduler.payload_class_edges=[16,256,2048]"
    before = _snapshot(layout.root)
    with pytest.raises(ResumeError, match=re.escape(f"(--set {advice.group(1)})")):
        plan_resume(layout.root)  # a resume as the config stands restores the same tree
    assert _snapshot(layout.root) == before
    apply_resume(layout.root, plan_resume(layout.root, [advice.group(1)]), [advice.group(1)])
    assert _first_rollout_loads(layout).payload_edges == (16, 256, 2048)
