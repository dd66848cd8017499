"""The C-MLFQ prefix tree: insert/estimate, save/load round trip, merge, pruning."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from libra_core.scheduling.base import Turn
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, merge_tree, save_tree, tree_from_dict, tree_to_dict
from libra_core.traces.synthetic import SyntheticTraceConfig, synthetic_trajectories


def build(trajectories: list, **kw: object) -> PrefixTree:
    tree = PrefixTree(**kw)  # type: ignore[arg-type]
    for t in trajectories:
        tree.insert(t.prompt_id, t.turns, t.iteration, prompt_tokens=t.prompt_tokens)
    tree.set_version(max(t.iteration for t in trajectories))
    return tree


@pytest.fixture(scope="module")
def trajectories() -> list:
    cfg = SyntheticTraceConfig(num_iterations=4, prompts_per_iteration=6, group_size=4, prompt_pool=8)
    return synthetic_trajectories(random.Random(3), cfg)


def probe(tree: PrefixTree, t: object) -> list[tuple[float, float, float]]:
    """Estimates along one trajectory's path: (support, mean, P(remaining <= 500))."""
    codes, consumed, out = [], [0], []
    for depth, turn in enumerate(t.turns):  # type: ignore[attr-defined]
        est = tree.estimate(t.prompt_id, codes, consumed, prompt_tokens=t.prompt_tokens)  # type: ignore[attr-defined]
        assert est is not None
        out.append((round(est.support, 9), round(est.mean_remaining, 6), round(est.cdf(500), 9)))
        if turn.tool is None:
            break
        codes.append(tree.code(tree.state_key(turn.tool, turn.payload_tokens, turn.status)))
        consumed.append(consumed[-1] + turn.gen_tokens + turn.payload_tokens)
        assert depth < 100
    return out


def test_remaining_tokens_at_each_depth() -> None:
    tree = PrefixTree(backoff_pseudocount=1.0)
    turns = (Turn(5, "calc", 3, "success"), Turn(7, "calc", 2, "failure"), Turn(4, None, 0, None))
    tree.insert("p", turns, 0)
    # remaining: admission 5+3+7+2+4 = 21; after turn 0: 7+2+4 = 13; after turn 1: 4.
    root = tree.estimate("p", (), (0,))
    # one trajectory, seen at the prompt's node and the global one: counted once
    assert root is not None and root.mean_remaining == 21 and root.support == 1
    c0 = tree.code(tree.state_key("calc", 3, "success"))
    c1 = tree.code(tree.state_key("calc", 2, "failure"))
    assert tree.estimate("p", (c0,), (0, 8)).mean_remaining == 13  # type: ignore[union-attr]
    assert tree.estimate("p", (c0, c1), (0, 8, 17)).mean_remaining == 4  # type: ignore[union-attr]
    # An unseen prompt backs off to global evidence at the same path.
    assert tree.estimate("other", (c0,), (0, 8)).mean_remaining == 13  # type: ignore[union-attr]


def test_ancestor_backoff_is_shifted_by_tokens_consumed() -> None:
    tree = PrefixTree()
    tree.insert("p", (Turn(10, "calc", 0, "success"), Turn(30, None, 0, None)), 0)
    unseen = tree.code(("calc", 0, "timeout"), create=True)
    est = tree.estimate("p", (unseen,), (0, 25))
    # Only the global root (remaining 40) applies, shifted by the 25 tokens consumed since: 15.
    assert est is not None and est.support == 0 and est.mean_remaining == 15


def test_save_load_round_trip(tmp_path: Path, trajectories: list) -> None:
    tree = build(trajectories)
    path = save_tree(tree, tmp_path / "tree.json")
    data = json.loads(path.read_text(encoding="utf-8"))  # plain JSON, no pickle
    assert data["format"] == "libra-cmlfq-tree"
    loaded = load_tree(path)
    assert tree_to_dict(loaded) == tree_to_dict(tree)
    for t in trajectories[::7]:
        assert probe(loaded, t) == probe(tree, t)


def test_load_rejects_foreign_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something-else"}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a C-MLFQ tree"):
        load_tree(bad)
    bad.write_text("\x80not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON C-MLFQ tree"):
        load_tree(bad)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d["global"].update(support=float("nan")), r"support is nan; it must be a finite number"),
        (lambda d: d["global"].pop("samples"), r"missing field 'samples'"),
        (lambda d: d.update(half_life_versions=0), r"'half_life_versions': 0.0\} must be finite numbers > 0"),
        (lambda d: d.update(payload_class_edges=[2048, 16]), r"\[2048, 16\] must be ascending"),
        (lambda d: d["global"].update(sum_rem=-5.0), r"sum_rem is -5.0"),
    ],
)
def test_a_damaged_tree_file_names_the_problem(
    tmp_path: Path, trajectories: list, damage, message: str
) -> None:  # noqa: ANN001
    data = tree_to_dict(build(trajectories))
    damage(data)
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        load_tree(path)
    assert str(err.value).startswith(f"{path}: damaged C-MLFQ tree")


def test_merge_of_halves_equals_tree_of_all(trajectories: list) -> None:
    kw = {"max_samples_per_node": 4096}  # no eviction, so sample sets must match exactly
    whole = build(trajectories, **kw)
    first = build(trajectories[::2], **kw)
    second = build(trajectories[1::2], **kw)
    merged = merge_tree(first, second)
    assert merged.num_nodes() == whole.num_nodes()
    for t in trajectories[::5]:
        for (s1, m1, c1), (s2, m2, c2) in zip(probe(merged, t), probe(whole, t), strict=True):
            assert s1 == pytest.approx(s2) and m1 == pytest.approx(m2) and c1 == pytest.approx(c2)


def test_merge_refuses_different_payload_classes(trajectories: list) -> None:
    with pytest.raises(ValueError, match="payload_class_edges"):
        merge_tree(build(trajectories), build(trajectories, payload_class_edges=(8,)))


def test_sample_buffer_is_bounded_and_evicts_oldest() -> None:
    tree = PrefixTree(max_samples_per_node=3)
    for version, gen in enumerate((10, 20, 30, 40)):
        tree.insert("p", (Turn(gen, None, 0, None),), version)
    assert list(tree.prompts["p"].rem) == [20, 30, 40]
    assert list(tree.prompts["p"].ver) == [1, 2, 3]


def test_prune_drops_prompts_whose_support_aged_away() -> None:
    tree = PrefixTree(half_life_versions=1.0, prune_below_support=0.05, prune_nodes_per_insert=0)
    tree.insert("old", (Turn(5, None, 0, None),), 0)
    tree.insert("new", (Turn(5, None, 0, None),), 10)
    tree.set_version(10)  # O(1): moving the clock drops nothing by itself
    assert set(tree.prompts) == {"old", "new"}
    assert tree.prune() == 1  # "old" counts 2**-10 < 0.05
    assert set(tree.prompts) == {"new"}


def test_pruning_is_incremental_and_driven_by_inserts() -> None:
    tree = PrefixTree(half_life_versions=1.0, prune_below_support=0.05, prune_nodes_per_insert=0)
    two_turns = (Turn(5, "calc", 3, "success"), Turn(5, None, 0, None))
    for k in range(50):
        tree.insert(f"old{k}", two_turns, 0, prompt_tokens=10)
    tree.set_version(20)
    # A bounded call checks at most `budget` nodes (each stale node checked is dropped with its subtree).
    assert 1 <= tree.prune(budget=5) <= 5
    assert len(tree.prompts) >= 45
    # Inserts advance the same pass: 4 checks each finish it within a few dozen inserts.
    tree.prune_nodes_per_insert = 4
    for k in range(20):
        tree.insert(f"new{k}", two_turns, 20, prompt_tokens=10)
    assert set(tree.prompts) == {f"new{k}" for k in range(20)}
    # The global path and the size class survive (support refreshed at version 20); nothing is left.
    assert tree.num_nodes() == 20 * 2 + 2 + 2
    assert tree.prune() == 0


def test_size_class_level_serves_an_unseen_prompt() -> None:
    tree = PrefixTree(backoff_pseudocount=1.0)
    for k in range(10):
        tree.insert(f"small{k}", (Turn(600, None, 0, None),), 0, prompt_tokens=10)
        tree.insert(f"large{k}", (Turn(20, None, 0, None),), 0, prompt_tokens=200)
    assert tree.size_class(10) == tree.size_class(9) != tree.size_class(200)
    small = tree.estimate("unseen", (), (0,), prompt_tokens=9)
    anywhere = tree.estimate("unseen", (), (0,))
    assert small is not None and anywhere is not None
    # Class root (n = 10) takes 10 / 11 of the mass, the global root (mean 310) the rest.
    assert small.mean_remaining == pytest.approx(600 * 10 / 11 + 310 / 11)
    assert anywhere.mean_remaining == pytest.approx(310)


def test_version_1_files_still_load(trajectories: list) -> None:
    tree = build(trajectories)
    data = tree_to_dict(tree)
    data["format_version"] = 1
    del data["size_classes"], data["prompt_size_bins_per_octave"]
    stack = [data["global"], *data["prompts"].values(), *(n for _, _, n in data["markov"])]
    while stack:
        node = stack.pop()
        del node["sum_rem"], node["sum_gen"]
        stack.extend(node.get("children", {}).values())
    old = tree_from_dict(data)
    assert not old.size_classes and old.num_nodes() < tree.num_nodes()
    assert old.estimate("never-seen", (), (0,)) is not None


def test_dict_round_trip_keeps_markov_backoff(trajectories: list) -> None:
    tree = build(trajectories)
    assert tree.markov, "a multi-turn trace fills the Markov back-off table"
    assert tree_to_dict(tree_from_dict(tree_to_dict(tree))) == tree_to_dict(tree)


def test_prune_drops_a_stale_child_under_a_fresh_root() -> None:
    # A prompt seen again keeps its root fresh; a history it took only long ago must still go. The
    # existing pruning tests drop whole roots: the child check (`aged_support`, inlined) went untested.
    tree = PrefixTree(half_life_versions=1.0, prune_below_support=0.05, prune_nodes_per_insert=0)
    tree.insert("p", (Turn(5, "calc", 3, "success"), Turn(5, None, 0, None)), 0)
    tree.insert("p", (Turn(5, "calc", 3, "failure"), Turn(5, None, 0, None)), 20)
    old = tree.code(("calc", 0, "success"))
    new = tree.code(("calc", 0, "failure"))
    stale = [tree.prompts["p"].child(old), tree.global_root.child(old), tree.markov[(1, old)]]
    assert all(n is not None for n in stale) and tree.num_nodes() == 6
    # Aged at version 20 the old history counts 2**-20 < 0.05: gone from the prompt's tree, the
    # global tree and the Markov table; the new one (support 1) and both roots stay.
    assert tree.prune() == 3
    assert set(tree.prompts["p"].children or {}) == {new}
    assert set(tree.global_root.children or {}) == {new}
    assert set(tree.markov) == {(1, new)}
    assert tree.num_nodes() == 4 and tree.pruned_subtrees == 3
    assert all(n.dropped for n in stale)  # type: ignore[union-attr]
    assert not tree.prompts["p"].dropped and not tree.prompts["p"].children[new].dropped  # type: ignore[index]
    assert tree.prune() == 0  # the pass is done and the clock has not moved


def test_a_full_sample_buffer_evicts_the_oldest_version_not_the_first_inserted() -> None:
    # The async pipeline finishes trajectories out of version order: the buffer's first sample is
    # not always its oldest. Ties on the oldest version go by position (`keep_newest`'s order).
    tree = PrefixTree(max_samples_per_node=2)
    for version, gen in ((5, 50), (1, 10), (6, 60)):
        tree.insert("p", (Turn(gen, None, 0, None),), version)
    node = tree.prompts["p"]
    assert list(node.ver) == [5, 6] and list(node.rem) == [50, 60]
    tree = PrefixTree(max_samples_per_node=3)
    for version, gen in ((3, 30), (1, 11), (1, 12), (4, 40)):
        tree.insert("p", (Turn(gen, None, 0, None),), version)
    assert list(tree.prompts["p"].ver) == [3, 1, 4] and list(tree.prompts["p"].rem) == [30, 12, 40]
    # The incremental statistics (`_update_stats`) remove the same sample the buffer evicted.
    tree = PrefixTree(max_samples_per_node=2)
    tree.insert("p", (Turn(50, None, 0, None),), 5)
    tree.insert("p", (Turn(10, None, 0, None),), 1)
    node = tree.prompts["p"]
    assert node.stats(5, tree.half_life).values == [10, 50]  # cached before the eviction
    tree.insert("p", (Turn(60, None, 0, None),), 6)
    assert node.stats(6, tree.half_life).values == [50, 60]


@pytest.mark.parametrize(
    ("payload", "cls"),
    [(0, 0), (15, 0), (16, 0), (17, 1), (255, 1), (256, 1), (257, 2), (2048, 2), (2049, 3), (10**6, 3)],
)
def test_a_payload_on_a_class_edge_belongs_to_the_class_below(payload: int, cls: int) -> None:
    # Edges are inclusive upper bounds, like the bucket bounds (`bucket_of`): class i holds payloads
    # <= payload_class_edges[i]. The edges' docs only say they "separate" classes; this pins the
    # current rule, which saved trees' states are keyed by (a change remaps every loaded node).
    tree = PrefixTree()  # edges (16, 256, 2048)
    assert tree.state_key("calc", payload, "success") == ("calc", cls, "success")


def test_a_tool_return_with_a_payload_on_an_edge_finds_the_path_of_its_class() -> None:
    # Insert and lookup classify alike: a 16-token payload at decision time follows the path that
    # trajectories with 10-token payloads built (class 0), not the one of 17-token payloads.
    tree = PrefixTree(backoff_pseudocount=1e-9)
    tree.insert("p", (Turn(5, "calc", 10, "success"), Turn(100, None, 0, None)), 0)
    tree.insert("p", (Turn(5, "calc", 17, "success"), Turn(900, None, 0, None)), 0)
    code = tree.code(tree.state_key("calc", 16, "success"))
    assert code == tree.code(("calc", 0, "success")) != tree.code(("calc", 1, "success"))
    est = tree.estimate("p", (code,), (0, 21))
    assert est is not None and est.mean_remaining == pytest.approx(100)
