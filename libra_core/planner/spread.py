"""How much one iteration's stage times vary, so the planner can plan for the expected iteration.

A plan that balances T_rollout and T_train on the mean workload has no slack: with staleness >= 1
every iteration whose rollout or update runs long sets the period, so the mean iteration is
`E[max(R + T_sync, T)]`, not `max(E[R] + T_sync, E[T])` (search.py's module docstring). One iteration
is `prompts_per_iteration` GRPO groups drawn from the prompt pool; the spread of its times follows
from the spread between groups, which one iteration's sample already shows:

- the update's time grows with the tokens it trains on: relative std of an iteration's total tokens
  = std(group totals) / mean(group totals) / sqrt(groups per iteration);
- the rollout waits for its slowest trajectory (the long tail bounds it): a seeded bootstrap of the
  slowest trajectory's path over resampled groups, each path priced at one sequence's decode step
  and prefill rate on the largest TP degree plus its tool time (the tail runs nearly alone).

Both are coefficients of variation, applied to every candidate's predicted times. `expected_max` is
the mean of the larger of two independent normal variables (Clark, 1961). A heterogeneous layout
sizes each of its instance groups to finish at the same planned time, so its rollout ends with the
slowest of k groups: `balanced_groups_factor` prices that, and a single TP degree (one group) does
not pay it. A workload without group indices (a preset or trace whose groups are unknown) has no
spread: the planner then plans for the mean, as before.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.workload import Workload

BOOTSTRAP_DRAWS = 256


@dataclass(frozen=True)
class Spread:
    """Relative standard deviations of one iteration's rollout and update times."""

    rollout_cv: float = 0.0
    train_cv: float = 0.0


def expected_max(a: float, sa: float, b: float, sb: float) -> float:
    """E[max(X, Y)] for independent X ~ N(a, sa^2), Y ~ N(b, sb^2); max(a, b) without spread."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    theta = math.hypot(sa, sb)
    if theta <= 1e-12 * max(abs(a), abs(b), 1.0):
        return max(a, b)
    alpha = (a - b) / theta
    cdf = 0.5 * (1.0 + math.erf(alpha / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    return a * cdf + b * (1.0 - cdf) + theta * pdf


@functools.lru_cache(maxsize=64)
def expected_max_standard_normal(k: int) -> float:
    """E[max of k independent N(0, 1)] (0 for k = 1; 0.564 for 2; 0.846 for 3)."""
    if k <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 4001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    return float(np.sum(x * k * pdf * cdf ** (k - 1)) * (x[1] - x[0]))


def balanced_groups_factor(buckets: int, spread: Spread | None) -> float:
    """Expected rollout makespan over the planned one when `buckets` instance groups are each sized
    to finish at the same planned time: the rollout ends with the slowest of them, so with each
    group's time varying by `rollout_cv` the expected end is `T (1 + cv E[max of k N(0, 1)])`.
    One group (a single TP degree) keeps T."""
    if spread is None or buckets <= 1:
        return 1.0
    return 1.0 + spread.rollout_cv * expected_max_standard_normal(buckets)


def estimate_spread(w: Workload, cost: RolloutCostModel, tps: tuple[int, ...], seed: int = 0) -> Spread:
    """The spread of one iteration of `w` (needs `w.group_index`; none without it)."""
    if w.group_index is None:
        return Spread()
    _, groups = np.unique(w.group_index, return_inverse=True)
    num_groups = int(groups.max()) + 1
    per_iter = w.prompts_per_iteration
    if num_groups < 2 or per_iter < 1:
        return Spread()
    tokens = np.bincount(groups, weights=w.total_tokens, minlength=num_groups)
    train_cv = float(tokens.std(ddof=1) / tokens.mean() / math.sqrt(per_iter)) if tokens.mean() > 0 else 0.0
    usable = [t for t in tps if cost.model.supports_tp(t)]
    if not usable:
        return Spread(0.0, train_cv)
    tp = max(usable)
    ctx = float(np.mean(w.prompt_tokens + (w.gen_tokens + w.payload_tokens) / 2))
    step = float(cost.decode_step_s(tp, 1.0, ctx))
    prefill = float(cost.prefill_s_per_token(tp, ctx))
    path = step * w.gen_tokens + prefill * w.prefill_tokens + w.tool_latency_s
    slowest = np.full(num_groups, -np.inf)
    np.maximum.at(slowest, groups, path)
    rng = np.random.default_rng(seed)
    draws = slowest[rng.integers(0, num_groups, size=(BOOTSTRAP_DRAWS, per_iter))].max(axis=1)
    rollout_cv = float(draws.std() / draws.mean()) if draws.mean() > 0 else 0.0
    return Spread(rollout_cv, train_cv)
