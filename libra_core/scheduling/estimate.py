"""The remaining-token estimate C-MLFQ decides with: a support-weighted mixture of tree nodes.

`NodeStats` is one node's aged sample (values sorted, cumulative weights), built once per node per
policy version. `Estimate` mixes the back-off chain of nodes (most specific first): a node with aged
support n takes the share n / (n + k) of the probability mass still unassigned and passes the rest
on; the last node takes what is left. Ancestor nodes describe an earlier point of the trajectory, so
their samples are shifted down by the tokens processed since (`shift`, clipped at zero).

The mixture is never materialised: the tail quantile is only needed to find its *bucket*, so the
mixture CDF is evaluated at the bucket bounds (a few bisections), which keeps a decision at
O(depth + buckets * log(samples)).
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
    total_weight: float
    mean_remaining: float
    mean_remaining_gen: float

    @staticmethod
    def build(
        rem: Sequence[int], gen: Sequence[int], ver: Sequence[int], version: int, half_life: float
    ) -> NodeStats:
        weights = [2.0 ** (-max(0, version - u) / half_life) for u in ver]
        order = sorted(range(len(rem)), key=rem.__getitem__)
        cum, acc = [], 0.0
        for i in order:
            acc += weights[i]
            cum.append(acc)
        total = acc if acc > 0 else 1.0
        mean = sum(w * r for w, r in zip(weights, rem, strict=True)) / total
        mean_gen = sum(w * g for w, g in zip(weights, gen, strict=True)) / total
        return NodeStats(version, [rem[i] for i in order], cum, total, mean, mean_gen)

    def cdf(self, tokens: float) -> float:
        """Aged share of samples with remaining <= tokens."""
        idx = bisect.bisect_right(self.values, tokens)
        return self.cum_weights[idx - 1] / self.total_weight if idx else 0.0


class Estimate:
    """Distribution of a request's remaining tokens, mixed from the back-off chain."""

    __slots__ = ("mean_remaining", "mean_remaining_gen", "parts", "support")

    def __init__(
        self, parts: list[tuple[float, NodeStats, int]], support: float, mean: float, mean_gen: float
    ) -> None:
        self.parts = parts  # (mixture weight, node stats, shift in tokens)
        self.support = support  # aged support of the exact-path nodes (prompt + global)
        self.mean_remaining = mean
        self.mean_remaining_gen = mean_gen

    @classmethod
    def mix(
        cls, chain: Sequence[tuple[float, NodeStats, int]], support: float, pseudocount: float
    ) -> Estimate:
        """`chain` is (aged support, stats, shift) from most to least specific; non-empty."""
        assert chain, "an estimate needs at least one node with samples"
        parts: list[tuple[float, NodeStats, int]] = []
        left = 1.0
        for i, (n, stats, shift) in enumerate(chain):
            weight = left if i == len(chain) - 1 else left * n / (n + pseudocount)
            left -= weight
            if weight > 1e-9:
                parts.append((weight, stats, shift))
            if left <= 1e-9:
                break
        mean = mean_gen = 0.0
        for weight, stats, shift in parts:
            shifted = max(0.0, stats.mean_remaining - shift)
            mean += weight * shifted
            if stats.mean_remaining > 0:
                # An ancestor's generated share is assumed to shrink with its total.
                mean_gen += weight * stats.mean_remaining_gen * shifted / stats.mean_remaining
        return cls(parts, support, mean, mean_gen)

    def cdf(self, tokens: float) -> float:
        """P(remaining <= tokens) under the mixture."""
        if tokens < 0:
            return 0.0
        return sum(w * stats.cdf(tokens + shift) for w, stats, shift in self.parts)

    def mean_bucket(self, bounds: Sequence[int], context_tokens: int) -> int:
        """Bucket of the expected final size: context so far + mean remaining."""
        return bucket_of(context_tokens + self.mean_remaining, bounds)

    def bucket_probability(self, bounds: Sequence[int], context_tokens: int, bucket: int) -> float:
        """P(final size falls in `bucket`) = P(remaining in (lower - context, upper - context)]."""
        upper = self.cdf(bounds[bucket] - context_tokens) if bucket < len(bounds) else 1.0
        lower = self.cdf(bounds[bucket - 1] - context_tokens) if bucket > 0 else 0.0
        return max(0.0, upper - lower)

    def tail_bucket(self, bounds: Sequence[int], context_tokens: int, quantile: float) -> int:
        """Bucket of context + the `quantile` of remaining: the first bucket whose bound covers at
        least that share of the mixture."""
        for b, bound in enumerate(bounds):
            if self.cdf(bound - context_tokens) >= quantile - 1e-12:
                return b
        return len(bounds)
