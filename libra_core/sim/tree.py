"""The C-MLFQ prefix tree as the simulator uses it: the real `PrefixTree`, with a lazy lookup.

`PrefixTree.estimate` builds the aged statistics (`Node.stats`) of every node of the back-off chain
(prompt, size-class, global, Markov and every shifted ancestor: ~2 x depth + 4 nodes) before
`Estimate.mix` weighs them; but the mixture gives each node the share `n / (n + pseudocount)` of the
mass still unassigned and stops once less than 1e-9 is left, and an exact-path node's means are its
aged sums over its support (a shifted ancestor's come from its sample's statistics, conditioned on
outlasting the shift: `estimate.conditioned`). `NodeMix` walks the same chain in the same order and
computes the same weights, shifts and means, part by part and only as far as a decision needs (the
shifted ancestors are appended to the chain a depth at a time, as the weighing reaches them): the
mean test of `SimCMLFQScheduler` (sim/cmlfq.py) stops once the rest of the chain cannot move the
mean across a bucket bound (most decisions end there: the request stays), and the tail test stops
at the first parts whenever the rest cannot change its outcome; part statistics (sorted sample,
cumulative weights) are built only for the parts a CDF reads and the shifted ancestors weighed, so
the widest nodes (the global root
and its shallow children, rebuilt after nearly every insert) are rarely built. Each request's walks
down the tree are kept between its tool returns (`Paths`). Every estimate, decision and counter is
the base classes' (`tests/sim` and `tests/scheduling/test_fast_paths.py` check it). Inserts, aging,
pruning and persistence are the base class's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from libra_core.scheduling.base import Turn
from libra_core.scheduling.estimate import Conditioned, Estimate, conditioned, evidence_share
from libra_core.scheduling.prefix_tree import MARKOV_MAX_DEPTH, SIZE_CLASS_MAX_DEPTH, PrefixTree
from libra_core.scheduling.tree_node import Node

Part = tuple[float, Node, int, float, float, float, Conditioned | None]  # see `NodeMix.picked`
Ancestors = tuple[list[Node], int, list[Node], int]  # (c, lc, g, lg), see `_append_ancestors`


def gen_and_scale(part: Part, version: int, half_life: float) -> tuple[float, float]:
    """A mixture part's mean remaining generated tokens and its scale (shifted / unshifted mean):
    the conditioned ones' (`estimate.conditioned`, an ancestor met tokens ago), else from the
    node's exact aged sums, as `conditioned` gives them for a shift <= 0."""
    _, node, _, mr, shifted, _, cond = part
    if cond is not None:
        return cond[2], cond[1]
    n = node.support
    mr_gen = node.sum_gen / n if n > 0 else node.stats(version, half_life).mean_remaining_gen
    return mr_gen, (shifted / mr if mr > 0 else 0.0)


class Paths:
    """One request's tree nodes along its tool-return path, kept between its lookups: the walks
    (`PrefixTree._walk`) from the global root, from its size class's root (the first
    SIZE_CLASS_MAX_DEPTH codes) and from its prompt's root, each as far as the nodes exist. A lookup
    resumes each walk where it stopped (`_resume`): O(1) new levels instead of O(depth). Inserts only
    add nodes, so a kept node is the one a fresh walk finds until pruning detaches it
    (`Node.dropped`, set on the whole detached subtree; then the walk starts over)."""

    __slots__ = ("c", "g", "monotone", "p", "size_class")

    def __init__(self, size_class: int | None) -> None:
        self.size_class = size_class
        self.monotone = True  # the request's consumed tokens never decreased (see `_target`)
        self.g: list[Node] = []
        self.c: list[Node] = []
        self.p: list[Node] = []


def _resume(nodes: list[Node], root: Node | None, path: Sequence[int], limit: int) -> list[Node]:
    """`PrefixTree._walk(root, path[:limit])`, given `nodes`, an earlier walk from `root` along a
    prefix of the same path: it is extended in place where it stopped, unless `root` changed or
    pruning detached its deepest node (which is flagged whenever any of its ancestors was)."""
    if root is None:
        return []
    if not nodes or nodes[0] is not root or nodes[-1].dropped:
        nodes = [root]
    node = nodes[-1]
    for code in path[len(nodes) - 1 : limit]:
        children = node.children
        if children is None:
            break
        child = children.get(code)
        if child is None:
            break
        nodes.append(child)
        node = child
    return nodes


class NodeMix:
    """`PrefixTree.estimate`'s mixture, evaluated lazily: `step` weighs the next chain node exactly
    as `Estimate.mix` does (the same floats in the same order), so after `run` the weights, shifts
    and means are `Estimate.mix`'s; before that, `left` bounds the mass of every part still to come."""

    __slots__ = (
        "chain",
        "consumed",
        "done",
        "half_life",
        "js",
        "last",
        "left",
        "level",
        "mean_remaining",
        "now",
        "pending",
        "picked",
        "pos",
        "pseudocount",
        "support",
        "version",
    )

    def __init__(
        self,
        chain: list[Node],
        js: list[int],
        pending: Ancestors | None,
        last: Node,
        consumed: Sequence[int],
        support: float,
        tree: PrefixTree,
    ) -> None:
        self.chain = chain  # the back-off chain, most specific first
        self.js = js  # per chain node: the depth its shift is measured from (-1: no shift)
        # The ancestors still to append to `chain` (`_append_ancestors`'s order), one depth at a time
        # as the weighing reaches them (most decisions stop a level or two in): `level` is the next.
        self.pending = pending
        self.level = -1 if pending is None else max(pending[1], pending[3]) - 1
        self.last = last  # the last chain node with samples: it takes the mass left
        self.consumed = consumed
        self.now = consumed[-1]
        self.support = support
        self.version, self.half_life, self.pseudocount = tree.version, tree.half_life, tree.backoff
        # (weight, node, shift, node's mean remaining, shifted mean, mass unassigned before it,
        # `conditioned` of a part with a shift > 0 else None) of each part so far (weight > 1e-9): the
        # parts of `Estimate.mix`, in order, with node statistics left to build (`Node.stats`) until
        # a decision reads the CDF or a shifted ancestor is conditioned on its sample.
        self.picked: list[Part] = []
        self.pos = 0  # next chain node to weigh
        self.left = 1.0  # mass not yet assigned: the parts still to come weigh at most this in all
        self.mean_remaining = 0.0  # sum of the parts' weight x shifted mean so far
        self.done = False

    def step(self) -> bool:
        """Weigh chain nodes up to the next part; False once the chain is done without one."""
        if self.done:
            return False
        chain, js, last = self.chain, self.js, self.last
        version, half_life = self.version, self.half_life
        left, pos = self.left, self.pos
        while True:
            if pos == len(chain):  # the weighed nodes are all in: append the next ancestor level
                assert self.pending is not None and self.level >= 0, "weighed past the last node"
                c, lc, g, lg = self.pending
                j = self.level
                self.level = j - 1
                if j < lc:
                    chain.append(c[j])
                    js.append(j)
                if j < lg:
                    chain.append(g[j])
                    js.append(j)
            node = chain[pos]
            pos += 1
            if not node.samples:
                continue
            n_support = node.support
            j = js[pos - 1]
            shift = 0 if j < 0 else self.now - self.consumed[j]
            if node is last:
                weight = left
            else:
                n = n_support * 2.0 ** (-(version - node.support_version) / half_life)
                if shift > 0:  # `Estimate.mix`: an ancestor's support counts its outlasting samples
                    n = n * evidence_share(node.stats(version, half_life), shift)
                weight = left * n / (n + self.pseudocount)
            before = left
            left -= weight
            found = weight > 1e-9
            if found:
                # A node loaded without support has only its sample's mean.
                mr = (
                    node.sum_rem / n_support
                    if n_support > 0
                    else node.stats(version, half_life).mean_remaining
                )
                cond = None
                if shift > 0:  # an ancestor: its samples that outlast the shift (`conditioned`)
                    cond = conditioned(node.stats(version, half_life), shift, mr, 0.0)
                    shifted = cond[0]
                else:
                    shifted = mr - shift
                    if not shifted > 0.0:  # max(0.0, mr - shift), NaN included
                        shifted = 0.0
                self.picked.append((weight, node, shift, mr, shifted, before, cond))
                self.mean_remaining += weight * shifted
            if left <= 1e-9 or node is last:
                self.done = True
            if found or self.done:
                self.left, self.pos = left, pos
                return found

    def run(self) -> NodeMix:
        """Weigh the rest of the chain: every part and the mean are then `Estimate.mix`'s."""
        while self.step():
            pass
        return self

    def estimate(self) -> Estimate:
        """`Estimate.mix`'s estimate: its parts and its generated-token mean, the same floats added
        in the same order."""
        self.run()
        version, half_life = self.version, self.half_life
        parts = []
        mean_gen = 0.0
        for part in self.picked:
            weight, node, shift, _, _, _, cond = part
            mr_gen, scale = gen_and_scale(part, version, half_life)
            mean_gen += weight * mr_gen * scale
            stats = node.stats(version, half_life)
            if cond is None:
                parts.append((weight, stats, shift, scale, 0.0, 0.0, stats.total_weight))
            else:
                parts.append((weight, stats, shift, scale, cond[3], cond[4], cond[5]))
        return Estimate(parts, self.support, self.mean_remaining, mean_gen)


class SimPrefixTree(PrefixTree):
    """`PrefixTree` plus `max_remaining`, an upper bound on every node's mean remaining tokens."""

    # The largest remaining-token count any insert recorded (a trajectory's total after its prompt):
    # each node's mean is a weighted mean of its samples, so no mean exceeds it. Trees filled
    # otherwise (tree_io) are plain `PrefixTree`s, whose bound is unknown (`max_remaining_of`).
    max_remaining = 0.0

    def insert(
        self, prompt_id: str, turns: Sequence[Turn], version: int, *, prompt_tokens: int | None = None
    ) -> None:
        super().insert(prompt_id, turns, version, prompt_tokens=prompt_tokens)
        total = sum(t.gen_tokens + t.payload_tokens for t in turns)
        self.max_remaining = max(self.max_remaining, float(total))

    def estimate(
        self,
        prompt_id: str,
        path: Sequence[int],
        consumed: Sequence[int],
        *,
        prompt_tokens: int | None = None,
    ) -> Estimate | None:
        with self.lock:
            mix = mix_nodes(self, prompt_id, path, consumed, prompt_tokens)
            return None if mix is None else mix.estimate()


def max_remaining_of(tree: PrefixTree) -> float:
    """An upper bound on every node's mean remaining tokens: `SimPrefixTree.max_remaining`, or inf."""
    return tree.max_remaining if isinstance(tree, SimPrefixTree) else math.inf


def mix_nodes(
    self: PrefixTree,
    prompt_id: str,
    path: Sequence[int],
    consumed: Sequence[int],
    prompt_tokens: int | None = None,
    paths: Paths | None = None,
) -> NodeMix | None:
    """The back-off chain `PrefixTree.estimate` mixes, as a `NodeMix` with no part weighed yet
    (None when no node has samples). `paths`: the request's walks from its previous lookup (updated
    here), or None to walk from the roots. Works on any `PrefixTree` (single-threaded: the lock is
    not taken)."""
    depth = len(path)
    assert len(consumed) == depth + 1, f"consumed has {len(consumed)} entries for depth {depth}"
    if paths is None:
        paths = Paths(self.size_class(prompt_tokens))
    version, half_life = self.version, self.half_life
    size_class = paths.size_class
    g = paths.g = _resume(paths.g, self.global_root, path, depth)
    c_root = None if size_class is None else self.size_classes.get(size_class)
    c = paths.c = _resume(paths.c, c_root, path, SIZE_CLASS_MAX_DEPTH)
    p = paths.p = _resume(paths.p, self.prompts.get(prompt_id), path, depth)
    lg, lc = len(g), len(c)
    prompt_support = global_support = 0.0
    head: list[Node] = []  # the exact-path nodes, unshifted
    # The supports are `Node.aged_support`, inlined.
    if len(p) == depth + 1:
        p_node = p[-1]
        head.append(p_node)
        prompt_support = p_node.support * 2.0 ** (-(version - p_node.support_version) / half_life)
    if lc == depth + 1:
        head.append(c[-1])
        lc -= 1
    if lg == depth + 1:
        g_exact = g[-1]
        head.append(g_exact)
        global_support = g_exact.support * 2.0 ** (-(version - g_exact.support_version) / half_life)
        lg -= 1
    m_key = (depth if depth < MARKOV_MAX_DEPTH else MARKOV_MAX_DEPTH, path[-1]) if depth else None
    if m_key is not None and (m_node := self.markov.get(m_key)) is not None:
        head.append(m_node)
        m_support = m_node.support * 2.0 ** (-(version - m_node.support_version) / half_life)
        global_support = m_support if m_support > global_support else global_support  # max()
    # The chain: `head`, then the shifted ancestors (`_append_ancestors`); only nodes with samples
    # count, and the last of those takes the mass left. That is almost always the chain's final node
    # (the global root); then the ancestors are appended only if the weighing gets to them.
    chain = head
    js = [-1] * len(head)
    pending: Ancestors | None = (c, lc, g, lg)
    final = g[0] if lg else c[0] if lc else None
    if final is not None and final.samples:
        last = final
    else:
        _append_ancestors(chain, js, c, lc, g, lg)
        pending = None
        for last in reversed(chain):
            if last.samples:
                break
        else:
            return None
    support = prompt_support if prompt_support > global_support else global_support  # max()
    return NodeMix(chain, js, pending, last, consumed, support, self)


def _append_ancestors(
    chain: list[Node], js: list[int], c: list[Node], lc: int, g: list[Node], lg: int
) -> None:
    """Append the ancestors to the chain: from the deepest depth j up, the size-class node `c[j]`
    (j < lc), then the global one `g[j]` (j < lg), each shifted by the tokens processed since depth
    j (`js`: j; -1 for the unshifted head)."""
    both = min(lc, lg)
    if lg > both:
        chain += g[both:lg][::-1]
        js += range(lg - 1, both - 1, -1)
    elif lc > both:
        chain += c[both:lc][::-1]
        js += range(lc - 1, both - 1, -1)
    for j in range(both - 1, -1, -1):
        chain.append(c[j])
        chain.append(g[j])
        js += (j, j)
