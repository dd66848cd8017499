"""Tree depth: paths stop at `MAX_PATH_DEPTH` tool returns, so every tree can be saved and loaded.

Until 2026-12-07 a path grew with every tool return; `max_turns` has no upper bound, and a trajectory
of about 495 returns made `save_tree` raise a RecursionError (the writer and `json.dumps` nest once
per level), after which the run's tree could never be saved again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.scheduling import prefix_tree
from libra_core.scheduling.base import Turn
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, merge_tree, save_tree, tree_to_dict
from libra_core.scheduling.tree_node import Node

STATE = ("calc", 0, "success")


def depth(node: Node) -> int:
    """Tool returns on the longest path below `node` (0 for a leaf)."""
    deepest, stack = 0, [(node, 0)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in (n.children or {}).values())
    return deepest


def chain(num_returns: int) -> PrefixTree:
    """A tree whose global path has `num_returns` levels, built without `insert` (as a file
    saved before the cap, or a tree filled some other way, would hold)."""
    tree = PrefixTree()
    code = tree.code(STATE, create=True)
    node = tree.global_root
    for d in range(num_returns + 1):
        node.record(num_returns - d + 1, 1, 0, tree.max_samples, tree.half_life)
        if d < num_returns:
            node = node.child_or_new(code)
    return tree


def test_a_trajectory_of_many_tool_returns_is_saved_and_loaded(tmp_path: Path) -> None:
    tree = PrefixTree()
    num_returns = 600
    turns = tuple(Turn(5, "calc", 3, "success") for _ in range(num_returns)) + (Turn(5, None, 0, None),)
    tree.insert("p", turns, 0, prompt_tokens=20)
    loaded = load_tree(save_tree(tree, tmp_path / "tree.json"))  # a RecursionError until 2026-12-07
    assert tree_to_dict(loaded) == tree_to_dict(tree)
    cap = prefix_tree.MAX_PATH_DEPTH
    assert cap == 64
    assert depth(loaded.global_root) == depth(loaded.prompts["p"]) == cap
    # Returns past the cap still feed the Markov table: from depth 16 on, one node per state, which
    # recorded returns 16..600 of this trajectory (support 585).
    code = loaded.code(STATE)
    assert loaded.markov[(prefix_tree.MARKOV_MAX_DEPTH, code)].support == num_returns - 15
    # A request past the cap is estimated from the Markov node and the deepest ancestors.
    consumed = [8 * d for d in range(num_returns + 1)]
    est = loaded.estimate("p", [code] * num_returns, consumed, prompt_tokens=20)
    assert est is not None and est.support == num_returns - 15


def test_a_file_deeper_than_the_cap_loads_cut_at_the_cap(tmp_path: Path) -> None:
    path = save_tree(chain(100), tmp_path / "tree.json")
    loaded = load_tree(path)
    assert depth(loaded.global_root) == prefix_tree.MAX_PATH_DEPTH
    # what stays is what the file held
    assert tree_to_dict(loaded)["global"]["samples"] == json.loads(path.read_text())["global"]["samples"]


def test_a_file_nested_deeper_than_the_parser_goes_names_the_file(tmp_path: Path) -> None:
    data = tree_to_dict(chain(0))
    node = '{"support":1.0,"sum_rem":1.0,"sum_gen":1.0,"support_version":0,"samples":[[1,1,0]]'
    levels = 5000
    nested = (node + ',"children":{"0":') * levels + node + "}" + "}}" * levels
    text = json.dumps(data).replace(json.dumps(data["global"]), nested, 1)
    path = tmp_path / "tree.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_tree(path)
    assert str(err.value) == f"{path} is not a JSON C-MLFQ tree: it is nested too deeply to parse"


def test_a_tree_too_deep_to_write_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tree.json"
    with pytest.raises(ValueError) as err:
        save_tree(chain(5000), path)
    assert str(err.value).startswith(f"cannot save the C-MLFQ tree to {path}: ")
    assert list(tmp_path.iterdir()) == []  # no file, no temp file left behind


def test_merging_deep_trees_does_not_recurse() -> None:
    merged = merge_tree(chain(5000), chain(5000))
    assert depth(merged.global_root) == 5000
    assert merged.global_root.support == 2.0
