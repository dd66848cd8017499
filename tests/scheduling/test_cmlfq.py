"""C-MLFQ decisions: admission from the tree, minimum support, the agreement and cost checks, aging."""

from __future__ import annotations

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.sim.cmlfq import SimCMLFQScheduler
from libra_core.sim.tree import SimPrefixTree


def finish(s: CMLFQScheduler, rid: str, prompt: str, turns: tuple[Turn, ...], version: int) -> None:
    s.on_finish(FinishedTrajectory(rid, prompt, 10, version, version, turns))


def short() -> tuple[Turn, ...]:
    return (Turn(20, None, 0, None),)  # size 10 + 20 = 30: bucket 0 with buckets=(100,)


def long() -> tuple[Turn, ...]:
    return (Turn(200, None, 0, None),)  # size 210: bucket 1


def first_long_admission(half_life: float) -> int:
    """Versions 0-9 are short, 10+ long (8 trajectories each). Returns how many versions of long
    data it takes before admission picks the long bucket."""
    cfg = SchedulerConfig(
        type="cmlfq",
        buckets=(100,),
        min_support=1,
        aging_half_life_versions=half_life,
        max_samples_per_node=64,
    )
    s = CMLFQScheduler(cfg)
    for version in range(30):
        s.on_policy_version(version)
        bucket = s.admit(SchedRequest(f"probe{version}", "p", 10, version))
        if version > 10 and bucket == 1:
            return version - 10
        turns = long() if version >= 10 else short()
        finish(s, f"probe{version}", "p", turns, version)
        for k in range(7):
            s.admit(SchedRequest(f"v{version}-{k}", "p", 10, version))
            finish(s, f"v{version}-{k}", "p", turns, version)
    raise AssertionError("never switched")


def test_aging_follows_drift_within_one_version() -> None:
    # Admission picks bucket 1 when 10 + mean remaining > 100, i.e. the aged weight share of the
    # long trajectories (remaining 200, short ones 20) exceeds (90 - 20) / 180 = 0.389. The mean is
    # exact over every trajectory inserted (aged sums), not over the bounded sample.
    # Half-life 1: queried at version 11, the 8 long ones of version 10 weigh 8 * 1/2 = 4 and the 80
    # short ones of versions 0..9 weigh 8 * (1/4 + ... + 1/2048) = 4.0: share 0.50 after one version.
    assert first_long_admission(half_life=1.0) == 1
    # Without aging the long share is 8j / (80 + 8j) after j versions: > 0.389 first at j = 7.
    assert first_long_admission(half_life=1e9) == 7


def test_admission_uses_the_prompts_history_then_the_global_root() -> None:
    cfg = SchedulerConfig(type="cmlfq", buckets=(100,), min_support=2, backoff_pseudocount=1)
    s = CMLFQScheduler(cfg)
    s.on_policy_version(0)
    assert s.admit(SchedRequest("a0", "long-prompt", 10, 0)) == 0  # empty tree: shortest bucket
    for k in range(4):
        s.admit(SchedRequest(f"l{k}", "long-prompt", 10, 0))
        finish(s, f"l{k}", "long-prompt", long(), 0)
    finish(s, "a0", "long-prompt", long(), 0)
    s.on_policy_version(1)
    assert s.admit(SchedRequest("b", "long-prompt", 10, 1)) == 1  # the prompt's own history
    assert s.admit(SchedRequest("c", "new-prompt", 10, 1)) == 1  # no history: the global root
    for k in range(20):
        s.admit(SchedRequest(f"s{k}", f"short-{k}", 10, 1))
        finish(s, f"s{k}", f"short-{k}", short(), 1)
    s.on_policy_version(2)
    # The global root is now mostly short, but the prompt's 5 samples outweigh it: 5/6 of the mass.
    assert s.admit(SchedRequest("d", "long-prompt", 10, 2)) == 1
    assert s.admit(SchedRequest("e", "new-prompt-2", 10, 2)) == 0


def trained(cost_ratio: float, min_support: float = 2) -> CMLFQScheduler:
    """Trajectories whose first tool call fails run long; successes end soon."""
    cfg = SchedulerConfig(
        type="cmlfq",
        buckets=(100,),
        min_support=min_support,
        prefill_decode_cost_ratio=cost_ratio,
        misplaced_decode_slowdown=0.5,
    )
    s = CMLFQScheduler(cfg)
    s.on_policy_version(0)
    for k in range(40):
        ok = k % 2 == 0
        turns = (
            Turn(10, "python", 5, "success" if ok else "failure"),
            Turn(10 if ok else 300, None, 0, None),
        )
        s.admit(SchedRequest(f"t{k}", f"p{k}", 10, 0))
        finish(s, f"t{k}", f"p{k}", turns, 0)
    s.on_policy_version(1)
    return s


def test_failure_moves_the_request_when_saving_beats_reprefill() -> None:
    s = trained(cost_ratio=0.1)
    req = SchedRequest("r", "fresh", 10, 1)
    # Global root: remaining 25 or 315 -> mean 170, context 10 -> 180 > 100: admitted long.
    assert s.admit(req) == 1
    ok = SchedRequest("q", "fresh2", 10, 1)
    s.admit(ok)
    # After a success the exact path (20 samples, all 10 remaining; aged one version at half-life 4:
    # n = 16.8) takes most of the mass: size-class node 16.8 / (16.8 + 8) = 0.68, global node 0.22,
    # Markov node 0.07; the shifted roots (remaining 10 or 300, minus 15 consumed) the last 0.03.
    # Mean 14.9: 25 + 14.9 <= 100, and P(remaining <= 75) = 0.98 >= 0.9: mean and P90 agree on
    # bucket 0. Expected generated tokens decoded in their right bucket: 9.97 in bucket 0 vs 4.73 in
    # bucket 1, gain 5.24 x 0.5 = 2.6 > re-prefill (25 - 5 payload) x 0.1 = 2.0: move.
    assert s.on_tool_return(ok, ToolReturn(0, 10, "python", 5, "success", 25)) == Move(0)
    # After a failure the path agrees with the bucket it is in: stay.
    assert s.on_tool_return(req, ToolReturn(0, 10, "python", 5, "failure", 25)) is None


def test_reprefill_cost_blocks_a_move() -> None:
    s = trained(cost_ratio=0.5)  # 25 * 0.5 = 12.5 > saving 2.6: keep the prefix cache
    q = SchedRequest("q", "fresh", 10, 1)
    assert s.admit(q) == 1
    assert s.on_tool_return(q, ToolReturn(0, 10, "python", 5, "success", 25)) is None
    assert s.counters.too_costly == 1 and s.counters.moves == 0


def test_the_returned_payload_is_not_charged_as_reprefill() -> None:
    """A move re-prefills the context before the payload; the payload is prefilled wherever the next
    turn runs. At ratio 0.12 the saving 2.6 beats (25 - 5) x 0.12 = 2.4, not 25 x 0.12 = 3.0."""
    s = trained(cost_ratio=0.12)
    q = SchedRequest("q", "fresh", 10, 1)
    assert s.admit(q) == 1
    assert s.on_tool_return(q, ToolReturn(0, 10, "python", 5, "success", 25)) == Move(0)
    # a 1-token payload at context 30 leaves 29 tokens to re-prefill, 29 x 0.12 = 3.5: too costly
    r = SchedRequest("r", "fresh", 10, 1)
    s.admit(r)
    assert s.on_tool_return(r, ToolReturn(0, 10, "python", 1, "success", 30)) is None
    assert s.counters.too_costly == 1


def test_low_support_never_moves() -> None:
    s = trained(cost_ratio=0.0, min_support=100)
    q = SchedRequest("q", "fresh", 10, 1)
    assert s.admit(q) == 0  # root support 40 (global) < 100: shortest bucket, as in the paper
    assert s.on_tool_return(q, ToolReturn(0, 10, "python", 5, "failure", 25)) is None
    assert s.counters.low_support == 1


def test_unseen_prompt_backs_off_to_its_size_class() -> None:
    """Small prompts (10 tokens) run long, large ones (200 tokens) end soon; every prompt is new."""

    def run(bins_per_octave: float) -> tuple[int, int]:
        cfg = SchedulerConfig(
            type="cmlfq", buckets=(400,), min_support=2, prompt_size_bins_per_octave=bins_per_octave
        )
        s = CMLFQScheduler(cfg)
        s.on_policy_version(0)
        for k in range(20):
            small = k % 2 == 0
            prompt_tokens, gen = (10, 600) if small else (200, 20)
            s.admit(SchedRequest(f"t{k}", f"p{k}", prompt_tokens, 0))
            s.on_finish(
                FinishedTrajectory(f"t{k}", f"p{k}", prompt_tokens, 0, 0, (Turn(gen, None, 0, None),))
            )
        s.on_policy_version(1)
        small = s.admit(SchedRequest("a", "unseen-small", 9, 1))  # same size class as 10
        large = s.admit(SchedRequest("b", "unseen-large", 210, 1))  # same size class as 200
        return small, large

    # Size class (10 samples aged one version: n = 8.4, weight 8.4 / 16.4 = 0.51) mixed with the
    # global root (mean remaining 310): 9 + 458 > 400 -> bucket 1; 210 + 162 <= 400 -> bucket 0.
    assert run(4.0) == (1, 0)
    # Global root only: 9 + 310 -> bucket 0, 210 + 310 -> bucket 1, both wrong.
    assert run(0.0) == (0, 1)


def test_min_support_counts_each_trajectory_once() -> None:
    """A prompt's trajectories sit in its own node and in the global one; adding the two counts
    made 3 trajectories (2.52 aged samples) pass min_support=4."""
    cfg = SchedulerConfig(type="cmlfq", buckets=(100, 1000), min_support=4, prefill_decode_cost_ratio=0.0)
    s = CMLFQScheduler(cfg)
    turns = (Turn(10, "calc", 5, "failure"), Turn(2000, None, 0, None))
    for i in range(3):
        finish(s, f"r{i}", "p", turns, 0)
    s.on_policy_version(1)  # 3 x 2^-(1/4) = 2.52 aged samples
    est = s.tree.estimate("p", (), (0,))
    assert est is not None and abs(est.support - 3 * 2**-0.25) < 1e-9
    assert s.admit(SchedRequest("x", "p", 10, 1)) == 0  # below min_support: the shortest bucket
    assert s.counters.admissions_from_tree == 0
    finish(s, "r3", "p", turns, 1)
    finish(s, "r4", "p", turns, 1)  # 4.52 aged samples: the tree places it (size 2025: bucket 2)
    assert s.admit(SchedRequest("y", "p", 10, 1)) == 2


def test_a_trajectory_ahead_of_the_clock_counts_once() -> None:
    """The async pipeline finishes trajectories of a version the stage's clock has not reached;
    aged forward, each counted 2^(8/4) = 4 samples. The clock follows them instead."""
    s = CMLFQScheduler(SchedulerConfig(type="cmlfq", buckets=(100, 1000)))
    s.on_policy_version(0)
    turns = (Turn(10, "calc", 5, "success"), Turn(700, None, 0, None))
    for i in range(2):
        s.on_finish(FinishedTrajectory(f"r{i}", "p", 20, 0, 8, turns))  # generated by version 8
    assert s.tree.version == 8
    est = s.tree.estimate("p", (), (0,), prompt_tokens=20)
    assert est is not None and est.support == 2.0
    assert s.tree.prompts["p"].aged_support(0, 4.0) == 2.0  # a query behind the samples: no growth


def test_a_loaded_tree_follows_the_run_config_but_keeps_its_keys() -> None:
    from libra_core.scheduling.prefix_tree import PrefixTree

    tree = PrefixTree()  # defaults: half-life 4, back-off 8, 64 samples, payload edges (16, 256, 2048)
    cfg = SchedulerConfig(
        type="cmlfq", aging_half_life_versions=16, backoff_pseudocount=2, max_samples_per_node=256
    )
    s = CMLFQScheduler(cfg, tree)
    assert (s.tree.half_life, s.tree.backoff, s.tree.max_samples) == (16.0, 2.0, 256)
    with pytest.raises(
        ValueError, match=r"built with payload_class_edges=\[16, 256, 2048\], the config asks for \[8, 64\]"
    ):
        CMLFQScheduler(SchedulerConfig(type="cmlfq", payload_class_edges=[8, 64]), PrefixTree())


def test_a_lower_sample_cap_trims_a_loaded_tree_to_its_newest_samples() -> None:
    # an insert evicts one sample: a node over a lowered cap kept its old size for good
    from libra_core.scheduling.prefix_tree import PrefixTree

    tree = PrefixTree(max_samples_per_node=64)
    for version in range(12):  # versions 0..11, 5 samples each: 60 in the prompt's node
        for i in range(5):
            tree.insert("p", (Turn(10 * version + i, None, 0, None),), version)
    s = CMLFQScheduler(SchedulerConfig(type="cmlfq", max_samples_per_node=8), tree)
    node = s.tree.prompts["p"]
    assert len(node.rem) == 8 and s.tree.max_samples == 8
    assert list(node.rem) == [102, 103, 104, 110, 111, 112, 113, 114]  # the newest, in their order
    assert all(len(n.rem) <= 8 for n in (s.tree.global_root, *s.tree.markov.values()))
    finish(s, "q", "p", (Turn(7, None, 0, None),), 12)
    assert len(s.tree.prompts["p"].rem) == 8 and s.tree.prompts["p"].rem[-1] == 7


def test_a_trajectory_too_long_for_the_tree_is_refused_whole_and_still_released() -> None:
    s = CMLFQScheduler(SchedulerConfig(type="cmlfq", buckets=(100,), min_support=1))
    s.admit(SchedRequest("huge", "p", 10, 0))
    pay = 2**31 - 100  # two such payloads overflow the tree's 32-bit samples
    turns = (Turn(10, "calc", pay, "success"), Turn(10, "calc", pay, "success"), Turn(5, None, 0, None))
    with pytest.raises(ValueError, match="at most 2147483647"):
        finish(s, "huge", "p", turns, 0)
    assert s.in_flight() == 0  # the request left its instance
    assert s.tree.prompts == {}  # nothing half written
    s.admit(SchedRequest("next", "p", 10, 0))
    finish(s, "next", "p", long(), 0)
    assert s.admit(SchedRequest("probe", "p", 10, 0)) == 1


def test_a_loaded_tree_with_an_empty_size_level_takes_the_configs_bins() -> None:
    # A tree saved with the level off (0 bins) has no size classes yet: the run's bins apply as it
    # fills, so prompts of similar size pool their evidence from the first insert on.
    cfg = SchedulerConfig(type="cmlfq", buckets=(100,), prompt_size_bins_per_octave=4.0)
    s = CMLFQScheduler(cfg, PrefixTree(prompt_size_bins_per_octave=0.0))
    s.admit(SchedRequest("r", "p", 10, 0))
    s.on_finish(FinishedTrajectory("r", "p", 10, 0, 0, (Turn(5, None, 0, None),)))
    assert s.tree.size_bins_per_octave == 4.0
    assert len(s.tree.size_classes) == 1


@pytest.mark.parametrize("simulated", [False, True])
def test_a_tie_for_the_best_bucket_does_not_block_the_target(simulated: bool) -> None:
    """After a success half the trajectories end at 60 tokens (bucket 1), half at 70 (bucket 2),
    10 generated either way: buckets 1 and 2 both expect 5 generated tokens in their right bucket,
    and the mean (65) and the P90 (70) say bucket 2. The target is one of the best buckets and the
    move pays (5 > re-prefill 20 x 0.1); until 2026-12-07 the first of the equal maxima (bucket 1)
    was taken as the best one and the request stayed, counted as a disagreement."""
    cfg = SchedulerConfig(
        type="cmlfq",
        buckets=(48, 64),
        prefill_decode_cost_ratio=0.1,
        prompt_size_bins_per_octave=0,
        backoff_pseudocount=1e-9,
    )
    # The simulator's lazy copy of the rule decides as the library does (it took the first maximum too).
    s = SimCMLFQScheduler(cfg, tree=SimPrefixTree.from_config(cfg)) if simulated else CMLFQScheduler(cfg)
    ok, failed, end = Turn(10, "calc", 20, "success"), Turn(10, "calc", 20, "failure"), Turn(0, None, 0, None)
    for k in range(40):  # most end right after a failure: the root admits to bucket 0
        finish(s, f"f{k}", "p", (failed, Turn(1, None, 0, None)), 0)
    for k in range(4):
        finish(s, f"a{k}", "p", (ok, Turn(10, "calc", 10, "success"), end), 0)  # 20 left after ok
        finish(s, f"b{k}", "p", (ok, Turn(10, "calc", 20, "success"), end), 0)  # 30 left after ok
    req = SchedRequest("new", "p", 10, 1)
    assert s.admit(req) == 0
    assert s.on_tool_return(req, ToolReturn(0, 10, "calc", 20, "success", 40)) == Move(2)
    assert s.counters.disagree == 0 and s.counters.moves == 1


@pytest.mark.parametrize("simulated", [False, True])
def test_a_target_that_is_not_a_best_bucket_does_not_move(simulated: bool) -> None:
    """The mean and the P90 agree on a bucket that is not a best one: the request stays, counted as
    a disagreement. After a success 19 of 20 trajectories have 10 tokens left, 9 of them a tool
    payload (1 generated: final size 50, bucket 1), one has 200 generated (final size 240, bucket 2).
    Mean 19.5 (59.5: bucket 1), P90 10 (50: bucket 1); but bucket 1 expects 0.95 generated tokens
    decoded in their right bucket and bucket 2 expects 10. Guards the `values[target] < tie_floor(...)`
    half of the agreement check: without it the request moved to bucket 1 (a free move at cost ratio 0)."""
    cfg = SchedulerConfig(
        type="cmlfq",
        buckets=(48, 64),
        prefill_decode_cost_ratio=0.0,
        prompt_size_bins_per_octave=0,
        backoff_pseudocount=1e-9,
    )
    s = SimCMLFQScheduler(cfg, tree=SimPrefixTree.from_config(cfg)) if simulated else CMLFQScheduler(cfg)
    ok, failed = Turn(10, "calc", 20, "success"), Turn(10, "calc", 20, "failure")
    for k in range(40):  # most end right after a failure: the root admits to bucket 0
        finish(s, f"f{k}", "p", (failed, Turn(1, None, 0, None)), 0)
    for k in range(19):  # 10 left after ok, 1 of them generated
        finish(s, f"a{k}", "p", (ok, Turn(1, "calc", 9, "success"), Turn(0, None, 0, None)), 0)
    finish(s, "b", "p", (ok, Turn(200, None, 0, None)), 0)  # 200 left after ok, all generated
    req = SchedRequest("new", "p", 10, 1)
    assert s.admit(req) == 0
    if not simulated:
        tree = s.tree
        est = tree.estimate("p", (tree.code(tree.state_key("calc", 20, "success")),), (0, 30))
        assert est is not None
        assert est.mean_bucket(s.bounds, 40) == est.tail_bucket(s.bounds, 40, cfg.tail_quantile) == 1
        gen = est.gen_by_bucket(s.bounds, 40)
        assert gen == pytest.approx([0.0, 0.95, 10.0]) and max(gen) == gen[2]
    assert s.on_tool_return(req, ToolReturn(0, 10, "calc", 20, "success", 40)) is None
    assert s.counters.disagree == 1 and s.counters.moves == 0 and s.counters.too_costly == 0
