"""Saving, loading and merging C-MLFQ prefix trees (JSON; never pickle).

A saved tree lets a new run start with the statistics of an earlier one, and merging lets several
rollout workers that each built a tree combine them. The file is one JSON object:

    {"format": "libra-cmlfq-tree", "format_version": 2, "version": <policy version>,
     "max_samples_per_node": ..., "half_life_versions": ..., "backoff_pseudocount": ...,
     "payload_class_edges": [...], "prompt_size_bins_per_octave": ...,
     "states": [[tool, payload_class, status], ...], "global": NODE, "prompts": {prompt_id: NODE},
     "size_classes": [[size class, NODE], ...], "markov": [[depth, state index, NODE], ...]}
    NODE = {"support": float, "sum_rem": float, "sum_gen": float, "support_version": int,
            "samples": [[remaining, remaining_gen, version], ...],
            "children": {"<index into states>": NODE}}

Version 1 files (no size classes, no sums) still load: their sums are rebuilt from support x the
sample means, and the size-class level fills as new trajectories finish.

Writes are atomic (temp file + rename). Loading validates the header, every field's type and
range (finite counts >= 0, sums that fit the support, samples that fit the nodes' int32 arrays,
ascending payload edges, distinct states, state indices) and raises ValueError naming the file and
the problem. What a tree built by `PrefixTree.insert` cannot hold is cut on load rather than
refused (logged): levels past MAX_PATH_DEPTH tool returns (a file saved before the cap) and samples
past a node's `max_samples_per_node` (its newest kept). Merging requires equal payload-class edges
(otherwise the state keys mean different things); samples of matching nodes are pooled and the
newest `max_samples_per_node` kept.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra_core.data.atomic import atomic_path
from libra_core.scheduling.prefix_tree import MAX_PATH_DEPTH, MAX_SAMPLE_TOKENS, PrefixTree
from libra_core.scheduling.tree_node import Node

log = logging.getLogger(__name__)

FORMAT = "libra-cmlfq-tree"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
# Slack on the sums' bounds, relative and (for supports aged down to subnormal floats, which round
# apart from their sums) absolute: aged sums are rounded floats, and a file this code wrote must load
# however the roundings fell.
_SUM_SLACK = 1.0 + 1e-9
_SUPPORT_FLOOR = 1e-300


def _node_to_dict(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {
        "support": node.support,
        "sum_rem": node.sum_rem,
        "sum_gen": node.sum_gen,
        "support_version": node.support_version,
        "samples": [list(t) for t in node.triples()],
    }
    if node.children:
        out["children"] = {str(code): _node_to_dict(child) for code, child in node.children.items()}
    return out


def _count(value: Any, what: str) -> float:
    """A finite number >= 0 from the file (a NaN support routed every request to bucket 0); a
    string or a boolean is refused, not converted."""
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"tree file: {what} is {value!r}; it must be a finite number >= 0")
    return number


def _whole(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """An integer from the file, in [low, high] where given. Only a JSON integer: a float was
    truncated (a version of 3.9 read as 3), a string or a boolean converted (until 2026-12-06)."""
    whole = type(value) is int
    if not (whole and (low is None or value >= low) and (high is None or value <= high)):
        where = "" if low is None or high is None else f" in [{low}, {high}]"
        raise ValueError(f"tree file: {what} is {value!r}; it must be a whole number{where}")
    return int(value)


def _mapping(value: Any, what: str) -> list[tuple[Any, Any]]:
    if not isinstance(value, dict):
        raise ValueError(f"tree file: {what} is a {type(value).__name__}; it must be an object")
    return list(value.items())


def _sample(triple: Any) -> tuple[int, int, int]:
    """One (remaining, remaining_gen, version) sample: three JSON integers that fit int32 (the
    sample array's type)."""
    values = list(triple)
    bad = next(
        (x for x in values if type(x) is not int or not -MAX_SAMPLE_TOKENS - 1 <= x <= MAX_SAMPLE_TOKENS),
        None,
    )
    if len(values) != 3 or bad is not None:
        shown = bad if bad is not None else values
        raise ValueError(
            f"tree file: a sample holds {shown!r}; its counts and version must be whole numbers in "
            f"[0, {MAX_SAMPLE_TOKENS}]"
        )
    return values[0], values[1], values[2]


@dataclass(slots=True)
class _NodeReader:
    """Reads the nodes of a tree whose clock is at `version`, with `num_states` states and `cap`
    samples per node, and counts what it cut (`cut_nodes`, `trimmed_nodes`) for one log line."""

    num_states: int
    version: int
    cap: int
    cut_nodes: int = 0
    trimmed_nodes: int = 0

    def node(self, data: dict[str, Any], levels_left: int = MAX_PATH_DEPTH) -> Node:
        """A node and, up to `levels_left` levels, its children: no support or sample of a later
        version than the clock (an insert moves the clock to its trajectory's version; a later one
        overflowed the aging), sums that fit the support (a tiny support under large sums made an
        inf mean and a NaN generated mean, until 2026-12-07)."""
        version = self.version
        node = Node()
        node.support = _count(data["support"], "a node's support")
        node.support_version = _whole(data["support_version"], "a node's support_version", 0, version)
        node.replace_samples([_sample(triple) for triple in data["samples"]])
        if any(r < 0 or g < 0 for r, g, _ in node.triples()):
            raise ValueError("tree file: a sample has a negative remaining-token count")
        if any(not 0 <= v <= version for v in node.ver):
            raise ValueError(f"tree file: a sample's version is outside [0, {version}] (the tree's version)")
        if "sum_rem" in data:
            node.sum_rem = _count(data["sum_rem"], "a node's sum_rem")
            node.sum_gen = _count(data["sum_gen"], "a node's sum_gen")
        elif node.samples:  # format 1: the sample means stand in for the exact ones
            rem, gen = node.rem, node.gen
            node.sum_rem = node.support * sum(rem) / len(rem)
            node.sum_gen = node.support * sum(gen) / len(gen)
        # Every remaining count is in [its generated part, MAX_SAMPLE_TOKENS], and the sums are those
        # counts weighted as the support counts them.
        if not (
            node.sum_gen <= node.sum_rem * _SUM_SLACK
            and node.sum_rem <= (node.support + _SUPPORT_FLOOR) * MAX_SAMPLE_TOKENS * _SUM_SLACK
        ):
            raise ValueError(
                f"tree file: a node's sums (sum_rem {node.sum_rem!r}, sum_gen {node.sum_gen!r}) do not "
                f"fit its support {node.support!r}: they must satisfy 0 <= sum_gen <= sum_rem <= "
                f"support x {MAX_SAMPLE_TOKENS}"
            )
        if len(node.samples) > 3 * self.cap:  # after format 1's means, which take every sample
            # An insert evicts one sample, so a node over the cap never shrank (until 2026-12-07).
            node.keep_newest(self.cap)
            self.trimmed_nodes += 1
        children = _mapping(data.get("children", {}), "a node's children")
        if children and levels_left <= 0:
            self.cut_nodes += 1
            return node
        for code, child in children:
            if not 0 <= int(code) < self.num_states:
                raise ValueError(f"tree file: child state {code} is not an index into `states`")
            if node.children is None:
                node.children = {}
            node.children[int(code)] = self.node(child, levels_left - 1)
        return node


def tree_to_dict(tree: PrefixTree) -> dict[str, Any]:
    with tree.lock:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "version": tree.version,
            "max_samples_per_node": tree.max_samples,
            "half_life_versions": tree.half_life,
            "backoff_pseudocount": tree.backoff,
            "payload_class_edges": list(tree.payload_edges),
            "prompt_size_bins_per_octave": tree.size_bins_per_octave,
            "states": [list(s) for s in tree.states],
            "global": _node_to_dict(tree.global_root),
            "prompts": {p: _node_to_dict(n) for p, n in tree.prompts.items()},
            "size_classes": [[c, _node_to_dict(n)] for c, n in tree.size_classes.items()],
            "markov": [[d, c, _node_to_dict(n)] for (d, c), n in tree.markov.items()],
        }


def tree_from_dict(data: dict[str, Any]) -> PrefixTree:
    """The tree a file's JSON object holds; ValueError naming the problem when it is not one
    (a foreign format, a missing or mistyped field, a number out of range)."""
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or data.get("format_version") not in READABLE_VERSIONS
    ):
        found = data if not isinstance(data, dict) else {k: data.get(k) for k in ("format", "format_version")}
        raise ValueError(
            f"not a C-MLFQ tree: {found!r}, expected format {FORMAT!r} with format_version in "
            f"{list(READABLE_VERSIONS)}"
        )
    try:
        return _tree_from_dict(data)
    except RecursionError as err:  # a chain of nodes deeper than any trajectory's turns
        raise ValueError("damaged C-MLFQ tree: its nodes are nested too deeply to load") from err
    except (
        KeyError,
        TypeError,
        IndexError,
        AssertionError,
        AttributeError,
        ValueError,
        OverflowError,
    ) as err:
        detail = f"missing field {err}" if isinstance(err, KeyError) else str(err) or type(err).__name__
        raise ValueError(f"damaged C-MLFQ tree: {detail}") from err


def _tree_from_dict(data: dict[str, Any]) -> PrefixTree:
    edges = [_whole(e, "a payload class edge") for e in data["payload_class_edges"]]
    if any(a >= b for a, b in zip(edges, edges[1:], strict=False)) or any(e < 0 for e in edges):
        raise ValueError(f"tree file: payload_class_edges {edges} must be ascending numbers >= 0")
    positive = {
        k: _count(data[k], k) for k in ("max_samples_per_node", "half_life_versions", "backoff_pseudocount")
    }
    bad = {k: v for k, v in positive.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        raise ValueError(f"tree file: {bad} must be finite numbers > 0")
    tree = PrefixTree(
        max_samples_per_node=_whole(
            data["max_samples_per_node"], "max_samples_per_node", 1, MAX_SAMPLE_TOKENS
        ),
        half_life_versions=positive["half_life_versions"],
        backoff_pseudocount=positive["backoff_pseudocount"],
        payload_class_edges=edges,
        prompt_size_bins_per_octave=_count(
            data.get("prompt_size_bins_per_octave", 4.0), "prompt_size_bins_per_octave"
        ),
    )
    tree.version = _whole(data["version"], "version")
    for tool, cls, status in data["states"]:
        state = (str(tool), _whole(cls, "a state's payload class"), str(status))
        # the nodes' child keys index `states`: a second entry would shift every later index
        if tree.code(state) >= 0:
            raise ValueError(f"tree file: state {list(state)} appears more than once in `states`")
        tree.code(state, create=True)
    n = len(tree.states)
    read = _NodeReader(n, tree.version, tree.max_samples)
    tree.global_root = read.node(data["global"])
    tree.prompts = {str(p): read.node(node) for p, node in _mapping(data["prompts"], "prompts")}
    tree.size_classes = {
        _whole(c, "a size class"): read.node(node) for c, node in data.get("size_classes", [])
    }
    for depth, code, node in data["markov"]:
        if not 0 <= _whole(code, "a markov state") < n:
            raise ValueError(f"tree file: markov state {code} is not an index into `states`")
        tree.markov[(_whole(depth, "a markov depth", 1), code)] = read.node(node)
    if read.cut_nodes or read.trimmed_nodes:
        log.warning(
            "C-MLFQ tree file: cut the children of %d nodes at depth %d (MAX_PATH_DEPTH) and trimmed "
            "%d nodes to their newest %d samples (max_samples_per_node)",
            read.cut_nodes,
            MAX_PATH_DEPTH,
            read.trimmed_nodes,
            tree.max_samples,
        )
    return tree


def save_tree(tree: PrefixTree, path: str | Path) -> Path:
    path = Path(path)
    try:  # before the temp file exists: a tree that cannot be written leaves no file behind
        text = json.dumps(tree_to_dict(tree), separators=(",", ":"))
    except RecursionError as err:  # the writer and json.dumps nest once per level
        raise ValueError(
            f"cannot save the C-MLFQ tree to {path}: its nodes are nested too deeply to write; "
            f"PrefixTree.insert keeps paths within MAX_PATH_DEPTH = {MAX_PATH_DEPTH} tool returns, "
            "so build the tree with it (or load_tree, which cuts deeper levels)"
        ) from err
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def load_tree(path: str | Path) -> PrefixTree:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of > 4300 digits
        raise ValueError(f"{path} is not a JSON C-MLFQ tree: {err}") from err
    except RecursionError as err:  # no tree nests this deep
        raise ValueError(f"{path} is not a JSON C-MLFQ tree: it is nested too deeply to parse") from err
    try:
        return tree_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def _merge_node(dst: Node, src: Node, code_map: list[int], tree: PrefixTree) -> None:
    """Merge the subtree at `src` into the one at `dst`, without recursion (any depth merges)."""
    stack = [(dst, src)]
    while stack:
        d, s = stack.pop()
        d.add_support(s.support, s.support_version, tree.half_life, s.sum_rem, s.sum_gen)
        d.replace_samples(sorted([*d.triples(), *s.triples()], key=lambda t: t[2])[-tree.max_samples :])
        stack.extend((d.child_or_new(code_map[code]), child) for code, child in (s.children or {}).items())


def merge_tree(into: PrefixTree, other: PrefixTree) -> PrefixTree:
    """Merge `other` into `into` (in place; returns `into`). Both must use the same payload classes
    and prompt-size bins."""
    if into.payload_edges != other.payload_edges:
        raise ValueError(
            f"cannot merge trees with payload_class_edges {list(into.payload_edges)} and "
            f"{list(other.payload_edges)}; rebuild one with the other's edges"
        )
    if into.size_bins_per_octave != other.size_bins_per_octave and other.size_classes:
        raise ValueError(
            f"cannot merge trees with prompt_size_bins_per_octave {into.size_bins_per_octave} and "
            f"{other.size_bins_per_octave}; rebuild one with the other's bins"
        )
    with into.lock, other.lock:
        code_map = [into.code(state, create=True) for state in other.states]
        _merge_node(into.global_root, other.global_root, code_map, into)
        for prompt_id, node in other.prompts.items():
            dst = into.prompts.get(prompt_id)
            if dst is None:
                dst = into.prompts[prompt_id] = Node()
            _merge_node(dst, node, code_map, into)
        for size_class, node in other.size_classes.items():
            dst = into.size_classes.get(size_class)
            if dst is None:
                dst = into.size_classes[size_class] = Node()
            _merge_node(dst, node, code_map, into)
        for (depth, code), node in other.markov.items():
            key = (depth, code_map[code])
            dst = into.markov.get(key)
            if dst is None:
                dst = into.markov[key] = Node()
            _merge_node(dst, node, code_map, into)
        into.version = max(into.version, other.version)
    return into
