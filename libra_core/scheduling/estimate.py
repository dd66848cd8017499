"""The remaining-token estimate C-MLFQ decides with: a support-weighted mixture of tree nodes.

`NodeStats` is one node's aged sample (values sorted, cumulative weights), built once per node per
policy version. `Estimate` mixes the back-off chain of nodes (most specific first): a node with aged
support n takes the share n / (n + k) of the probability mass still unassigned and passes the rest
on; the last node takes what is left. Ancestor nodes describe an earlier point of the trajectory, so
their samples are shifted down by the tokens processed since (`shift`) and conditioned on the
request still running: of an ancestor's samples only those with more than `shift` remaining can be
this request's (`conditioned`), and only those count in its support (`evidence_share`). Until
2026-12-07 every sample counted, clipped at 0 and with a mean of `max(0, mean - shift)`: an ancestor
whose samples were 100 and 1,000 remaining tokens, met 500 tokens later, said 50 tokens remained
where 500 do, and put mass at 0 in its CDF.

The mixture is never materialised: the tail quantile is only needed to find its *bucket*, so the
mixture CDF is evaluated at the bucket bounds (a few bisections), which keeps a decision at O(depth
+ buckets * log(samples)).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from libra_core.scheduling.base import bucket_of


@dataclass(frozen=True, slots=True)
class NodeStats:
    version: int  # tree version the weights were computed for
    values: list[int]  # remaining tokens, ascending
    cum_weights: list[float]  # cumulative aged weight in `values` order
    cum_gen: list[float]  # cumulative aged weight x remaining generated tokens, in `values` order
    cum_rem: list[float]  # cumulative aged weight x remaining tokens, in `values` order
    total_weight: float
    mean_remaining: float
    mean_remaining_gen: float

    @staticmethod
    def build(
        rem: Sequence[int],
        gen: Sequence[int],
        ver: Sequence[int],
        version: int,
        half_life: float,
        *,
        means: tuple[float, float] | None = None,
    ) -> NodeStats:
        """Aged statistics of a sample; `means` (remaining, generated) replaces the sample's means
        when the node keeps exact aged sums over everything it has seen."""
        weights = [2.0 ** (-max(0, version - u) / half_life) for u in ver]
        order = sorted(range(len(rem)), key=rem.__getitem__)
        cum: list[float] = []
        cum_gen: list[float] = []
        cum_rem: list[float] = []
        acc = acc_gen = acc_rem = 0.0
        for i in order:
            acc += weights[i]
            acc_gen += weights[i] * gen[i]
            acc_rem += weights[i] * rem[i]
            cum.append(acc)
            cum_gen.append(acc_gen)
            cum_rem.append(acc_rem)
        total = acc if acc > 0 else 1.0
        if means is None:
            means = (sum(w * r for w, r in zip(weights, rem, strict=True)) / total, acc_gen / total)
        return NodeStats(version, [rem[i] for i in order], cum, cum_gen, cum_rem, total, *means)

    def gen_below(self, tokens: float) -> float:
        """Aged mean of `remaining generated tokens x [remaining <= tokens]`."""
        idx = bisect.bisect_right(self.values, tokens)
        return self.cum_gen[idx - 1] / self.total_weight if idx else 0.0


def evidence_share(stats: NodeStats, shift: int) -> float:
    """The share of a back-off node's aged sample that can be the request asking: those with more
    than `shift` remaining for an ancestor met `shift` tokens ago (the request is still running),
    all of them for `shift <= 0`. It scales the node's support where the mixture weighs it."""
    if shift <= 0:
        return 1.0
    idx = bisect.bisect_right(stats.values, shift)
    if idx == len(stats.values):
        return 0.0
    cum = stats.cum_weights
    mass = cum[-1] - (cum[idx - 1] if idx else 0.0)
    return mass / cum[-1] if mass > 0.0 else 0.0


# (shifted mean, generated-token scale, mean remaining generated, CDF base weight, base generated
# sum, mass above the base): one back-off part as `conditioned` describes it.
Conditioned = tuple[float, float, float, float, float, float]


def conditioned(stats: NodeStats, shift: int, mean: float, mean_gen: float) -> Conditioned:
    """One back-off part of the mixture. For `shift > 0` (an ancestor met `shift` tokens ago) only
    its samples with more than `shift` remaining can be this still-running request's: the part is
    `remaining - shift` given `remaining > shift`, with mean `E[remaining | > shift] - shift`, the
    generated part (mean over those samples) scaled as the remaining shrinks, and the CDF
    `P(remaining - shift <= t | remaining > shift) = (C(t + shift) - base) / mass` (C: cumulative
    aged weight; base and mass: the weight at and above `shift`). When no sample exceeds `shift` the
    part says nothing remains. For `shift <= 0` (the exact-path nodes; a request whose context
    shrank) nothing is conditioned: `mean` and `mean_gen` (the node's exact aged sums) shifted up,
    base 0 and the whole sample's weight, the floats of the unconditioned mixture."""
    if shift <= 0:
        shifted = max(0.0, mean - shift)
        scale = shifted / mean if mean > 0 else 0.0
        return shifted, scale, mean_gen, 0.0, 0.0, stats.total_weight
    values, cum, cum_gen, cum_rem = stats.values, stats.cum_weights, stats.cum_gen, stats.cum_rem
    idx = bisect.bisect_right(values, shift)  # O(log samples): a decision's cost stays as it was
    if idx == len(values):
        return 0.0, 0.0, 0.0, 0.0, 0.0, stats.total_weight
    base_w = cum[idx - 1] if idx else 0.0
    base_g = cum_gen[idx - 1] if idx else 0.0
    mass = cum[-1] - base_w
    if not mass > 0.0:  # weights of 0 (an aging underflow): nothing to condition on
        return 0.0, 0.0, 0.0, 0.0, 0.0, stats.total_weight
    above = (cum_rem[-1] - (cum_rem[idx - 1] if idx else 0.0)) / mass
    shifted = max(0.0, above - shift)
    scale = shifted / above if above > 0 else 0.0
    return shifted, scale, (cum_gen[-1] - base_g) / mass, base_w, base_g, mass


class SampleWeights(dict[int, float]):
    """Sample weights `policy version u -> 2 ** (-max(0, version - u) / half_life)` at one (tree
    version, half-life), each computed on its first look-up (`__missing__`)."""

    def __init__(self, version: int, half_life: float) -> None:
        super().__init__()
        self.version, self.half_life = version, half_life

    def __missing__(self, u: int) -> float:
        w = self[u] = 2.0 ** (-max(0, self.version - u) / self.half_life)
        return w


_SAMPLE_WEIGHTS: dict[tuple[int, float], SampleWeights] = {}


def sample_weights(version: int, half_life: float) -> SampleWeights:
    """The shared `SampleWeights` of (tree version, half-life), for `Node.stats` (prefix_tree.py):
    entries are pure functions of the key, so sharing is safe."""
    key = (version, half_life)
    found = _SAMPLE_WEIGHTS.get(key)
    if found is None:
        if len(_SAMPLE_WEIGHTS) >= 64:
            _SAMPLE_WEIGHTS.clear()
        found = _SAMPLE_WEIGHTS[key] = SampleWeights(version, half_life)
    return found


Part = tuple[float, NodeStats, int, float, float, float, float]


class Estimate:
    """Distribution of a request's remaining tokens, mixed from the back-off chain."""

    __slots__ = ("mean_remaining", "mean_remaining_gen", "parts", "support")

    def __init__(self, parts: list[Part], support: float, mean: float, mean_gen: float) -> None:
        # (mixture weight, node stats, shift in tokens, generated-token scale, CDF base weight,
        # base generated sum, mass above the base): see `conditioned`
        self.parts = parts
        self.support = support  # aged support of the nodes that saw this depth and last state
        self.mean_remaining = mean
        self.mean_remaining_gen = mean_gen

    @classmethod
    def mix(
        cls, chain: Sequence[tuple[float, NodeStats, int]], support: float, pseudocount: float
    ) -> Estimate:
        """`chain` is (aged support, stats, shift) from most to least specific; non-empty."""
        assert chain, "an estimate needs at least one node with samples"
        parts: list[Part] = []
        left = 1.0
        mean = mean_gen = 0.0
        for i, (n, stats, shift) in enumerate(chain):
            if i == len(chain) - 1:
                weight = left
            else:  # an ancestor counts only the samples that outlast its shift (`evidence_share`)
                n = n * evidence_share(stats, shift) if shift > 0 else n
                weight = left * n / (n + pseudocount)
            left -= weight
            if weight > 1e-9:
                shifted, scale, gen, base_w, base_g, mass = conditioned(
                    stats, shift, stats.mean_remaining, stats.mean_remaining_gen
                )
                parts.append((weight, stats, shift, scale, base_w, base_g, mass))
                mean += weight * shifted
                mean_gen += weight * gen * scale
            if left <= 1e-9:
                break
        return cls(parts, support, mean, mean_gen)

    def cdf(self, tokens: float) -> float:
        """P(remaining <= tokens) under the mixture."""
        if tokens < 0:
            return 0.0
        total = 0.0
        for w, stats, shift, _, base_w, _, mass in self.parts:
            idx = bisect.bisect_right(stats.values, tokens + shift)
            if idx:
                total += w * ((stats.cum_weights[idx - 1] - base_w) / mass)
        return total

    def gen_below(self, tokens: float) -> float:
        """E[remaining generated tokens x (remaining <= tokens)] under the mixture."""
        if tokens < 0:
            return 0.0
        total = 0.0
        for w, stats, shift, scale, _, base_g, mass in self.parts:
            idx = bisect.bisect_right(stats.values, tokens + shift)
            if idx:
                total += w * scale * ((stats.cum_gen[idx - 1] - base_g) / mass)
        return total

    def mean_bucket(self, bounds: Sequence[int], context_tokens: int) -> int:
        """Bucket of the expected final size: context so far + mean remaining."""
        return bucket_of(context_tokens + self.mean_remaining, bounds)

    def gen_by_bucket(self, bounds: Sequence[int], context_tokens: int) -> list[float]:
        """For every bucket b, E[remaining generated tokens x (final size in b)]: the generated tokens
        that would be decoded in their right bucket if the rest of the request ran in b. O(buckets x
        parts x log samples)."""
        below = [self.gen_below(bound - context_tokens) for bound in bounds]
        below.append(self.mean_remaining_gen)
        return [max(0.0, hi - lo) for lo, hi in zip([0.0, *below[:-1]], below, strict=True)]

    def tail_bucket(self, bounds: Sequence[int], context_tokens: int, quantile: float) -> int:
        """Bucket of context + the `quantile` of remaining: the first bucket whose bound covers at
        least that share of the mixture."""
        for b, bound in enumerate(bounds):
            if self.cdf(bound - context_tokens) >= quantile - 1e-12:
                return b
        return len(bounds)
