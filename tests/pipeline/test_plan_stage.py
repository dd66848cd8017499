"""The plan stage over a run folder: a resumed run's planner replays the recorded iterations, and the
decision log keeps one record per decision (unfinished iterations and a torn line are dropped)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from libra_core.config import LibraConfig, load_config, write_resolved_config
from libra_core.data.history import HISTORY_SCHEMA, append_history
from libra_core.data.io import read_lake, write_lake
from libra_core.data.schema import table_from_rows
from libra_core.pipeline import plan_stage
from libra_core.pipeline.plan_stage import decisions_path, make_plan, read_decisions
from libra_core.planner.workload import workload_from_trajectory_table

GROUP = 4


def trajectory(iteration: int, prompt: int, sample: int) -> dict[str, Any]:
    """A trajectory whose length grows with the iteration (the workload drifts), with one tool call."""
    gen = 40 * iteration + 13 * sample + 7 * prompt
    mask = [1] * gen + [0] * 5 + [1] * 10
    return {
        "trajectory_id": f"t{iteration}-{prompt}-{sample}",
        "iteration": iteration,
        "prompt_id": f"p{prompt}",
        "group_id": f"g{iteration}-{prompt}",
        "sample_index": sample,
        "prompt_ids": [1] * 30,
        "response_ids": [5] * len(mask),
        "behavior_logprobs": [-0.1 if m else 0.0 for m in mask],
        "loss_mask": mask,
        "version_spans": [
            {"start": 0, "end": gen, "version": 0},
            {"start": gen + 5, "end": len(mask), "version": 0},
        ],
        "min_version": 0,
        "max_version": 0,
        "tool_events": [
            {
                "turn": 0,
                "tool": "calculator",
                "call_tokens": 3,
                "payload_tokens": 5,
                "status": "success",
                "latency_s": 0.2,
            }
        ],
        "num_turns": 2,
        "finish_reason": "answer",
        "final_answer": "1",
        "reference_answer": "1",
        "reward": 1.0,
        "instance_id": "vllm-0",
        "rollout_latency_s": 1.0,
        "generation_latency_s": 0.8,
        "tool_latency_s": 0.2,
    }


def record(
    run: Path, iteration: int, tokens_generated: int = 1, tokens_trained: int = 1, optimizer_steps: int = 1
) -> None:
    """What the iteration flow leaves behind: the trajectory lake and the history row."""
    rows = [trajectory(iteration, p, s) for p in range(4) for s in range(GROUP)]
    write_lake(table_from_rows(rows), run, iteration)
    row: dict[str, Any] = {
        f.name: None if f.nullable else 1 if pa.types.is_integer(f.type) else 1.0 for f in HISTORY_SCHEMA
    }
    row.update(
        iteration=iteration,
        rollout_s=2.0 + iteration,
        update_s=1.5,
        tokens_generated=tokens_generated,
        tokens_trained=tokens_trained,
        optimizer_steps=optimizer_steps,
    )
    append_history(run, row)


def test_a_skipped_update_does_not_teach_the_update_correction(run: tuple[LibraConfig, Path]) -> None:
    # No group had signal: the update took 1.5 s of bookkeeping and trained nothing. Compared with
    # a training price it read as updates 5x cheaper than priced (the correction's clamp).
    cfg, root = run
    make_plan(cfg, 1, str(root))
    record(root, 1, tokens_generated=4000, tokens_trained=0, optimizer_steps=0)
    make_plan(cfg, 2, str(root))  # observes iteration 1
    corrections = plan_stage._PLANNERS[str(root)].corrections
    assert corrections.observations("rollout") == 1
    assert corrections.observations("update") == 0 and corrections.factor("update") == 1.0
    record(root, 2, tokens_generated=4000, tokens_trained=4000)
    make_plan(cfg, 3, str(root))
    assert corrections.observations("update") == 1


def test_the_training_side_is_priced_on_the_trained_share(run: tuple[LibraConfig, Path]) -> None:
    # Dynamic sampling trained 1,000 of the 4,000 sampled policy tokens: the planner's window
    # prices rollout on every trajectory and training on a quarter of them (all of them until
    # 2026-12-07, so an over-sampled iteration looked up to twice as costly to train).
    cfg, root = run
    make_plan(cfg, 1, str(root))
    record(root, 1, tokens_generated=4000, tokens_trained=1000)
    make_plan(cfg, 2, str(root))  # observes iteration 1
    record(root, 2, tokens_generated=4000, tokens_trained=3000)
    make_plan(cfg, 3, str(root))
    window = plan_stage._PLANNERS[str(root)].window.pooled()
    lake_tokens = [
        float(workload_from_trajectory_table(read_lake(str(root), k), GROUP).total_tokens.sum())
        for k in (1, 2)
    ]
    expected = (0.25 * lake_tokens[0] + 0.75 * lake_tokens[1]) / sum(lake_tokens)
    assert window.train_share == pytest.approx(expected)
    assert 0.25 < window.train_share < 0.75


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[LibraConfig, Path]]:
    cfg = load_config(
        None,
        [
            f"experiment.output_dir={tmp_path}",
            "planner.type=libra",
            "planner.replan_every=2",
            "planner.hardware=8xH100",
            "planner.model_spec=qwen3-4b",
            f"training.grpo.group_size={GROUP}",
        ],
    )
    root = tmp_path / "run"
    root.mkdir()
    write_resolved_config(cfg, root)
    yield cfg, root
    new_process(root)


def new_process(root: Path) -> None:
    """Forget the in-process planner, as a resumed run's fresh process has none."""
    plan_stage._PLANNERS.pop(str(root), None)
    plan_stage._OBSERVED.pop(str(root), None)


def test_a_resumed_run_keeps_its_plan_and_logs_each_decision_once(run: tuple[LibraConfig, Path]) -> None:
    cfg, root = run
    plans = {}
    for k in range(1, 7):  # the uninterrupted run
        plans[k] = make_plan(cfg, k, str(root))
        record(root, k)
    straight = read_decisions(root)
    assert [r["action"] for r in straight][0] == "initial"
    assert [r["iteration"] for r in straight] == [1, 2, 4, 6]

    # A second run, killed while running iteration 4 (its decision logged, a fifth line torn), then
    # resumed from iteration 4 in a new process.
    other = root.with_name("resumed")
    other.mkdir()
    write_resolved_config(cfg, other)
    try:
        for k in range(1, 4):
            make_plan(cfg, k, str(other))
            record(other, k)
        make_plan(cfg, 4, str(other))
        with decisions_path(other).open("a") as f:
            f.write('{"iteration": 4, "acti')
        new_process(other)
        for k in range(4, 7):
            plan = make_plan(cfg, k, str(other))
            assert plan == plans[k], k
            record(other, k)
    finally:
        new_process(other)
    assert read_decisions(other) == straight
    assert decisions_path(other).read_text().count("\n") == len(straight)  # the torn line is gone


def test_a_garbled_decision_line_before_the_last_is_an_error(run: tuple[LibraConfig, Path]) -> None:
    cfg, root = run
    decisions_path(root).parent.mkdir(parents=True)
    good = json.dumps({"iteration": 1, "action": "initial"})
    decisions_path(root).write_text(f"{good}\nnot json\n{good}\n")
    with pytest.raises(ValueError, match=r"line 2 is not a JSON decision record"):
        make_plan(cfg, 2, str(root))
    assert decisions_path(root).read_text() == f"{good}\nnot json\n{good}\n"  # left as it was


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("bytes", r"decisions.jsonl: not a JSON-lines decision log"),
        ("folder", r"decisions.jsonl: cannot be read"),
    ],
)
def test_an_unreadable_decision_log_names_itself(
    run: tuple[LibraConfig, Path], damage: str, message: str
) -> None:
    # a UnicodeDecodeError named no file; a folder of that name was an IsADirectoryError traceback
    cfg, root = run
    decisions_path(root).parent.mkdir(parents=True)
    if damage == "bytes":
        decisions_path(root).write_bytes(b'{"iteration": 1}\n\xff\xfe\n')
    else:
        decisions_path(root).mkdir()
    with pytest.raises(ValueError, match=message):
        read_decisions(root)
