"""The C-MLFQ scheduler as the simulator uses it: `CMLFQScheduler`'s decisions, evaluated lazily.

`SimCMLFQScheduler` decides on the lazy mixture of sim/tree.py (`NodeMix`): the mean test weighs the
back-off chain only until the rest of it cannot move the mean across a bucket bound, the tail test
reads the mixture CDF at the two bounds around the target, and the gain test adds the parts one at a
time until the rest cannot change its outcome. Every decision and counter is the base class's
(`tests/sim` and `tests/scheduling/test_fast_paths.py` check it).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, reprefill_tokens
from libra_core.scheduling.cmlfq import CMLFQScheduler, _Progress, tie_floor
from libra_core.scheduling.estimate import NodeStats
from libra_core.scheduling.prefix_tree import PrefixTree
from libra_core.sim.tree import NodeMix, Paths, gen_and_scale, max_remaining_of, mix_nodes

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
    v_lo: list[float] = []  # `max(0.0, lo[b] - hi[b - 1])`, `max(0.0, hi[b] - lo[b - 1])`
    v_hi: list[float] = []
    lo_before = hi_before = 0.0
    for b, lo in enumerate([*below, mean_gen]):
        hi = lo + spread if b >= first else 0.0
        x, y = lo - hi_before, hi - lo_before
        v_lo.append(x if x > 0.0 else 0.0)  # `max(0.0, x)`, NaN included
        v_hi.append(y if y > 0.0 else 0.0)
        lo_before, hi_before = lo, hi
    best = v_lo[target]
    # `target` is a best bucket whatever the finals (`tie_floor` is increasing: the largest other
    # value it could be measured against is the largest other upper end).
    if best >= tie_floor(max(v for b, v in enumerate(v_hi) if b != target)):
        if (v_hi[target] - v_lo[current]) * slowdown <= threshold:
            return _TOO_COSTLY
        if (best - v_hi[current]) * slowdown > threshold:
            return _MOVE
        return None
    worst = v_hi[target]
    if any(tie_floor(v) > worst for b, v in enumerate(v_lo) if b != target):  # another beats it
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
        # (tool, payload tokens, status) -> the tree's state code, once the tree has one (codes are
        # stable per tree): `tree.code(tree.state_key(...))` without the two calls.
        self._codes: dict[tuple[str, int, str], int] = {}

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
        generated part is at most the whole) when no shift is negative (`monotone`: a shifted part,
        conditioned on its samples above the shift (`estimate.conditioned`), then has a mean and
        generated terms at most its largest sample's, and a generated-token scale at most 1),
        else inf."""
        return max_remaining_of(self.tree) * (1.0 + 1e-6) if monotone else math.inf

    def _gen_outcome(
        self,
        mix: NodeMix,
        stats_of: list[NodeStats],
        ctx: int,
        reprefill: int,
        target: int,
        current: int,
        ceiling: float,
    ) -> int:
        """The base class's last two tests, `target` a best bucket of `gen_by_bucket` (`tie_floor`;
        else `_DISAGREE`) and the saving against the re-prefill cost (`_TOO_COSTLY` or `_MOVE`),
        adding the parts one at a time and stopping once the parts still to come cannot change the
        outcome.

        `Estimate.gen_by_bucket`'s sums with parts outer and bounds inner, each bound's sum (and the
        generated-token mean, `NodeMix.estimate`) still adding the parts in order, so every float is
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
        threshold = reprefill * cfg.prefill_decode_cost_ratio
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
            part = picked[k]
            w, node, shift, _, _, _, cond = part
            mr_gen, scale = gen_and_scale(part, version, half_life)
            mean_gen += w * mr_gen * scale
            stats = stats_of[k] if k < len(stats_of) else node.stats(version, half_life)
            sample, cum_gen, total = stats.values, stats.cum_gen, stats.total_weight
            ws = w * scale
            idx = 0
            if cond is None:
                for b in range(first, nb):
                    idx = bisect_right(sample, tokens[b] + shift, idx)  # bounds ascend: from the last
                    if idx:
                        below[b] += ws * (cum_gen[idx - 1] / total)
            else:  # `Estimate.gen_below` of a conditioned part: above its base, over its mass
                base_g, mass = cond[4], cond[5]
                for b in range(first, nb):
                    idx = bisect_right(sample, tokens[b] + shift, idx)
                    if idx:
                        below[b] += ws * ((cum_gen[idx - 1] - base_g) / mass)
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
        if values[target] < tie_floor(max(values)):
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
        key = (ret.tool, ret.payload_tokens, ret.status)
        code = self._codes.get(key)
        if code is None:
            state = tree.state_key(*key)
            code = tree.code(state)
            if code >= 0:
                self._codes[key] = code
            progress.push(code, state)
        else:
            progress.codes.append(code)
        if progress.unknown:  # a resolved code extends the cached walks (`Paths`) from where they stopped
            progress.resolve(tree)
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
                w, node, shift, _, _, before, cond = picked[k]
                if total + before + 1e-12 < q:
                    return False
                if k < len(stats_of):
                    stats = stats_of[k]
                else:
                    stats = node.stats(version, half_life)
                    stats_of.append(stats)
                idx = bisect_right(stats.values, tokens + shift)
                if idx:  # adding w * 0.0 would leave the sum as it is
                    if cond is None:
                        total += w * (stats.cum_weights[idx - 1] / stats.total_weight)
                    else:  # a conditioned part (`Estimate.cdf`)
                        total += w * ((stats.cum_weights[idx - 1] - cond[3]) / cond[5])
                k += 1

        # The tail bucket is the first whose bound's CDF reaches q. The CDF at the bounds is monotone,
        # float for float (cumulative weights ascend; `+`, `*` and `/` by the same positive numbers
        # keep the order), so the tail is the target iff the CDF reaches q at the target's bound and
        # not at the one below: two bounds instead of all, and most decisions end here. The target's
        # bound goes first: most requests the mean would move up have a tail beyond it, and then the
        # bound below needs no look (`reaches` has no effect on results, only on what is cached).
        if (target < nb and not reaches(target)) or (target > 0 and reaches(target - 1)):
            counters.disagree += 1
            return None
        outcome = self._gen_outcome(mix, stats_of, ctx, reprefill_tokens(ret), target, current, ceiling)
        if outcome == _DISAGREE:
            counters.disagree += 1
            return None
        if outcome == _TOO_COSTLY:
            counters.too_costly += 1
            return None
        counters.moves += 1
        self.tracker.place(rid, target)
        return Move(target)
