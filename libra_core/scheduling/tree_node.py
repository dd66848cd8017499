"""A node of the C-MLFQ prefix tree (prefix_tree.py): a bounded, version-tagged sample of remaining tokens.

Each node keeps the remaining tokens (generated + payload, and the generated part alone) seen by the
finished trajectories that passed through it, tagged with the policy version that produced them, and
its aged support (how many trajectories passed). Statistics over the sample (`stats`) are cached and
brought up to date lazily when read; see prefix_tree.py for aging and the back-off order.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice
from operator import mul

from libra_core.scheduling.estimate import NodeStats, sample_weights

# Cached node statistics are updated after at most this many inserts (then rebuilt).
_MAX_CHANGES = 8


class Node:
    __slots__ = (
        "_changes",
        "_sorted",
        "_stats",
        "children",
        "dropped",
        "samples",
        "sum_gen",
        "sum_rem",
        "support",
        "support_version",
    )

    def __init__(self, samples: array[int] | None = None) -> None:
        self.children: dict[int, Node] | None = None
        # Flat triples (remaining tokens after this point, its generated part, policy version): one
        # array per node instead of three keeps a node at ~300 bytes.
        self.samples = array("i") if samples is None else samples
        self.support = 0.0  # aged count of trajectories that passed here, as of `support_version`
        # Aged sums of their remaining tokens and generated part, aged with `support`: the node's mean
        # is exact over every trajectory that passed (the bounded sample only shapes the quantiles).
        self.sum_rem = 0.0
        self.sum_gen = 0.0
        self.support_version = 0
        self._stats: NodeStats | None = None
        # Since `_stats` was built: the samples recorded, each with the one it evicted, as
        # (evicted remaining, its rank among equal remaining values in buffer order (-1: none evicted),
        # remaining, remaining_gen, version); None when there were none (see `stats`).
        self._changes: list[tuple[int, int, int, int, int]] | None = None
        # The last statistics built, with their sample's generated tokens and weights in `values`
        # order (for `_update_stats`).
        self._sorted: tuple[NodeStats, list[int], list[float]] | None = None
        # Set on every node of a subtree that pruning detached from the tree (`PrefixTree.prune`), so
        # that code holding node references across inserts (the simulator's per-request paths) can
        # tell that a node is gone.
        self.dropped = False

    def child(self, code: int) -> Node | None:
        return None if self.children is None else self.children.get(code)

    def child_or_new(self, code: int) -> Node:
        if self.children is None:
            self.children = {}
        node = self.children.get(code)
        if node is None:
            node = self.children[code] = Node()
        return node

    def aged_support(self, version: int, half_life: float) -> float:
        age = version - self.support_version  # never negative: support does not grow with age
        return self.support * 2.0 ** (-age / half_life) if age > 0 else self.support

    def add_support(
        self, amount: float, version: int, half_life: float, sum_rem: float = 0.0, sum_gen: float = 0.0
    ) -> None:
        """Add `amount` trajectories (with these remaining-token sums) counted at `version`."""
        if version >= self.support_version:
            decay = 2.0 ** (-(version - self.support_version) / half_life)
            self.support = self.support * decay + amount
            self.sum_rem = self.sum_rem * decay + sum_rem
            self.sum_gen = self.sum_gen * decay + sum_gen
            self.support_version = version
        else:
            decay = 2.0 ** (-(self.support_version - version) / half_life)
            self.support += amount * decay
            self.sum_rem += sum_rem * decay
            self.sum_gen += sum_gen * decay
        self._invalidate()

    def record(self, remaining: int, remaining_gen: int, version: int, cap: int, half_life: float) -> None:
        """One trajectory passing here: its sample is kept (the oldest version's evicted at `cap`)
        and `add_support(1.0, ...)` added, in one call (inserts call this once per node of every
        path). Cached statistics are kept with the change (`_changes`), for `stats` to update rather
        than rebuild."""
        samples = self.samples
        evicted, rank = 0, -1
        if len(samples) >= 3 * cap:
            versions = samples[2::3]
            oldest = 3 * versions.index(min(versions))
            if self._stats is not None:
                evicted = samples[oldest]
                rank = samples[0:oldest:3].count(evicted)
            del samples[oldest : oldest + 3]
        samples.extend((remaining, remaining_gen, version))
        sv = self.support_version
        if version == sv:  # decay 2.0 ** -0.0 == 1.0: x * 1.0 + y is x + y, so skip the power
            self.support += 1.0
            self.sum_rem += remaining
            self.sum_gen += remaining_gen
        elif version > sv:
            decay = 2.0 ** (-(version - sv) / half_life)
            self.support = self.support * decay + 1.0
            self.sum_rem = self.sum_rem * decay + remaining
            self.sum_gen = self.sum_gen * decay + remaining_gen
            self.support_version = version
        else:
            decay = 2.0 ** (-(sv - version) / half_life)
            self.support += 1.0 * decay
            self.sum_rem += remaining * decay
            self.sum_gen += remaining_gen * decay
        if self._stats is not None:
            changes = self._changes
            if changes is None:
                self._changes = [(evicted, rank, remaining, remaining_gen, version)]
            elif len(changes) < _MAX_CHANGES:
                changes.append((evicted, rank, remaining, remaining_gen, version))
            else:  # a rebuild is cheaper than replaying many changes
                self._invalidate()

    @property
    def rem(self) -> array[int]:
        return self.samples[0::3]

    @property
    def gen(self) -> array[int]:
        return self.samples[1::3]

    @property
    def ver(self) -> array[int]:
        return self.samples[2::3]

    def triples(self) -> list[tuple[int, int, int]]:
        s = self.samples
        return list(zip(s[0::3], s[1::3], s[2::3], strict=True))

    def replace_samples(self, samples: Sequence[tuple[int, int, int]]) -> None:
        """Set the sample buffer to (remaining, remaining_gen, version) triples."""
        self.samples = array("i", [x for triple in samples for x in triple])
        self._invalidate()

    def keep_newest(self, cap: int) -> None:
        """Drop the oldest samples (by version, then position: the order `record` evicts in) until
        at most `cap` are left."""
        triples = self.triples()
        if len(triples) <= cap:
            return
        order = sorted(range(len(triples)), key=lambda i: (triples[i][2], i))
        drop = set(order[: len(triples) - cap])
        self.replace_samples([t for i, t in enumerate(triples) if i not in drop])

    def _invalidate(self) -> None:
        self._stats = self._changes = self._sorted = None

    def stats(self, version: int, half_life: float) -> NodeStats:
        """Aged sample statistics, cached until the next insert or version change; after a few
        inserts at the same version they are updated (`_update_stats`) rather than rebuilt."""
        cached = self._stats
        if cached is None or cached.version != version:
            cached = self._stats = self._build_stats(version, half_life)
            self._changes = None
        elif self._changes is not None:
            cached = self._stats = self._update_stats(cached, version, half_life)
            self._changes = None
        return cached

    def _update_stats(self, old: NodeStats, version: int, half_life: float) -> NodeStats:
        """`_build_stats` after the `_changes` since `old` was built at this version, float for float:
        `old`'s sorted sample, with each evicted sample removed and each new one inserted where a
        stable sort puts it (equal values keep buffer order, and a new sample is last in the
        buffer; an evicted one is the `rank`-th of its value), then the cumulative sums recomputed
        from the first position any change touched (the sums before it are the same additions)."""
        changes, sorted_ = self._changes, self._sorted
        if self.support <= 0 or changes is None or sorted_ is None or sorted_[0] is not old:
            return self._build_stats(version, half_life)
        values = old.values.copy()
        gens, weights = sorted_[1].copy(), sorted_[2].copy()
        weight_of = sample_weights(version, half_life)
        start = len(values)
        for evicted, rank, remaining, remaining_gen, u in changes:
            if rank >= 0:
                i = bisect.bisect_left(values, evicted) + rank
                del values[i], gens[i], weights[i]
                start = i if i < start else start
            w = weight_of[u]
            i = bisect.bisect_right(values, remaining)
            values.insert(i, remaining)
            gens.insert(i, remaining_gen)
            weights.insert(i, w)
            start = i if i < start else start
        if start == 0:
            cum = list(accumulate(weights))
            cum_gen = list(accumulate(map(mul, weights, gens)))
            cum_rem = list(accumulate(map(mul, weights, values)))
        else:
            cum = old.cum_weights[:start]
            cum += islice(accumulate(weights[start:], initial=cum[-1]), 1, None)
            cum_gen = old.cum_gen[:start]
            cum_gen += islice(
                accumulate(map(mul, weights[start:], gens[start:]), initial=cum_gen[-1]), 1, None
            )
            cum_rem = old.cum_rem[:start]
            cum_rem += islice(
                accumulate(map(mul, weights[start:], values[start:]), initial=cum_rem[-1]), 1, None
            )
        total = cum[-1] if cum and cum[-1] > 0 else 1.0
        means = (self.sum_rem / self.support, self.sum_gen / self.support)
        stats = NodeStats(version, values, cum, cum_gen, cum_rem, total, *means)
        self._sorted = (stats, gens, weights)
        return stats

    def _build_stats(self, version: int, half_life: float) -> NodeStats:
        """`NodeStats.build` of this node's sample, computed the same way float for float (same
        weights, same summation order) but with the loops in C: a sample holds few distinct policy
        versions, so each weight is computed once per version, and the cumulative sums are
        `itertools.accumulate` over the sorted weights (`0.0 + w == w`, so the first term is
        unchanged)."""
        if self.support <= 0:
            self._sorted = None
            return NodeStats.build(self.rem, self.gen, self.ver, version, half_life)
        # Sums and support age alike, so their ratio is the aged mean at any version.
        means = (self.sum_rem / self.support, self.sum_gen / self.support)
        s = self.samples.tolist()  # list indexing is faster than the array's
        rem, gen, ver = s[0::3], s[1::3], s[2::3]
        weight_of = sample_weights(version, half_life)
        order = sorted(range(len(rem)), key=rem.__getitem__)
        ver_sorted = map(ver.__getitem__, order)
        weights = list(map(weight_of.__getitem__, ver_sorted))
        gens = list(map(gen.__getitem__, order))
        cum = list(accumulate(weights))
        cum_gen = list(accumulate(map(mul, weights, gens)))
        values = list(map(rem.__getitem__, order))
        cum_rem = list(accumulate(map(mul, weights, values)))
        total = cum[-1] if cum and cum[-1] > 0 else 1.0
        stats = NodeStats(version, values, cum, cum_gen, cum_rem, total, *means)
        self._sorted = (stats, gens, weights)
        return stats


def new_leaf(remaining: int, remaining_gen: int, version: int, cap: int, half_life: float) -> Node:
    """A new node after `record(remaining, remaining_gen, version, ...)`: for a version >= 0 (the
    support's starting version) that is one sample, support 1.0 and the sums, the same floats
    (`0.0 * decay + x == x`)."""
    if version < 0:
        node = Node()
        node.record(remaining, remaining_gen, version, cap, half_life)
        return node
    node = Node(array("i", (remaining, remaining_gen, version)))
    node.support = 1.0
    node.sum_rem = 0.0 + remaining
    node.sum_gen = 0.0 + remaining_gen
    node.support_version = version
    return node


def subtree_nodes(node: Node) -> Iterator[Node]:
    """Every node of the subtree at `node` (itself first), depth first, without recursion."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n.children:
            stack.extend(n.children.values())


def mark_dropped(node: Node) -> None:
    """Flag every node of a subtree that pruning detached (see `Node.dropped`)."""
    for n in subtree_nodes(node):
        n.dropped = True


def count_nodes(node: Node) -> int:
    return sum(1 for _ in subtree_nodes(node))
