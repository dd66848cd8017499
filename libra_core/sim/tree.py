"""The C-MLFQ prefix tree as the simulator uses it: the real `PrefixTree`, with a lazy lookup.

`PrefixTree.estimate` builds the aged statistics (`Node.stats`) of every node of the back-off chain
(prompt, size-class, global, Markov and every shifted ancestor: ~2 x depth + 4 nodes) before
`Estimate.mix` weighs them; but the mixture gives each node the share `n / (n + pseudocount)` of the
mass still unassigned and stops once less than 1e-9 is left, and a node's statistics' means are its
aged sums over its support. `NodeMix` walks the same chain in the same order and computes the same
weights, shifts and means from those sums, part by part and only as far as a decision needs:
`SimCMLFQScheduler`'s mean test stops once the rest of the chain cannot move the mean across a
bucket bound (most decisions end there: the request stays), and the tail test stops at the first
parts whenever the rest cannot change its outcome; part statistics (sorted sample, cumulative
weights) are built only for the parts a CDF reads, so the widest nodes (the global root and its
shallow children, rebuilt after nearly every insert) are rarely built. Each request's walks down the
tree are kept between its tool returns (`Paths`). Every estimate, decision and counter is the base
classes' (`tests/sim` and `tests/scheduling/test_fast_paths.py` check it). Inserts, aging, pruning
and persistence are the base class's.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler, _Progress
from libra_core.scheduling.estimate import Estimate, NodeStats
from libra_core.scheduling.prefix_tree import MARKOV_MAX_DEPTH, SIZE_CLASS_MAX_DEPTH, Node, PrefixTree

Part = tuple[float, Node, int, float, float, float]  # see `NodeMix.picked`
Ancestors = tuple[list[Node], int, list[Node], int]  # (c, lc, g, lg), see `_append_ancestors`


def _gen_and_scale(
    node: Node, mr: float, shifted: float, version: int, half_life: float
) -> tuple[float, float]:
    """A mixture part's mean remaining generated tokens and its scale (shifted / unshifted mean)."""
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
        self.pending = pending  # the ancestors still to append to `chain` (`_append_ancestors`)
        self.last = last  # the last chain node with samples: it takes the mass left
        self.consumed = consumed
        self.now = consumed[-1]
        self.support = support
        self.version, self.half_life, self.pseudocount = tree.version, tree.half_life, tree.backoff
        # (weight, node, shift, node's mean remaining, shifted mean, mass unassigned before it) of each
        # part so far (weight > 1e-9): the parts of `Estimate.mix`, in order, with node statistics
        # left to build (`Node.stats`) until a decision reads the CDF.
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
            if pos == len(chain):  # the head is weighed: the ancestors follow
                assert self.pending is not None
                _append_ancestors(chain, js, *self.pending)
                self.pending = None
            node = chain[pos]
            pos += 1
            if not node.samples:
                continue
            n_support = node.support
            if node is last:
                weight = left
            else:
                n = n_support * 2.0 ** (-(version - node.support_version) / half_life)
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
                j = js[pos - 1]
                shift = 0 if j < 0 else self.now - self.consumed[j]
                shifted = mr - shift
                if not shifted > 0.0:  # max(0.0, mr - shift), NaN included
                    shifted = 0.0
                self.picked.append((weight, node, shift, mr, shifted, before))
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

    def finish(self) -> tuple[list[tuple[float, Node, int, float]], float]:
        """`(parts, mean_remaining_gen)` after `run`: `Estimate.mix`'s `(weight, node, shift, scale)`
        parts and its generated-token mean, the same floats added in the same order."""
        assert self.done, "finish() needs the whole chain weighed (run())"
        version, half_life = self.version, self.half_life
        parts: list[tuple[float, Node, int, float]] = []
        mean_gen = 0.0
        for weight, node, shift, mr, shifted, _ in self.picked:
            mr_gen, scale = _gen_and_scale(node, mr, shifted, version, half_life)
            parts.append((weight, node, shift, scale))
            mean_gen += weight * mr_gen * scale
        return parts, mean_gen

    def estimate(self) -> Estimate:
        parts, mean_gen = self.run().finish()
        version, half_life = self.version, self.half_life
        stats = [(w, node.stats(version, half_life), shift, scale) for w, node, shift, scale in parts]
        return Estimate(stats, self.support, self.mean_remaining, mean_gen)


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
    if len(p) == depth + 1:
        p_node = p[-1]
        head.append(p_node)
        prompt_support = p_node.aged_support(version, half_life)
    if lc == depth + 1:
        head.append(c[-1])
        lc -= 1
    if lg == depth + 1:
        g_exact = g[-1]
        head.append(g_exact)
        global_support = g_exact.aged_support(version, half_life)
        lg -= 1
    if depth and (m_node := self.markov.get((min(depth, MARKOV_MAX_DEPTH), path[-1]))) is not None:
        head.append(m_node)
        global_support = max(global_support, m_node.aged_support(version, half_life))
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
    return NodeMix(chain, js, pending, last, consumed, prompt_support + global_support, self)


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


_DISAGREE, _TOO_COSTLY, _MOVE = range(3)  # outcomes of `SimCMLFQScheduler._gen_outcome`


def _settle(
    below: list[float],
    mean_gen: float,
    spread: float,
    first: int,
    target: int,
    current: int,
    slowdown: float,
    threshold: float,
) -> int | None:
    """The outcome of `_gen_outcome`'s tests if every final sum lies in [partial, partial + spread]
    (the bounds below the context stay 0.0), or None if those intervals do not settle it."""
    lo = [*below, mean_gen]
    hi = [0.0] * first + [x + spread for x in lo[first:]]
    v_lo = [max(0.0, lo[0] - 0.0)] + [max(0.0, lo[b] - hi[b - 1]) for b in range(1, len(lo))]
    v_hi = [max(0.0, hi[0] - 0.0)] + [max(0.0, hi[b] - lo[b - 1]) for b in range(1, len(lo))]
    best = v_lo[target]
    if all(best > v for b, v in enumerate(v_hi) if b != target):  # `target` is the argmax
        if (v_hi[target] - v_lo[current]) * slowdown <= threshold:
            return _TOO_COSTLY
        if (best - v_hi[current]) * slowdown > threshold:
            return _MOVE
        return None
    worst = v_hi[target]
    if any(v > worst for b, v in enumerate(v_lo) if b != target):  # another bucket beats it
        return _DISAGREE
    return None


class SimCMLFQScheduler(CMLFQScheduler):
    """`CMLFQScheduler` with `on_tool_return` evaluated lazily: the mean test weighs the chain only
    until the rest of it cannot move the mean across a bucket bound, the tail test evaluates the CDF
    at the two bounds around the target (`Estimate.tail_bucket` evaluates every bound) with the same
    kind of early exit, then `Estimate.gen_by_bucket`'s sums with parts outer and bounds inner, each
    bound's sum still adding the parts in order, so every float, decision and counter is the base
    class's. Each request's tree walks are kept between its tool returns (`Paths`). The simulator is
    single-threaded, so the tracker's and the tree's locks are not taken."""

    def __init__(self, cfg: SchedulerConfig, tree: PrefixTree | None = None) -> None:
        super().__init__(cfg, tree)
        self._paths: dict[str, Paths] = {}

    def admit(self, request: SchedRequest) -> int:
        """The base class's admission (the bucket of prompt + mean remaining at the root), with the
        mean weighed only as far as its bucket needs (`_target`; no shifts at the root)."""
        rid = request.request_id
        self._paths.pop(rid, None)
        mix = mix_nodes(self.tree, request.prompt_id, (), (0,), request.prompt_tokens)
        bucket = 0
        if mix is not None and mix.support >= self.cfg.min_support:
            bucket = self._target(mix, request.prompt_tokens, self._ceiling(True))
            self.counters.admissions_from_tree += 1
        self._progress[rid] = _Progress()
        return self.tracker.place(rid, bucket)

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self._paths.pop(trajectory.request_id, None)
        super().on_finish(trajectory)

    def _target(self, mix: NodeMix, ctx: int, ceiling: float) -> int:
        """`bucket_of(ctx + mean remaining, bounds)`, weighing the chain only as far as needed.

        Each term added to the mean is >= 0 (a positive weight times a mean clipped at 0), and a
        float sum of terms >= 0 never decreases, so the final mean is >= the partial one. Each later
        term is at most its weight times `ceiling` (see `_ceiling`) and the later weights add up to
        at most `left`; the margins (relative 1e-6 in `ceiling`, absolute 1e-9 in the mass and 1e-6
        tokens) are far above the rounding of the few hundred float operations involved. So once
        both ends of that interval fall in the same bucket, that is the bucket of the final mean,
        and the rest of the chain is not weighed."""
        bounds = self.bounds
        lo = bisect_left(bounds, ctx + mix.mean_remaining)
        while not mix.done:
            if bisect_left(bounds, ctx + (mix.mean_remaining + (mix.left + 1e-9) * ceiling + 1e-6)) == lo:
                return lo
            mix.step()
            lo = bisect_left(bounds, ctx + mix.mean_remaining)
        return lo

    def _ceiling(self, monotone: bool) -> float:
        """An upper bound on every part's shifted mean remaining tokens, its generated part and its
        sample's generated tokens, with a relative margin of 1e-6: `max_remaining` (a node's mean,
        the ratio of its aged sums, is a weighted mean of what its samples recorded, and a
        generated part is at most the whole) when no shift is negative (`monotone`: a shifted mean
        is then at most the mean, and a generated-token scale at most 1), else inf."""
        return max_remaining_of(self.tree) * (1.0 + 1e-6) if monotone else math.inf

    def _gen_outcome(
        self, mix: NodeMix, stats_of: list[NodeStats], ctx: int, target: int, current: int, ceiling: float
    ) -> int:
        """The base class's last two tests, `argmax(gen_by_bucket) == target` (else `_DISAGREE`) and
        the saving against the re-prefill cost (`_TOO_COSTLY` or `_MOVE`), adding the parts one at a
        time and stopping once the parts still to come cannot change the outcome.

        `Estimate.gen_by_bucket`'s sums with parts outer and bounds inner, each bound's sum (and the
        generated-token mean, `NodeMix.finish`) still adding the parts in order, so every float is
        the one-bound-at-a-time value. Each term is >= 0, so a partial sum is a lower bound of the
        final one (a float sum of terms >= 0 never decreases); the parts still to come weigh at most
        the mass unassigned before the next one, and each of their terms is at most its weight
        times `ceiling`, so partial + that mass x `ceiling` (+ 1e-9 mass and 1e-3 tokens of margin,
        far above the rounding) is an upper bound. The values and the saving are monotone in those
        sums (`max(0, hi - lo)`, then a product by a slowdown >= 0), so when their intervals settle
        the outcome it is the outcome of the final floats."""
        cfg, bounds = self.cfg, self.bounds
        nb = len(bounds)
        version, half_life = mix.version, mix.half_life
        picked = mix.picked
        slowdown = cfg.misplaced_decode_slowdown
        threshold = ctx * cfg.prefill_decode_cost_ratio
        if not slowdown >= 0.0:
            ceiling = math.inf  # the saving would not be monotone in the values: add every part
        tokens = [bound - ctx for bound in bounds]
        first = 0  # bounds below the context get 0.0
        while first < nb and tokens[first] < 0:
            first += 1
        below = [0.0] * nb
        mean_gen = 0.0
        k = 0
        while k < len(picked) or mix.step():
            w, node, shift, mr, shifted, _ = picked[k]
            mr_gen, scale = _gen_and_scale(node, mr, shifted, version, half_life)
            mean_gen += w * mr_gen * scale
            stats = stats_of[k] if k < len(stats_of) else node.stats(version, half_life)
            sample, cum_gen, total = stats.values, stats.cum_gen, stats.total_weight
            ws = w * scale
            idx = 0
            for b in range(first, nb):
                idx = bisect_right(sample, tokens[b] + shift, idx)  # bounds ascend: search from the last
                if idx:
                    below[b] += ws * (cum_gen[idx - 1] / total)
            k += 1
            if k < len(picked):
                mass = picked[k][5]
            elif not mix.done:
                mass = mix.left
            else:
                break  # every part is in
            spread = (mass + 1e-9) * ceiling + 1e-3
            if spread < math.inf:
                outcome = _settle(below, mean_gen, spread, first, target, current, slowdown, threshold)
                if outcome is not None:
                    return outcome
        below.append(mean_gen)
        values = [max(0.0, hi - lo) for lo, hi in zip([0.0, *below[:-1]], below, strict=True)]
        if max(range(len(values)), key=values.__getitem__) != target:
            return _DISAGREE
        saving = (values[target] - values[current]) * slowdown
        return _TOO_COSTLY if saving <= threshold else _MOVE

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        rid = request.request_id
        current = self.tracker.current(rid)
        counters, tree, cfg, bounds = self.counters, self.tree, self.cfg, self.bounds
        counters.decisions += 1
        progress = self._progress[rid]
        consumed = progress.consumed
        progress.codes.append(tree.code(tree.state_key(ret.tool, ret.payload_tokens, ret.status)))
        paths = self._paths.get(rid)
        if paths is None:
            paths = self._paths[rid] = Paths(tree.size_class(request.prompt_tokens))
        now = ret.context_tokens - request.prompt_tokens
        if now < consumed[-1]:
            paths.monotone = False
        consumed.append(now)
        ctx = ret.context_tokens
        mix = mix_nodes(tree, request.prompt_id, progress.codes, consumed, request.prompt_tokens, paths)
        if mix is None or mix.support < cfg.min_support:
            counters.low_support += 1
            return None
        ceiling = self._ceiling(paths.monotone)
        target = self._target(mix, ctx, ceiling)
        if target == current:
            return None
        nb = len(bounds)
        version, half_life = tree.version, tree.half_life
        picked = mix.picked
        stats_of: list[NodeStats] = []  # built on first use, in chain order
        q = cfg.tail_quantile - 1e-12

        def reaches(b: int) -> bool:
            """Whether the mixture CDF at bound b (`Estimate.cdf`: the parts' terms added in order)
            is >= q, weighing more of the chain only when needed. Each term is in [0, w], so the sum
            is settled once the partial sum reaches q (adding a term >= 0 never decreases a float
            sum) or once the partial sum plus the mass not yet assigned before the next part (which
            bounds the weights of every part from there), with a 1e-12 margin far above the
            rounding of a few dozen additions of numbers <= 1, stays below q: the later parts, the
            widest and most often rebuilt nodes (the global root and its shallow children), then
            need no statistics and often no weighing."""
            tokens = bounds[b] - ctx
            if tokens < 0:
                return q <= 0.0
            total = 0.0
            k = 0
            while True:
                if total >= q:
                    return True
                if k == len(picked) and not mix.step():
                    return total >= q
                w, node, shift, _, _, before = picked[k]
                if total + before + 1e-12 < q:
                    return False
                if k < len(stats_of):
                    stats = stats_of[k]
                else:
                    stats = node.stats(version, half_life)
                    stats_of.append(stats)
                idx = bisect_right(stats.values, tokens + shift)
                if idx:  # adding w * 0.0 would leave the sum as it is
                    total += w * (stats.cum_weights[idx - 1] / stats.total_weight)
                k += 1

        # The tail bucket is the first whose bound's CDF reaches q. The CDF at the bounds is monotone,
        # float for float (cumulative weights ascend; `+`, `*` and `/` by the same positive numbers
        # keep the order), so the tail is the target iff the CDF reaches q at the target's bound and
        # not at the one below: two bounds instead of all, and most decisions end here.
        if (target > 0 and reaches(target - 1)) or (target < nb and not reaches(target)):
            counters.disagree += 1
            return None
        outcome = self._gen_outcome(mix, stats_of, ctx, target, current, ceiling)
        if outcome == _DISAGREE:
            counters.disagree += 1
            return None
        if outcome == _TOO_COSTLY:
            counters.too_costly += 1
            return None
        counters.moves += 1
        self.tracker.place(rid, target)
        return Move(target)
