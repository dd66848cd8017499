"""The live pipeline loads the C-MLFQ tree before each rollout and saves it after
(`CMLFQScheduler.from_saved`, pipeline/rollout_stage.py): pruning must keep that tree as bounded
as one kept in memory."""

from __future__ import annotations

import random
from pathlib import Path

from libra_core.config.scheduler import SchedulerConfig
from libra_core.scheduling.base import Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.tree_io import load_tree, save_tree

PROMPTS, GROUP, ITERATIONS = 8, 4, 60


def _iteration(sched: CMLFQScheduler, rng: random.Random, version: int) -> None:
    sched.tree.set_version(version)
    for p in range(PROMPTS):
        for _ in range(GROUP):
            turns = [Turn(rng.randint(5, 50), "calc", rng.randint(1, 400), "success") for _ in range(3)]
            sched.tree.insert(f"i{version}-p{p}", (*turns, Turn(9, None, 0, None)), version, prompt_tokens=40)


def test_a_tree_loaded_and_saved_each_iteration_is_pruned_as_one_kept_in_memory(tmp_path: Path) -> None:
    # The pruning pass's place is not saved: a loaded tree started a new pass, which checks the
    # newest prompts first and, within one iteration's inserts, never reached the oldest (the stale
    # ones), so the reloaded tree kept every prompt it had seen (all 480 here).
    cfg = SchedulerConfig.model_validate({"type": "cmlfq", "buckets": [256, 2048]})
    kept, rng_kept, rng_file = CMLFQScheduler(cfg), random.Random(0), random.Random(0)
    path = tmp_path / "tree.json"
    for version in range(ITERATIONS):
        _iteration(kept, rng_kept, version)
        reloaded = CMLFQScheduler.from_saved(cfg, load_tree(path)) if path.exists() else CMLFQScheduler(cfg)
        _iteration(reloaded, rng_file, version)
        save_tree(reloaded.tree, path)
    in_memory, from_file = len(kept.tree.prompts), len(load_tree(path).prompts)
    # a prompt's 4 trajectories age below support 0.05 after 4 x log2(4 / 0.05) ~ 25 versions
    assert in_memory < PROMPTS * ITERATIONS * 0.6, in_memory
    assert from_file <= in_memory + 2 * PROMPTS, (from_file, in_memory)
