"""The C-MLFQ prefix tree as the simulator uses it: the real `PrefixTree`, with a lazy lookup.

`PrefixTree.estimate` builds the aged statistics (`Node.stats`) of every node of the back-off chain
(prompt, size-class, global, Markov and every shifted ancestor: ~2 x depth + 4 nodes) before
`Estimate.mix` weighs them; but the mixture gives each node the share `n / (n + pseudocount)` of the
mass still unassigned and stops once less than 1e-9 is left, and a node's statistics' means are its
aged sums over its support. `mix_nodes` walks the same chain in the same order and computes the same
weights, shifts and means from those sums, leaving each part's statistics (sorted sample, cumulative
weights) unbuilt. `SimCMLFQScheduler` builds them only when a decision gets past the mean test, and
the tail test then stops at the first parts whenever the rest cannot change its outcome, so the
widest nodes (the global root and its shallow children, rebuilt after nearly every insert) are
rarely built. Every estimate, decision and counter is the base classes' (`tests/sim` and
`tests/scheduling/test_fast_paths.py` check it). Inserts, aging, pruning and persistence are the
base class's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from libra_core.scheduling.base import Move, SchedRequest, ToolReturn, bucket_of
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.estimate import Estimate, NodeStats
from libra_core.scheduling.prefix_tree import MARKOV_MAX_DEPTH, SIZE_CLASS_MAX_DEPTH, Node, PrefixTree


class NodeMix(NamedTuple):
    """An `Estimate` whose parts hold tree nodes instead of their statistics."""

    parts: list[tuple[float, Node, int, float]]  # (mixture weight, node, shift, generated-token scale)
    support: float
    mean_remaining: float
    mean_remaining_gen: float

    def estimate(self, version: int, half_life: float) -> Estimate:
        parts = [(w, node.stats(version, half_life), shift, scale) for w, node, shift, scale in self.parts]
        return Estimate(parts, self.support, self.mean_remaining, self.mean_remaining_gen)


class SimPrefixTree(PrefixTree):
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
            return None if mix is None else mix.estimate(self.version, self.half_life)


def mix_nodes(
    self: PrefixTree,
    prompt_id: str,
    path: Sequence[int],
    consumed: Sequence[int],
    prompt_tokens: int | None = None,
) -> NodeMix | None:
    """The mixture `PrefixTree.estimate` returns, with `(weight, node, shift, scale)` parts: each
    part's node statistics are left to build (`Node.stats`) until a decision needs the CDF. Works on
    any `PrefixTree` (single-threaded: the lock is not taken)."""
    depth = len(path)
    assert len(consumed) == depth + 1, f"consumed has {len(consumed)} entries for depth {depth}"
    size_class = self.size_class(prompt_tokens)
    version, half_life = self.version, self.half_life
    g_nodes = _walk(self.global_root, path)
    c_root = None if size_class is None else self.size_classes.get(size_class)
    c_nodes = [] if c_root is None else _walk(c_root, path[:SIZE_CLASS_MAX_DEPTH])
    p_node = self.prompts.get(prompt_id)
    for code in path:
        if p_node is None:
            break
        children = p_node.children
        p_node = None if children is None else children.get(code)
    prompt_support = global_support = 0.0
    head: list[Node] = []  # the exact-path nodes, unshifted
    if p_node is not None:
        head.append(p_node)
        prompt_support = p_node.aged_support(version, half_life)
    c_exact = c_nodes.pop() if len(c_nodes) == depth + 1 else None
    if c_exact is not None:
        head.append(c_exact)
    if len(g_nodes) == depth + 1:
        g_exact = g_nodes.pop()
        head.append(g_exact)
        global_support = g_exact.aged_support(version, half_life)
    if depth and (m_node := self.markov.get((min(depth, MARKOV_MAX_DEPTH), path[-1]))) is not None:
        head.append(m_node)
        global_support = max(global_support, m_node.aged_support(version, half_life))
    # The chain: `head`, then, from the deepest up, the size-class and global ancestors, shifted by
    # the tokens processed since; only nodes with samples count, and the last of those takes the
    # mass left.
    chain = head
    shifts = [0] * len(head)
    now = consumed[depth]
    lc, lg = len(c_nodes), len(g_nodes)
    for j in range(max(lc, lg) - 1, -1, -1):
        shift = now - consumed[j]
        if j < lc:
            chain.append(c_nodes[j])
            shifts.append(shift)
        if j < lg:
            chain.append(g_nodes[j])
            shifts.append(shift)
    for last in reversed(chain):  # almost always the global root, at the end
        if last.samples:
            break
    else:
        return None
    support = prompt_support + global_support
    # `Estimate.mix` over the chain, with a node's means from its aged sums (as `Node.stats` has them)
    # and its statistics left to build until a decision needs them.
    pseudocount = self.backoff
    parts: list[tuple[float, Node, int, float]] = []
    left = 1.0
    mean = mean_gen = 0.0
    for node, shift in zip(chain, shifts, strict=True):
        if not node.samples:
            continue
        n_support = node.support
        if node is last:
            weight = left
        else:
            n = n_support * 2.0 ** (-(version - node.support_version) / half_life)
            weight = left * n / (n + pseudocount)
        left -= weight
        if weight > 1e-9:
            if n_support > 0:
                mr, mr_gen = node.sum_rem / n_support, node.sum_gen / n_support
            else:
                stats = node.stats(version, half_life)
                mr, mr_gen = stats.mean_remaining, stats.mean_remaining_gen
            shifted = mr - shift
            if not shifted > 0.0:  # max(0.0, mr - shift), NaN included
                shifted = 0.0
            scale = shifted / mr if mr > 0 else 0.0
            parts.append((weight, node, shift, scale))
            mean += weight * shifted
            mean_gen += weight * mr_gen * scale
        if left <= 1e-9 or node is last:
            break
    return NodeMix(parts, support, mean, mean_gen)


def _walk(root: Node, path: Sequence[int]) -> list[Node]:
    """`PrefixTree._walk` with `Node.child` inlined."""
    nodes = [root]
    node = root
    for code in path:
        children = node.children
        if children is None:
            break
        child = children.get(code)
        if child is None:
            break
        nodes.append(child)
        node = child
    return nodes


class SimCMLFQScheduler(CMLFQScheduler):
    """`CMLFQScheduler` with `on_tool_return` evaluated lazily and in one pass: the mean test from
    `mix_nodes` (no node statistics), the tail test from the CDF at the two bounds around the target
    (`Estimate.tail_bucket` evaluates every bound), then `Estimate.gen_by_bucket`'s sums with parts
    outer and bounds inner, each bound's sum still adding the parts in order, so every float,
    decision and counter is the base class's. The simulator is single-threaded, so the tracker's
    and the tree's locks are not taken."""

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        rid = request.request_id
        current = self.tracker.current(rid)
        counters, tree, cfg, bounds = self.counters, self.tree, self.cfg, self.bounds
        counters.decisions += 1
        progress = self._progress[rid]
        progress.codes.append(tree.code(tree.state_key(ret.tool, ret.payload_tokens, ret.status)))
        progress.consumed.append(ret.context_tokens - request.prompt_tokens)
        ctx = ret.context_tokens
        mix = mix_nodes(tree, request.prompt_id, progress.codes, progress.consumed, request.prompt_tokens)
        if mix is None or mix.support < cfg.min_support:
            counters.low_support += 1
            return None
        target = bucket_of(ctx + mix.mean_remaining, bounds)
        if target == current:
            return None
        nb = len(bounds)
        version, half_life = tree.version, tree.half_life
        mparts = mix.parts
        m = len(mparts)
        stats_of: list[NodeStats | None] = [None] * m  # built on first use, in chain order
        rest = [0.0] * (m + 1)  # rest[k]: mixture weight of parts k.. (an upper bound on their CDF terms)
        for k in range(m - 1, -1, -1):
            rest[k] = rest[k + 1] + mparts[k][0]
        q = cfg.tail_quantile - 1e-12

        def reaches(b: int) -> bool:
            """Whether the mixture CDF at bound b (`Estimate.cdf`: the parts' terms added in order)
            is >= q. Each term is in [0, w], so the sum is settled once the partial sum reaches q
            (adding a term >= 0 never decreases a float sum) or once the partial sum plus every
            remaining weight, with a 1e-12 margin far above the rounding of a few dozen additions of
            numbers <= 1, stays below q: the later parts, the widest and most often rebuilt nodes
            (the global root and its shallow children), then need no statistics."""
            tokens = bounds[b] - ctx
            if tokens < 0:
                return q <= 0.0
            total = 0.0
            for k in range(m):
                if total >= q:
                    return True
                if total + rest[k] + 1e-12 < q:
                    return False
                w, node, shift, _ = mparts[k]
                stats = stats_of[k]
                if stats is None:
                    stats = stats_of[k] = node.stats(version, half_life)
                idx = bisect_right(stats.values, tokens + shift)
                if idx:  # adding w * 0.0 would leave the sum as it is
                    total += w * (stats.cum_weights[idx - 1] / stats.total_weight)
            return total >= q

        # The tail bucket is the first whose bound's CDF reaches q. The CDF at the bounds is monotone,
        # float for float (cumulative weights ascend; `+`, `*` and `/` by the same positive numbers
        # keep the order), so the tail is the target iff the CDF reaches q at the target's bound and
        # not at the one below: two bounds instead of all, and most decisions end here.
        if (target > 0 and reaches(target - 1)) or (target < nb and not reaches(target)):
            counters.disagree += 1
            return None
        parts = []
        for k, (w, node, shift, scale) in enumerate(mparts):
            stats = stats_of[k]
            parts.append((w, node.stats(version, half_life) if stats is None else stats, shift, scale))
        # Generated-token mass below every bound: parts outer, bounds inner, but each bound's sum still
        # adds the parts in order, so every float is the one-bound-at-a-time (`gen_by_bucket`) value.
        tokens = [bound - ctx for bound in bounds]
        first = 0  # bounds below the context get 0.0
        while first < nb and tokens[first] < 0:
            first += 1
        below = [0.0] * nb
        for w, stats, shift, scale in parts:
            sample, cum_gen, total = stats.values, stats.cum_gen, stats.total_weight
            ws = w * scale
            idx = 0
            for b in range(first, nb):
                idx = bisect_right(sample, tokens[b] + shift, idx)  # bounds ascend: search from the last
                if idx:
                    below[b] += ws * (cum_gen[idx - 1] / total)
        below.append(mix.mean_remaining_gen)
        values = [max(0.0, hi - lo) for lo, hi in zip([0.0, *below[:-1]], below, strict=True)]
        if max(range(len(values)), key=values.__getitem__) != target:
            counters.disagree += 1
            return None
        saving = (values[target] - values[current]) * cfg.misplaced_decode_slowdown
        if saving <= ctx * cfg.prefill_decode_cost_ratio:
            counters.too_costly += 1
            return None
        counters.moves += 1
        self.tracker.place(rid, target)
        return Move(target)
