"""What `libra run --resume` does to a run folder: refused resumes change nothing, a resume without a
checkpoint starts over clean, and one process at a time holds a folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from libra_core.config import load_config
from libra_core.pipeline.resume import apply_resume, plan_resume
from libra_core.pipeline.run_dir import RunLayout, RunState, read_state, save_checkpoint, write_state
from libra_core.pipeline.run_lock import lock_run, run_holder, unlock_run
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, save_tree
from tests.pipeline.test_run_dir import make_run, write_optimizer_state


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_with_checkpoint(tmp_path: Path, completed: int = 4, ckpt_at: int | None = 3) -> RunLayout:
    layout = make_run(tmp_path)
    for it in range(1, completed + 1):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        write_optimizer_state(layout.trainer / "optimizer.pt", f"adam-{it}")
        write_state(layout.root, RunState(it, it, "running"))
        if it == ckpt_at:
            save_checkpoint(layout.root, it, RunState(it, it, "running"), keep=2)
    write_state(layout.root, RunState(completed, completed, "failed"))
    return layout


def test_the_plan_says_where_the_run_continues(tmp_path: Path) -> None:
    layout = make_run(tmp_path)
    layout.scheduler_tree.parent.mkdir(parents=True)
    for it in range(1, 5):
        (layout.policy / "model.safetensors").write_text(f"weights-{it}")
        tree = PrefixTree()
        tree.version = it
        save_tree(tree, layout.scheduler_tree)
        write_state(layout.root, RunState(it, it, "running"))
        if it == 3:
            save_checkpoint(layout.root, it, RunState(it, it, "running"), keep=2)
    write_state(layout.root, RunState(4, 4, "failed"))
    # the policy's own config agrees with the run's (keys it does not hold are not compared)
    agreeing = '{"hidden_size": 128, "num_hidden_layers": 4, "dtype": "float32"}'
    (layout.policy / "config.json").write_text(agreeing)
    plan = plan_resume(layout.root, ["experiment.iterations=6"])
    assert plan.state == RunState(3, 3, "running") and plan.completed == 4
    assert plan.note.endswith("at iteration 4 of 6 from iter_00003; iterations 4-4 are redone")
    apply_resume(layout.root, plan, ["experiment.iterations=6"])
    assert (layout.policy / "model.safetensors").read_text() == "weights-3"
    assert load_tree(layout.scheduler_tree).version == 3  # the router's statistics of iteration 3
    assert load_config(layout.config).experiment.iterations == 6


@pytest.mark.parametrize(
    ("damage", "overrides", "message"),
    [
        ("weights", [], r"iter_00003 is incomplete \(no policy/model.safetensors\); nothing was changed"),
        ("ckpt_state", [], r"iter_00003 is incomplete \(no state.json\)"),
        ("state", [], r"run state .*state.json is damaged"),
        (None, ["model.num_layers=8"], r"model.num_layers cannot change on resume"),
        # a tiny policy's tokenizer only knows its environment's characters and markers
        (
            None,
            ["environment={type: math_tools, prompt_format: chatml}"],
            r"environment.type, environment.prompt_format cannot change on resume",
        ),
        (
            None,
            ["experiment.iterations=2"],
            r"experiment.iterations=2 is below the 4 iterations the run completed",
        ),
        (
            "tree",
            ["scheduler.payload_class_edges=[8,64]"],
            r"scheduler.payload_class_edges cannot change on resume \(the run's C-MLFQ tree is keyed by",
        ),
        # Each used to pass the check, then fail after the policy and optimizer were overwritten.
        ("history_truncated", [], r"history.parquet: not a Parquet file .*Restore it, or delete it"),
        ("history_page", [], r"history.parquet: cannot be read .*Restore it, or delete it"),
        (None, ["training.grpo.kl_coef=0.1"], r"kl_coef=0.1 needs the run's frozen warm-up policy"),
        # config.resolved.yaml edited by hand: the policy folder's own config.json disagrees with it
        (
            "edited_config",
            [],
            r"the config says model.hidden_size=128 but .*policy/config.json has hidden_size=64, "
            r"model.num_layers=4 but .* has num_hidden_layers=2; the model cannot change on resume",
        ),
        ("policy_config", [], r"policy/config.json cannot be read"),
        # value types (a string count failed later with a traceback naming no file; -4 was taken)
        ("state_string", [], r"state.json is damaged: completed_iterations is '4', not a count >= 0"),
        ("state_negative", [], r"state.json is damaged: policy_version is -4, not a count >= 0"),
        ("state_status", [], r"state.json is damaged: status 'paused' is not one of"),
        ("ckpt_state_type", [], r"iter_00003 is incomplete \(run state .* completed_iterations is 3.0"),
        # read as a fresh run, the resume restarted at 1 and the next save's rotation deleted it
        ("no_state", [], r"state.json is missing but the folder holds checkpoints \(iter_00003\)"),
        # a newer Libra's history: the rewrite refused it half-way, the policy already restored
        ("history_extra_column", [], r"new_metric.*nothing was changed"),
        # the planner's log: refused by the first plan stage, after the folder had been changed
        (
            "decisions_middle",
            [],
            r"decisions.jsonl: line 2 is not a JSON decision record.*nothing was changed",
        ),
        ("decisions_no_iteration", [], r"decisions.jsonl: line 2 has no integer 'iteration' \(got None\)"),
        ("decisions_str_iteration", [], r"decisions.jsonl: line 1 has no integer 'iteration' \(got '1'\)"),
    ],
)
def test_a_refused_resume_changes_nothing(
    tmp_path: Path, damage: str | None, overrides: list, message: str
) -> None:
    layout = _run_with_checkpoint(tmp_path)
    ckpt = layout.checkpoint(3)
    if damage == "weights":
        (ckpt / "policy" / "model.safetensors").unlink()
    elif damage == "ckpt_state":
        (ckpt / "state.json").unlink()
    elif damage == "state":
        layout.state.write_text("{\n,")
    elif damage == "edited_config":  # what the prepare step wrote for a smaller model
        (layout.policy / "config.json").write_text(
            '{"hidden_size": 64, "num_hidden_layers": 2, "head_dim": 32, "dtype": "float32"}'
        )
    elif damage == "policy_config":
        (layout.policy / "config.json").write_text('{"hidden_size": ')
    elif damage == "state_string":
        layout.state.write_text('{"completed_iterations": "4", "policy_version": 4, "status": "failed"}')
    elif damage == "state_negative":
        layout.state.write_text('{"completed_iterations": 4, "policy_version": -4, "status": "failed"}')
    elif damage == "state_status":
        layout.state.write_text('{"completed_iterations": 4, "policy_version": 4, "status": "paused"}')
    elif damage == "ckpt_state_type":
        (ckpt / "state.json").write_text('{"completed_iterations": 3.0, "policy_version": 3}')
    elif damage == "no_state":
        layout.state.unlink()
    elif damage == "history_extra_column":
        import pyarrow as pa
        import pyarrow.parquet as pq

        _write_history(layout.root, 4)
        table = pq.read_table(layout.root / "history.parquet")
        table = table.append_column("new_metric", pa.array([1.0] * table.num_rows))
        pq.write_table(table, layout.root / "history.parquet")
    elif damage is not None and damage.startswith("decisions"):
        lines = {
            "decisions_middle": '{"iteration": 1, "action": "initial"}\n{"iteration": 2,\n{"iteration": 3}\n',
            "decisions_no_iteration": '{"iteration": 1, "action": "initial"}\n{"action": "keep"}\n',
            "decisions_str_iteration": '{"iteration": "1", "action": "initial"}\n',
        }[damage]
        (layout.root / "planner").mkdir(exist_ok=True)
        (layout.root / "planner" / "decisions.jsonl").write_text(lines)
    elif damage == "tree":  # the checkpoint's tree, which the resume restores, has the default edges
        (ckpt / "scheduler").mkdir()
        save_tree(PrefixTree(), ckpt / "scheduler" / "cmlfq_tree.json")
    elif damage is not None and damage.startswith("history"):
        _write_history(layout.root, 4)
        data = bytearray((layout.root / "history.parquet").read_bytes())
        if damage == "history_truncated":
            del data[-40:]
        else:  # the footer still reads; the first data page does not
            data[4:40] = b"\xff" * 36
        (layout.root / "history.parquet").write_bytes(bytes(data))
    before = _snapshot(layout.root)
    with pytest.raises(ValueError, match=message):
        plan_resume(layout.root, overrides)
    assert _snapshot(layout.root) == before


def test_no_checkpoint_starts_over_without_the_old_optimizer_state(tmp_path: Path) -> None:
    # Interrupted at iteration 3 with checkpoint_every 5: the two completed iterations are redone
    # from the warm-up, and the optimizer state they left must not carry into the redo.
    layout = _run_with_checkpoint(tmp_path, completed=2, ckpt_at=None)
    layout.scheduler_tree.parent.mkdir(parents=True)
    layout.scheduler_tree.write_text("{}")
    plan = plan_resume(layout.root)
    assert (
        plan.checkpoint is None
        and "no checkpoint yet" in plan.note
        and "2 completed iterations are redone" in plan.note
    )
    assert apply_resume(layout.root, plan) == RunState(0, 0, "running")
    assert not layout.trainer.exists() and not layout.scheduler_tree.exists()
    assert read_state(layout.root) == RunState(0, 0, "running")


def test_an_iteration_1_interrupted_after_its_update_starts_over_without_its_optimizer_state(
    tmp_path: Path,
) -> None:
    # No iteration completed, but iteration 1's update had stepped the optimizer and its rollout
    # had saved the router's tree: both were kept (only "completed > 0" cleared them).
    layout = _run_with_checkpoint(tmp_path, completed=0, ckpt_at=None)
    (layout.trainer / "optimizer.pt").write_text("adam-1-partial")
    layout.scheduler_tree.parent.mkdir(parents=True)
    layout.scheduler_tree.write_text("{}")
    write_state(layout.root, RunState(0, 0, "failed"))
    plan = plan_resume(layout.root)
    assert plan.checkpoint is None and plan.completed == 0
    assert apply_resume(layout.root, plan) == RunState(0, 0, "running")
    assert not layout.trainer.exists() and not layout.scheduler_tree.exists()


def test_a_checkpoint_from_before_the_first_step_drops_the_later_optimizer_state(tmp_path: Path) -> None:
    # Iteration 1's update had no group with signal, so its checkpoint has no trainer/; iterations
    # 2-3 then stepped the optimizer. Resuming at 1 must not pair weights-1 with their Adam moments.
    layout = make_run(tmp_path)
    layout.trainer.rmdir()
    (layout.policy / "model.safetensors").write_text("weights-1")
    save_checkpoint(layout.root, 1, RunState(1, 1, "running"), keep=2)
    assert not (layout.checkpoint(1) / "trainer").exists()
    layout.trainer.mkdir()
    (layout.policy / "model.safetensors").write_text("weights-3")
    (layout.trainer / "optimizer.pt").write_text("adam-3")
    write_state(layout.root, RunState(3, 3, "failed"))
    plan = plan_resume(layout.root)
    assert plan.checkpoint == layout.checkpoint(1)
    assert apply_resume(layout.root, plan) == RunState(1, 1, "running")
    assert (layout.policy / "model.safetensors").read_text() == "weights-1"
    assert not layout.trainer.exists()


def test_one_process_holds_a_run_folder(tmp_path: Path) -> None:
    layout = make_run(tmp_path)
    code = "import sys; from libra_core.pipeline.run_lock import lock_run, run_holder; "
    code += "print(run_holder(sys.argv[1])); lock_run(sys.argv[1])"
    other = [sys.executable, "-c", code, str(layout.root)]
    root = Path(__file__).resolve().parents[2]
    lock_run(layout.root)
    try:
        out = subprocess.run(other, capture_output=True, text=True, cwd=root, timeout=60)
        assert out.returncode != 0 and out.stdout.strip() != "None"  # it sees this process, then fails
        assert "RunLockedError" in out.stderr and "is in use by process" in out.stderr
        assert run_holder(layout.root) is None  # this process holds it: not "another"
    finally:
        unlock_run(layout.root)
    out = subprocess.run(other, capture_output=True, text=True, cwd=root, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "None"  # free again (and its lock died with it)
    lock_run(layout.root)  # the exited process's lock died with it
    unlock_run(layout.root)


def test_a_resume_forgets_what_the_abandoned_attempt_recorded(tmp_path: Path) -> None:
    """History rows, lake partitions and timeline spans of iterations after the checkpoint belong
    to the attempt that failed: dynamic sampling, the report and trace exports must not read them."""
    import random

    from libra_core.data.history import append_history, read_history
    from libra_core.data.io import lake_path, write_lake
    from libra_core.data.schema import empty_table
    from libra_core.observability.timeline import Span, read_timeline, write_perfetto, write_timeline
    from libra_core.pipeline.rollout_stage import prompts_to_sample
    from tests.observability.test_report import history_row

    layout = _run_with_checkpoint(tmp_path)  # 4 iterations completed, checkpoint at 3
    rng = random.Random(0)
    for it in range(1, 5):
        append_history(layout.root, {**history_row(it, rng), "mixed_group_share": 0.25 * it})
        write_lake(empty_table(), layout.root, it)
        write_timeline(layout.root, it, [Span(it, "rollout", float(it), it + 0.5)])
    write_perfetto(layout.root)
    cfg = load_config(layout.config, ["pipeline.dynamic_sampling.enabled=true"])
    # 16 prompts over the share of groups with signal in the latest earlier row, at most twice:
    # iteration 4 follows row 3 (0.75: 22 prompts), not the abandoned row 4 (1.0: 16)
    sizes = [prompts_to_sample(cfg, str(layout.root), it) for it in (1, 2, 4, 5)]
    assert sizes == [32, 32, 22, 16]
    # async: rollout N+1 starts before row N is recorded, so it follows row N-1 whether or not the
    # run was resumed in between (a resumed run read row N and sampled 22 where the run took 32)
    async_cfg = load_config(layout.config, ["pipeline.dynamic_sampling.enabled=true", "pipeline.mode=async"])
    sizes = [prompts_to_sample(async_cfg, str(layout.root), it) for it in (1, 2, 3, 4, 5)]
    assert sizes == [32, 32, 32, 32, 22]
    apply_resume(layout.root, plan_resume(layout.root))
    assert [r["iteration"] for r in read_history(layout.root)] == [1, 2, 3]
    assert [lake_path(layout.root, it).exists() for it in range(1, 5)] == [True, True, True, False]
    assert sorted({s.iteration for s in read_timeline(layout.root)}) == [1, 2, 3]
    trace = (layout.root / "timeline" / "trace.json").read_text()
    assert '"iteration 4"' not in trace and '"iteration 3"' in trace


def test_a_damaged_span_file_does_not_stop_a_resume_half_way(tmp_path: Path) -> None:
    # trace.json's rewrite raised on it after the history was cut back, before state.json and the
    # abandoned iterations' stage files were
    from libra_core.observability.timeline import Span, read_timeline, write_timeline

    layout = _run_with_checkpoint(tmp_path)  # 4 iterations completed, checkpoint at 3
    for it in range(1, 5):
        write_timeline(layout.root, it, [Span(it, "rollout", float(it), it + 0.5)])
    (layout.root / "timeline" / "iteration=2.json").write_text("[{")
    (layout.root / "stages" / "iteration=4").mkdir(parents=True)
    assert apply_resume(layout.root, plan_resume(layout.root)) == RunState(3, 3, "running")
    assert read_state(layout.root) == RunState(3, 3, "running")
    assert not (layout.root / "stages" / "iteration=4").exists()
    assert sorted({s.iteration for s in read_timeline(layout.root, damaged=[])}) == [1, 3]


def _write_history(root: Path, iterations: int) -> None:
    import random

    from libra_core.data.history import append_history
    from tests.observability.test_report import history_row

    rng = random.Random(0)
    for it in range(1, iterations + 1):
        append_history(root, history_row(it, rng))


def test_a_resume_removes_what_a_killed_write_left(tmp_path: Path) -> None:
    layout = _run_with_checkpoint(tmp_path)  # 4 iterations completed, checkpoint at 3
    leftovers = [
        layout.root / ".history.parquet.tmp-16022",
        layout.root / "lake" / ".iteration=4.parquet.tmp-16022",
        layout.checkpoints / ".iter_00004.staging" / "policy" / "model.safetensors",
        # replace_dir killed between its two renames: the replaced policy, renamed aside (a disk leak)
        layout.root / ".policy.old-1a2b3c4d" / "model.safetensors",
        # copy_tree_atomic killed between its renames: the trainer state it replaced, and a copy
        layout.root / ".trainer.old" / "optimizer.pt",
        layout.root / ".policy.tmp" / "model.safetensors",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half written")
    apply_resume(layout.root, plan_resume(layout.root))
    assert [p.exists() for p in leftovers] == [False] * 6
    assert not (layout.root / ".policy.old-1a2b3c4d").exists()
    assert not (layout.checkpoints / ".iter_00004.staging").exists()
    assert (layout.checkpoint(3) / "state.json").is_file()  # the checkpoint itself is kept


def test_a_resume_drops_the_abandoned_iterations_stage_files(tmp_path: Path) -> None:
    """An async rollout leaves a C-MLFQ tree snapshot in its stage folder, and a checkpoint prefers
    it to the live tree. Resumed in sync mode (which writes none), the redone iteration's checkpoint
    copied the abandoned attempt's snapshot, not the tree its own rollout left (until 2026-12-06)."""
    layout = _run_with_checkpoint(tmp_path)  # 4 iterations completed, checkpoint at 3
    for it in (3, 4, 5):  # 5: the rollout an async run had started before it stopped
        layout.scheduler_tree_at(it).parent.mkdir(parents=True, exist_ok=True)
        layout.scheduler_tree_at(it).write_text(f'{{"who": "abandoned rollout {it}"}}')
    apply_resume(layout.root, plan_resume(layout.root, ["pipeline.mode=sync"]), ["pipeline.mode=sync"])
    assert [layout.stage_dir(it).exists() for it in (3, 4, 5)] == [True, False, False]
    layout.scheduler_tree.parent.mkdir(parents=True, exist_ok=True)
    layout.scheduler_tree.write_text('{"who": "resumed rollout 4"}')  # a sync rollout's tree
    ckpt = save_checkpoint(layout.root, 4, RunState(4, 4, "running"), keep=2)
    assert (ckpt / "scheduler" / "cmlfq_tree.json").read_text() == '{"who": "resumed rollout 4"}'


def test_a_checkpoint_past_the_runs_state_is_neither_resumed_from_nor_kept(tmp_path: Path) -> None:
    """An abandoned attempt's checkpoint beyond what state.json says (a state lost or rewritten):
    the resume continued from its weights, and rotation kept it as the newest."""
    layout = _run_with_checkpoint(tmp_path, completed=4, ckpt_at=3)
    (layout.policy / "model.safetensors").write_text("weights-abandoned-6")
    save_checkpoint(layout.root, 6, RunState(6, 6, "running"), keep=3)
    plan = plan_resume(layout.root)
    assert plan.checkpoint == layout.checkpoint(3) and plan.state == RunState(3, 3, "running")
    apply_resume(layout.root, plan)
    assert (layout.policy / "model.safetensors").read_text() == "weights-3"
    assert not layout.checkpoint(6).exists() and layout.checkpoint(3).is_dir()


def test_a_checkpoint_without_a_tree_drops_the_live_one(tmp_path: Path) -> None:
    """Taken under a static scheduler, then resumed with C-MLFQ: the live tree had learnt the
    iterations the resume redoes, and was kept."""
    layout = _run_with_checkpoint(tmp_path, completed=4, ckpt_at=3)
    layout.scheduler_tree.parent.mkdir(parents=True)
    layout.scheduler_tree.write_text("tree after abandoned iteration 4")
    apply_resume(layout.root, plan_resume(layout.root))
    assert not layout.scheduler_tree.exists()


def test_a_resume_of_a_folder_that_is_no_run_names_it_and_leaves_no_lock(tmp_path: Path) -> None:
    from libra_core.pipeline.run_start import start_run

    plain = tmp_path / "plain"
    plain.mkdir()
    for folder in (plain, tmp_path / "missing"):
        with pytest.raises(FileNotFoundError, match=f"{folder} is not a run folder: config.resolved.yaml"):
            start_run("stages.yaml", [], str(folder))
    assert list(plain.iterdir()) == []
