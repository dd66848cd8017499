"""The C-MLFQ prefix tree as the simulator uses it: the real `PrefixTree`, with a lazy lookup.

`PrefixTree.estimate` builds the aged statistics (`Node.stats`) of every node of the back-off chain
(prompt, size-class, global, Markov and every shifted ancestor: ~2 x depth + 4 nodes) before
`Estimate.mix` weighs them; but the mixture gives each node the share `n / (n + pseudocount)` of the
mass still unassigned and stops once less than 1e-9 is left, so on a deep path with well supported
nodes only the first few nodes ever carry weight. `SimPrefixTree.estimate` walks the same chain in
the same order and builds a node's statistics only when it receives weight, so it returns the same
`Estimate` (same parts, weights, shifts, means: `tests/sim` checks it against the base class) at a
fraction of the cost. Inserts, aging, pruning and persistence are the base class's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from libra_core.scheduling.base import Move, SchedRequest, ToolReturn, bucket_of
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.estimate import Estimate, NodeStats
from libra_core.scheduling.prefix_tree import MARKOV_MAX_DEPTH, SIZE_CLASS_MAX_DEPTH, Node, PrefixTree


class SimPrefixTree(PrefixTree):
    def estimate(
        self,
        prompt_id: str,
        path: Sequence[int],
        consumed: Sequence[int],
        *,
        prompt_tokens: int | None = None,
    ) -> Estimate | None:
        depth = len(path)
        assert len(consumed) == depth + 1, f"consumed has {len(consumed)} entries for depth {depth}"
        size_class = self.size_class(prompt_tokens)
        version, half_life = self.version, self.half_life
        g_nodes = self._walk(self.global_root, path)
        c_root = None if size_class is None else self.size_classes.get(size_class)
        c_nodes = [] if c_root is None else self._walk(c_root, path[:SIZE_CLASS_MAX_DEPTH])
        p_node = self.prompts.get(prompt_id)
        for code in path:
            if p_node is None:
                break
            p_node = p_node.child(code)
        sources: list[tuple[Node, int]] = []
        prompt_support = global_support = 0.0
        if p_node is not None:
            sources.append((p_node, 0))
            prompt_support = p_node.aged_support(version, half_life)
        if len(c_nodes) == depth + 1:
            sources.append((c_nodes.pop(), 0))
        if len(g_nodes) == depth + 1:
            g_exact = g_nodes.pop()
            sources.append((g_exact, 0))
            global_support = g_exact.aged_support(version, half_life)
        if depth and (m_node := self.markov.get((min(depth, MARKOV_MAX_DEPTH), path[-1]))) is not None:
            sources.append((m_node, 0))
            global_support = max(global_support, m_node.aged_support(version, half_life))
        now = consumed[depth]
        for j in range(max(len(c_nodes), len(g_nodes)) - 1, -1, -1):
            if j < len(c_nodes):
                sources.append((c_nodes[j], now - consumed[j]))
            if j < len(g_nodes):
                sources.append((g_nodes[j], now - consumed[j]))
        chain = [(node, shift) for node, shift in sources if node.samples]
        if not chain:
            return None
        return _lazy_mix(chain, prompt_support + global_support, self.backoff, version, half_life)


def _lazy_mix(
    chain: list[tuple[Node, int]], support: float, pseudocount: float, version: int, half_life: float
) -> Estimate:
    """`Estimate.mix` over `(node, shift)`, building a node's statistics only if it gets weight."""
    parts: list[tuple[float, NodeStats, int, float]] = []
    left = 1.0
    mean = mean_gen = 0.0
    last = len(chain) - 1
    for i, (node, shift) in enumerate(chain):
        if i == last:
            weight = left
        else:
            n = node.aged_support(version, half_life)
            weight = left * n / (n + pseudocount)
        left -= weight
        if weight > 1e-9:
            stats = node.stats(version, half_life)
            shifted = max(0.0, stats.mean_remaining - shift)
            scale = shifted / stats.mean_remaining if stats.mean_remaining > 0 else 0.0
            parts.append((weight, stats, shift, scale))
            mean += weight * shifted
            mean_gen += weight * stats.mean_remaining_gen * scale
        if left <= 1e-9:
            break
    return Estimate(parts, support, mean, mean_gen)


class SimCMLFQScheduler(CMLFQScheduler):
    """`CMLFQScheduler` with `on_tool_return` evaluated in one pass: `Estimate.gen_by_bucket` and
    `Estimate.tail_bucket` each evaluate the mixture's CDF at every bucket bound (a generator and
    two method calls per part and bound); here one loop over bounds and parts computes both sums in
    the same order, so every float, decision and counter is the base class's (tests/sim checks it).
    The simulator is single-threaded, so the tracker's lock is not taken."""

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        rid = request.request_id
        current = self.tracker.current(rid)
        counters, tree, cfg, bounds = self.counters, self.tree, self.cfg, self.bounds
        counters.decisions += 1
        progress = self._progress[rid]
        progress.codes.append(tree.code(tree.state_key(ret.tool, ret.payload_tokens, ret.status)))
        progress.consumed.append(ret.context_tokens - request.prompt_tokens)
        ctx = ret.context_tokens
        est = tree.estimate(
            request.prompt_id,
            tuple(progress.codes),
            tuple(progress.consumed),
            prompt_tokens=request.prompt_tokens,
        )
        if est is None or est.support < cfg.min_support:
            counters.low_support += 1
            return None
        target = bucket_of(ctx + est.mean_remaining, bounds)
        if target == current:
            return None
        parts = est.parts
        tail = len(bounds)
        q = cfg.tail_quantile - 1e-12
        below: list[float] = []
        for b, bound in enumerate(bounds):
            tokens = bound - ctx
            if tokens < 0:
                below.append(0.0)
                if tail == len(bounds) and q <= 0.0:
                    tail = b
                continue
            cdf: float = 0
            gen: float = 0
            for w, stats, shift, scale in parts:
                idx = bisect_right(stats.values, tokens + shift)
                cdf += w * (stats.cum_weights[idx - 1] / stats.total_weight if idx else 0.0)
                gen += w * scale * (stats.cum_gen[idx - 1] / stats.total_weight if idx else 0.0)
            below.append(gen)
            if tail == len(bounds) and cdf >= q:
                tail = b
        below.append(est.mean_remaining_gen)
        values = [max(0.0, hi - lo) for lo, hi in zip([0.0, *below[:-1]], below, strict=True)]
        if tail != target or max(range(len(values)), key=values.__getitem__) != target:
            counters.disagree += 1
            return None
        saving = (values[target] - values[current]) * cfg.misplaced_decode_slowdown
        if saving <= ctx * cfg.prefill_decode_cost_ratio:
            counters.too_costly += 1
            return None
        counters.moves += 1
        self.tracker.place(rid, target)
        return Move(target)
