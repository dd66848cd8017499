"""Request-to-instance assignment: a dynamic program over length-sorted requests.

Trajectories are sorted by length and cut into K bins. A plan covers the bins with contiguous
ranges; each range [i, j) is served by a *group* of n identical instances of TP degree t (the
range's requests are spread evenly over them). A `SegmentTable` gives, for every (t, i, j), the
instance-seconds of work W (throughput-bound) and the critical path C (the slowest trajectory's
latency); the group's time is `max(C, W / n)`, so the fewest instances that meet a makespan T are
`n = ceil(W / T)` when `C <= T` (none otherwise).

`min_gpus(T)`: DP `f[j] = min_{i<j, t} f[i] + t * ceil(W[t,i,j] / T)` over ranges with C <= T,
exact for "fewest GPUs with makespan <= T" in O(K^2 |T|). The makespan-optimal assignment under a
budget G is the smallest T with `min_gpus(T) <= G`; min_gpus is non-increasing in T, so `solve`
bisects on T (relative tolerance `rel_tol`) and `frontier` evaluates a whole grid of T at once
(vectorised) to price every GPU split of the search. `brute_force` enumerates every contiguous
partition and (t, n) choice, for tests.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

_EPS = 1e-12


@dataclass(frozen=True)
class SegmentTable:
    tps: tuple[int, ...]
    work_s: np.ndarray  # (len(tps), K+1, K+1); [t, i, j] for bins i..j-1, i < j
    crit_s: np.ndarray  # same shape; inf where TP t cannot serve the range
    bin_edges: np.ndarray  # (K+1,) sample indices of the bin boundaries (sorted order)
    bin_max_len: np.ndarray  # (K,) longest trajectory (tokens) in each bin

    @property
    def num_bins(self) -> int:
        return self.work_s.shape[1] - 1


@dataclass(frozen=True)
class Group:
    tp: int
    instances: int
    start_bin: int
    end_bin: int  # exclusive
    time_s: float


@dataclass(frozen=True)
class Assignment:
    makespan_s: float
    gpus: int
    groups: tuple[Group, ...]

    def instance_tps(self) -> dict[int, int]:
        """Instances per TP degree (the multiset of the plan)."""
        out: dict[int, int] = {}
        for g in self.groups:
            out[g.tp] = out.get(g.tp, 0) + g.instances
        return dict(sorted(out.items()))


def _instances(work: np.ndarray, target_s: np.ndarray | float) -> np.ndarray:
    return np.maximum(1.0, np.ceil(work / target_s * (1 - _EPS)))


def min_gpus(table: SegmentTable, target_s: float) -> tuple[float, tuple[Group, ...]]:
    """Fewest GPUs meeting makespan `target_s`, and the groups (inf, () if impossible)."""
    k = table.num_bins
    f = np.full(k + 1, np.inf)
    f[0] = 0.0
    choice: list[tuple[int, int, int]] = [(-1, -1, 0)] * (k + 1)
    for j in range(1, k + 1):
        for ti, tp in enumerate(table.tps):
            w, c = table.work_s[ti, :j, j], table.crit_s[ti, :j, j]
            n = _instances(w, target_s)
            cost = np.where(c <= target_s, f[:j] + tp * n, np.inf)
            i = int(np.argmin(cost))
            if cost[i] < f[j]:
                f[j] = cost[i]
                choice[j] = (i, ti, int(n[i]))
    if not math.isfinite(f[k]):
        return math.inf, ()
    groups = []
    j = k
    while j > 0:
        i, ti, count = choice[j]
        t = float(max(table.crit_s[ti, i, j], table.work_s[ti, i, j] / count))
        groups.append(Group(table.tps[ti], count, i, j, t))
        j = i
    return float(f[k]), tuple(reversed(groups))


def solve(table: SegmentTable, gpu_budget: int, rel_tol: float = 1e-4) -> Assignment | None:
    """Makespan-optimal assignment within `gpu_budget` GPUs (None if nothing fits)."""
    k = table.num_bins
    # Upper bracket: the whole range on the largest group any single TP can form.
    hi = math.inf
    for ti, tp in enumerate(table.tps):
        n = gpu_budget // tp
        if n >= 1 and math.isfinite(table.crit_s[ti, 0, k]):
            hi = min(hi, max(float(table.crit_s[ti, 0, k]), float(table.work_s[ti, 0, k]) / n))
    if not math.isfinite(hi):
        return None
    lo = hi * 1e-6
    best = min_gpus(table, hi)
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        gpus, groups = min_gpus(table, mid)
        if gpus <= gpu_budget:
            hi, best = mid, (gpus, groups)
        else:
            lo = mid
    gpus, groups = best
    return Assignment(max(g.time_s for g in groups), int(gpus), groups)


def frontier(table: SegmentTable, targets_s: np.ndarray) -> np.ndarray:
    """min_gpus for every makespan in `targets_s` at once (inf where impossible)."""
    k, T = table.num_bins, np.asarray(targets_s, dtype=float)
    f = np.full((k + 1, len(T)), np.inf)
    f[0] = 0.0
    for j in range(1, k + 1):
        for ti, tp in enumerate(table.tps):
            w = table.work_s[ti, :j, j][:, None]
            c = table.crit_s[ti, :j, j][:, None]
            cost = np.where(c <= T[None, :], f[:j] + tp * _instances(w, T[None, :]), np.inf)
            f[j] = np.minimum(f[j], cost.min(axis=0))
    return f[k]


def brute_force(table: SegmentTable, gpu_budget: int) -> float:
    """Best makespan over every contiguous partition and every (TP, instance count) per range."""
    k = table.num_bins
    best = math.inf
    for cuts in itertools.product((False, True), repeat=k - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], k]
        ranges = list(itertools.pairwise(bounds))
        options = []
        for i, j in ranges:
            opts = []
            for ti, tp in enumerate(table.tps):
                if not math.isfinite(table.crit_s[ti, i, j]):
                    continue
                for n in range(1, gpu_budget // tp + 1):
                    t = max(float(table.crit_s[ti, i, j]), float(table.work_s[ti, i, j]) / n)
                    opts.append((tp * n, t))
            options.append(opts)
        for combo in itertools.product(*options):
            if sum(g for g, _ in combo) <= gpu_budget:
                best = min(best, max(t for _, t in combo))
    return best
