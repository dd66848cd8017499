"""A resume drops the planner's decisions of the iterations it redoes, as it drops their history
rows: only the libra planner's first plan stage trimmed the log, so a run resumed with
`planner.type: static` (or not run again) reported the abandoned attempt's decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config import load_config, write_resolved_config
from libra_core.observability.report import planner_rows
from libra_core.pipeline.plan_stage import decisions_path, make_plan, read_decisions
from libra_core.pipeline.resume import ResumeError, apply_resume, plan_resume
from libra_core.pipeline.run_dir import RunLayout, RunState, new_run_dir, save_checkpoint, write_state


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(tmp_path: Path, completed: int, ckpt_at: int | None) -> RunLayout:
    """`completed` iterations, the last failed, a checkpoint at `ckpt_at` (taken before any
    optimizer step: no trainer state to check), and a decision per iteration."""
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}", "planner.type=libra"])
    root = new_run_dir(cfg)
    write_resolved_config(cfg, root)
    layout = RunLayout(root)
    layout.policy.mkdir()
    (layout.policy / "config.json").write_text("{}")
    for it in range(1, completed + 1):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        write_state(root, RunState(it, it, "running"))
        if it == ckpt_at:
            save_checkpoint(root, it, RunState(it, it, "running"), keep=2)
    write_state(root, RunState(completed, completed, "failed"))
    path = decisions_path(root)
    path.parent.mkdir()
    records = [{"iteration": it, "action": "keep", "t_iter_s": 10.0 + it} for it in range(1, completed + 1)]
    # ... and the torn line of the abandoned attempt's iteration `completed + 1`, killed while logging
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"iteration": ' + str(completed + 1))
    return layout


def test_a_resume_drops_the_redone_iterations_decisions(tmp_path: Path) -> None:
    layout = _run(tmp_path, completed=4, ckpt_at=3)
    before = _snapshot(layout.root)
    with pytest.raises(ResumeError, match="experiment.iterations=2 is below the 4 iterations"):
        plan_resume(layout.root, ["experiment.iterations=2"])
    assert _snapshot(layout.root) == before  # a refused resume keeps the log as it was

    overrides = ["planner.type=static"]  # whose plan stage never reads or trims the log
    plan = plan_resume(layout.root, overrides)
    apply_resume(layout.root, plan, overrides)
    kept = [{"iteration": it, "action": "keep", "t_iter_s": 10.0 + it} for it in (1, 2, 3)]
    assert read_decisions(layout.root) == kept
    assert decisions_path(layout.root).read_text() == "".join(json.dumps(r) + "\n" for r in kept)
    assert sorted(p.name for p in decisions_path(layout.root).parent.iterdir()) == ["decisions.jsonl"]
    # the redone iteration 4 plans statically, and the report shows the run's decisions only
    assert make_plan(load_config(layout.config), 4, str(layout.root)).decision is None
    assert planner_rows(layout.root) == kept


def test_a_resume_without_a_checkpoint_drops_every_decision(tmp_path: Path) -> None:
    layout = _run(tmp_path, completed=2, ckpt_at=None)
    plan = plan_resume(layout.root)
    assert plan.checkpoint is None
    apply_resume(layout.root, plan)
    assert read_decisions(layout.root) == []
    assert decisions_path(layout.root).read_text() == ""
