"""The C-MLFQ fast paths give the straightforward computation's results, float for float.

- `Node.stats` builds `NodeStats` with C-level loops and a per-version weight memo, and updates
  them after inserts instead of rebuilding; it must equal `NodeStats.build` over the same sample,
  also after evictions, version changes and pruning.
- The simulator's `SimPrefixTree` / `SimCMLFQScheduler` (sim/tree.py, sim/cmlfq.py) mix nodes from
  their aged sums, build statistics lazily and settle the tail test from two bounds with early exits;
  every estimate and decision must equal the library's `PrefixTree` / `CMLFQScheduler` on the same
  stream of admissions, tool returns, inserts, policy versions and pruning passes.
"""

from __future__ import annotations

import random

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, SchedRequest, ToolReturn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.estimate import Estimate, NodeStats
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_node import Node
from libra_core.sim.cmlfq import SimCMLFQScheduler
from libra_core.sim.tree import SimPrefixTree
from libra_core.traces.synthetic import SyntheticTraceConfig, synthetic_trajectories


def reference_stats(node: Node, version: int, half_life: float) -> NodeStats:
    means = (node.sum_rem / node.support, node.sum_gen / node.support) if node.support > 0 else None
    return NodeStats.build(node.rem, node.gen, node.ver, version, half_life, means=means)


def test_node_stats_equal_the_reference_build() -> None:
    rng = random.Random(0)
    for trial in range(200):
        node = Node()
        cap = rng.choice((1, 4, 64))
        for _ in range(rng.randrange(0, 150)):
            v = rng.randrange(0, 12)
            node.record(rng.randrange(0, 5000), rng.randrange(0, 3000), v, cap, 4.0)
        for version in (0, 5, 11, 30):
            assert node._build_stats(version, 4.0) == reference_stats(node, version, 4.0), trial
    empty = Node()
    assert empty.stats(3, 4.0) == NodeStats.build([], [], [], 3, 4.0)
    loaded = Node()  # a loaded node may carry samples without support: the sample's own means
    loaded.replace_samples([(5, 2, 0), (9, 4, 1), (5, 1, 1)])
    assert loaded.stats(2, 2.0) == NodeStats.build(loaded.rem, loaded.gen, loaded.ver, 2, 2.0)


def test_updated_node_stats_equal_the_reference_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Node.stats` updates cached statistics after inserts (`_update_stats`) instead of rebuilding
    them: the result must be `NodeStats.build`'s, with ties (few distinct values), evictions of old
    and of just-added samples (small caps), several inserts between reads and version changes."""
    updates = 0
    update = Node._update_stats

    def counting(node: Node, old: NodeStats, version: int, half_life: float) -> NodeStats:
        nonlocal updates
        updates += 1
        return update(node, old, version, half_life)

    monkeypatch.setattr(Node, "_update_stats", counting)
    rng = random.Random(3)
    for trial in range(300):
        node = Node()
        cap = rng.choice((1, 2, 5, 64))
        spread = rng.choice((3, 40, 5000))  # few distinct values: many ties
        version = 0
        for _ in range(rng.randrange(1, 120)):
            if rng.random() < 0.05:
                version += rng.randrange(1, 3)
            u = max(0, version - rng.randrange(0, 3))  # now and then a stale sample
            node.record(rng.randrange(0, spread), rng.randrange(0, spread), u, cap, 2.0)
            if rng.random() < 0.3:
                assert node.stats(version, 2.0) == reference_stats(node, version, 2.0), trial
        assert node.stats(version, 2.0) == reference_stats(node, version, 2.0), trial
    assert updates > 1000


def same_estimate(a: Estimate | None, b: Estimate | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.support, a.mean_remaining, a.mean_remaining_gen, a.parts) == (
        b.support,
        b.mean_remaining,
        b.mean_remaining_gen,
        b.parts,
    )


def test_sim_scheduler_and_tree_match_the_library_decision_for_decision() -> None:
    trace_cfg = SyntheticTraceConfig(
        num_iterations=14, prompts_per_iteration=8, group_size=4, prompt_pool=12, max_turns=30
    )
    trajectories = synthetic_trajectories(random.Random(5), trace_cfg)
    # Aggressive pruning, short half-life and tight buckets: pruning, aging and moves all happen.
    cfg = SchedulerConfig(
        buckets=(900, 2500, 6000),
        min_support=1.0,
        aging_half_life_versions=1.5,
        prune_below_support=0.4,
        prune_nodes_per_insert=16,
        prefill_decode_cost_ratio=0.0,
    )
    ref = CMLFQScheduler(cfg, tree=PrefixTree.from_config(cfg))
    fast = SimCMLFQScheduler(cfg, tree=SimPrefixTree.from_config(cfg))
    rng = random.Random(1)
    by_iteration: dict[int, list] = {}
    for t in trajectories:
        by_iteration.setdefault(t.iteration, []).append(t)
    moves = 0
    for iteration, batch in sorted(by_iteration.items()):
        for sched in (ref, fast):
            sched.on_policy_version(iteration)
        live = []
        for t in batch:
            req = SchedRequest(t.trajectory_id, t.prompt_id, t.prompt_tokens, iteration)
            assert ref.admit(req) == fast.admit(req)
            live.append([t, req, 0, t.prompt_tokens])
        while live:  # tool returns of random requests, finishes inserted as they come
            item = live.pop(rng.randrange(len(live)))
            t, req, turn_index, ctx = item
            turn = t.turns[turn_index]
            ctx += turn.gen_tokens
            if turn.tool is None or turn_index == len(t.turns) - 1:
                done = FinishedTrajectory(
                    t.trajectory_id, t.prompt_id, t.prompt_tokens, iteration, iteration, t.turns
                )
                ref.on_finish(done)
                fast.on_finish(done)
                continue
            ctx += turn.payload_tokens
            assert turn.status is not None
            ret = ToolReturn(turn_index, turn.gen_tokens, turn.tool, turn.payload_tokens, turn.status, ctx)
            a, b = ref.on_tool_return(req, ret), fast.on_tool_return(req, ret)
            assert a == b
            moves += a is not None
            codes = tuple(fast._progress[req.request_id].codes)
            consumed = tuple(fast._progress[req.request_id].consumed)
            assert same_estimate(
                ref.tree.estimate(t.prompt_id, codes, consumed, prompt_tokens=t.prompt_tokens),
                fast.tree.estimate(t.prompt_id, codes, consumed, prompt_tokens=t.prompt_tokens),
            )
            live.append([t, req, turn_index + 1, ctx])
    assert ref.counters == fast.counters
    assert ref.tree.pruned_subtrees == fast.tree.pruned_subtrees > 0
    assert moves > 0 and ref.counters.disagree > 0 and ref.counters.decisions > ref.counters.low_support
