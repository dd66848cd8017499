"""Damaged C-MLFQ tree files fail `load_tree` with a ValueError naming the file and the problem,
never an OverflowError, a RecursionError or a tree that loads with shifted state indices."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from libra_core.scheduling.base import Turn
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.scheduling.tree_io import load_tree, save_tree, tree_to_dict


def _tree() -> PrefixTree:
    tree = PrefixTree()
    for i in range(5):
        tree.insert("p0", (Turn(5, "calc", 3, "success"), Turn(7 + i, None, 0, None)), 0, prompt_tokens=30)
    tree.insert("p1", (Turn(5, "calc", 3, "failure"), Turn(9, None, 0, None)), 0, prompt_tokens=30)
    return tree


def _first_sample(value: float) -> Callable[[dict[str, Any]], None]:
    def damage(d: dict[str, Any]) -> None:
        d["global"]["samples"][0][0] = value

    return damage


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_first_sample(float("inf")), "a sample holds inf; its counts and version must be whole numbers"),
        (_first_sample(2**40), f"a sample holds {2**40}; its counts and version must be whole numbers"),
        (lambda d: d.update(version=float("inf")), "version is inf; it must be a whole number"),
        (
            lambda d: d["global"].update(support_version=float("inf")),
            "a node's support_version is inf; it must be a whole number",
        ),
        (
            lambda d: d["global"].update(support_version="abc"),
            "a node's support_version is 'abc'; it must be a whole number",
        ),
        (
            lambda d: d.update(states=[d["states"][1], *d["states"]]),
            "state ['calc', 0, 'failure'] appears more than once in `states`",
        ),
        (  # a later version than the tree's clock loaded, then every insert's aging overflowed
            lambda d: d["global"].update(support_version=5000),
            "a node's support_version is 5000; it must be a whole number in [0, 0]",
        ),
        (
            lambda d: d["global"]["samples"][0].__setitem__(2, 7),
            "a sample's version is outside [0, 0] (the tree's version)",
        ),
        (lambda d: d.update(prompts=[]), "prompts is a list; it must be an object"),  # was AttributeError
        (
            lambda d: d["global"].update(children=[]),
            "a node's children is a list; it must be an object",
        ),
        (  # was "AssertionError"
            lambda d: d.update(max_samples_per_node=0.5),
            "max_samples_per_node is 0.5; it must be a whole number in [1,",
        ),
        # Read as other values until 2026-12-06: 29.9 as 29, "29" as 29, true as 1, a version 0.9 as 0.
        (_first_sample(29.9), "a sample holds 29.9; its counts and version must be whole numbers"),
        (_first_sample("29"), "a sample holds '29'; its counts and version must be whole numbers"),
        (_first_sample(True), "a sample holds True; its counts and version must be whole numbers"),
        (lambda d: d.update(version=0.9), "version is 0.9; it must be a whole number"),
        (
            lambda d: d["global"].update(support="5"),
            "a node's support is '5'; it must be a finite number >= 0",
        ),
        (
            lambda d: d.update(prompt_size_bins_per_octave=float("nan")),
            "prompt_size_bins_per_octave is nan; it must be a finite number >= 0",
        ),
        # Loaded until 2026-12-07: an inf mean (1e300 / 1e-300) and a NaN generated mean.
        (
            lambda d: d["global"].update(support=1e-300, sum_rem=1e300, sum_gen=1e300),
            "a node's sums (sum_rem 1e+300, sum_gen 1e+300) do not fit its support 1e-300",
        ),
        (
            lambda d: d["global"].update(sum_rem=40.0, sum_gen=41.0),
            "a node's sums (sum_rem 40.0, sum_gen 41.0) do not fit its support 6.0",
        ),
    ],
    ids=[
        "sample-inf",
        "sample-2**40",
        "version-inf",
        "support-version-inf",
        "support-version-str",
        "state-twice",
        "support-version-ahead",
        "sample-version-ahead",
        "prompts-list",
        "children-list",
        "max-samples-half",
        "sample-float",
        "sample-str",
        "sample-bool",
        "version-float",
        "support-str",
        "size-bins-nan",
        "sums-above-support",
        "sum-gen-above-sum-rem",
    ],
)
def test_a_damaged_field_is_a_value_error_naming_the_file(
    tmp_path: Path, damage: Callable[[dict[str, Any]], None], problem: str
) -> None:
    data = tree_to_dict(_tree())
    assert len(data["states"]) == 2
    damage(data)
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data), encoding="utf-8")  # Infinity, as Python's json writes it
    with pytest.raises(ValueError) as err:
        load_tree(path)
    assert type(err.value) is ValueError
    assert str(err.value).startswith(f"{path}: damaged C-MLFQ tree: tree file: {problem}")


@pytest.mark.parametrize(
    "content",
    [b'{"format": "\xff"}', b"\x1f\x8b\x08\x00\x00\x00", b"\x80\x04\x95"],
    ids=["latin-1", "gzip", "pickle"],
)
def test_bytes_that_are_not_utf8_name_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tree.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        load_tree(path)
    assert str(err.value).startswith(f"{path} is not a JSON C-MLFQ tree: 'utf-8' codec can't decode")


def test_json_nested_too_deeply_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tree.json"
    path.write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    with pytest.raises(ValueError) as err:
        load_tree(path)
    assert str(err.value) == f"{path} is not a JSON C-MLFQ tree: it is nested too deeply to parse"


def test_a_sound_file_still_loads(tmp_path: Path) -> None:
    tree = _tree()
    loaded = load_tree(save_tree(tree, tmp_path / "tree.json"))
    assert tree_to_dict(loaded) == tree_to_dict(tree)


def test_an_overlong_number_names_the_file(tmp_path: Path) -> None:
    """json.loads refuses an integer of more than 4,300 digits with a plain ValueError, which
    escaped without the file's name until 2026-12-07."""
    path = save_tree(_tree(), tmp_path / "tree.json")
    text = path.read_text(encoding="utf-8").replace('"version":0', '"version":' + "9" * 5000, 1)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_tree(path)
    assert str(err.value).startswith(f"{path} is not a JSON C-MLFQ tree: ")
    assert "digits" in str(err.value)


def test_a_node_over_the_sample_cap_keeps_its_newest_samples(tmp_path: Path) -> None:
    """A node holding more samples than the file's `max_samples_per_node` kept them all until
    2026-12-07 (an insert evicts one, so it never shrank); now it loads with its newest `cap`."""
    data = tree_to_dict(_tree())
    data["version"] = 1
    data["global"]["samples"] = [[5, 5, 0]] * 4990 + [[7, 7, 1]] * 64
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    tree = load_tree(path)
    assert tree.max_samples == 64
    assert tree.global_root.triples() == [(7, 7, 1)] * 64
