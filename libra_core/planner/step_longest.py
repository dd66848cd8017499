"""The longest sequence of each optimizer step: the least work of the DP rank that holds it.

A DP rank trains whole sequences, so its share of an optimizer step is the step's FLOPs / DP but at
least the FLOPs of the longest sequence it holds (train_cost.estimate_train). An iteration's trained
sequences are dealt at random into `minibatches` steps of `g` sequences each, and only one step
holds the iteration's longest: the others' longest are shorter. Flooring every step at the
iteration's longest over-priced the update by up to the ratio of that longest to the steps' mean
longest, wherever the floor decided (many DP ranks, few sequences per step: until 2026-12-07).

`StepLongest` is the distribution of one step's longest sequence. The sample's lengths
`s_1 <= ... <= s_n` stand for a pool of `N` sampled sequences (each sample for `N / n` of them; at
least the sample itself), of which the update trains a random share; a step trains `g` of them,
which is `g` drawn from the pool without replacement, so its longest is at most `s_i` with
probability `C(N i / n, g) / C(N, g)`. (A first version took the trained count as the pool, which
weighs the longest lengths too much when the update trains only a share.) One sequence of length
`s` costs `a s + b s^2` FLOPs (dense and attention terms), so a step's expected floored share
`E[max(c, a S + b S^2)]` is one bisection over suffix sums, cheap enough for every layout the
planner prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class StepLongest:
    """P(a step's longest sequence is `lens[i]`) = `prob[i]`, `lens` ascending; built by `of`."""

    lens: np.ndarray
    prob: np.ndarray
    below: np.ndarray  # below[i] = sum(prob[:i]): P(the step's longest is shorter than lens[i])
    tail_s: np.ndarray  # tail_s[i] = sum(prob[i:] * lens[i:]); one entry past the end (0)
    tail_s2: np.ndarray  # the same with lens squared

    @classmethod
    def of(cls, lengths: np.ndarray, pool: float, per_step: float) -> StepLongest:
        """The longest of a step's `per_step` sequences, drawn without replacement from a pool of
        `pool` sequences (at least the sample) whose lengths the sample `lengths` stands for."""
        lens = np.sort(np.asarray(lengths, dtype=float))
        n = len(lens)
        assert n > 0, "no sequence lengths"
        total = max(float(pool), float(n))
        g = min(total, max(1.0, float(per_step)))
        # P(step's longest <= lens[i]) = C(N_i, g) / C(N, g), N_i = N (i+1) / n sequences at most lens[i]
        log_all = _log_choose(total, g)
        cdf = np.array(
            [
                math.exp(_log_choose(total * (i + 1) / n, g) - log_all) if total * (i + 1) / n >= g else 0.0
                for i in range(n)
            ]
        )
        cdf[-1] = 1.0
        prob = np.diff(cdf, prepend=0.0)
        below = np.concatenate(([0.0], cdf[:-1]))
        tail_s = np.concatenate((np.cumsum((prob * lens)[::-1])[::-1], [0.0]))
        tail_s2 = np.concatenate((np.cumsum((prob * lens * lens)[::-1])[::-1], [0.0]))
        return cls(lens, prob, below, tail_s, tail_s2)

    def expected_floored(self, share_flops: float, a: float, b: float) -> float:
        """`E[max(share_flops, a S + b S^2)]` for `S` a step's longest sequence: a DP rank's expected
        work in one step when an even share is `share_flops`."""
        c = max(0.0, share_flops)
        # the length whose own work equals the even share: a s + b s^2 = c
        s_star = (-a + math.sqrt(a * a + 4.0 * b * c)) / (2.0 * b) if b > 0 else c / a if a > 0 else math.inf
        i = int(np.searchsorted(self.lens, s_star, side="right"))  # lens[i:] do more than the share
        p_below = float(self.below[i]) if i < len(self.lens) else 1.0
        return c * p_below + a * float(self.tail_s[i]) + b * float(self.tail_s2[i])


def _log_choose(n: float, k: float) -> float:
    return math.lgamma(n + 1.0) - math.lgamma(k + 1.0) - math.lgamma(n - k + 1.0)
