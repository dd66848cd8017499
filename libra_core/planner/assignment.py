"""Request-to-instance assignment: a dynamic program over length-sorted requests.

Trajectories are sorted by length and cut into K bins. A plan covers the bins with contiguous
ranges; each range [i, j) is served by a *group* of n identical instances of TP degree t (the
range's requests are spread evenly over them). A `SegmentTable` gives, for every (t, n, i, j), the
instance-seconds of work W (throughput-bound) and the critical path C (the slowest trajectory's
latency) when n instances share the range: both depend on n, because each instance then batches
only its share of the range's requests. The group's time is `max(C_n, W_n / n)`.

`min_gpus(T)`: DP `f[j, t] = min_{i<j, t' <= t} f[i, t'] + t * n(t, i, j, T)` with n the fewest
instances whose group time is <= T (none if no count meets T), exact for "fewest GPUs with makespan
<= T" in O(K^2 |T| N). The TP degree never falls from a shorter range to a longer one (`monotone`,
the default): the routers promote a request from short to long buckets and let a longer bucket's
instances serve shorter work, which only makes sense when longer buckets have at least the TP.
`strict` (t' < t) gives each degree one range: one router bucket per degree, as a deployment that
merges neighbouring groups of one degree runs it. The makespan-optimal assignment under a budget G
is the smallest T with `min_gpus(T) <= G`; min_gpus is non-increasing in T, so `solve` bisects on
T (relative tolerance `rel_tol`) and `frontier` evaluates a whole grid of T at once (vectorised) to
price every GPU split of the search. `brute_force` enumerates every contiguous partition and
(t, n) choice, for tests.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

_EPS = 1e-12


@dataclass(frozen=True)
class SegmentTable:
    """Prices of every (TP degree, instance count, bin range).

    `work_s` and `crit_s` have shape (len(tps), N, K+1, K+1): entry [t, n-1, i, j] prices bins
    i..j-1 (i < j) spread over n instances of TP `tps[t]`; crit is inf where TP t cannot serve
    the range. A count beyond N is priced like N, so a 3-D (len(tps), K+1, K+1) table is accepted
    as N = 1: a range whose price does not depend on how many instances share it.
    """

    tps: tuple[int, ...]
    work_s: np.ndarray
    crit_s: np.ndarray
    bin_edges: np.ndarray  # (K+1,) sample indices of the bin boundaries (sorted order)
    bin_max_len: np.ndarray  # (K,) longest trajectory (tokens) in each bin
    _times: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if any(a >= b for a, b in zip(self.tps, self.tps[1:], strict=False)):
            raise ValueError(f"SegmentTable.tps must be strictly ascending, got {self.tps}")
        for name in ("work_s", "crit_s"):
            arr = np.asarray(getattr(self, name), dtype=float)
            if arr.ndim == 3:
                arr = arr[:, None]
            if arr.ndim != 4 or arr.shape[0] != len(self.tps) or arr.shape[2] != arr.shape[3]:
                raise ValueError(f"SegmentTable.{name} must be (len(tps), N, K+1, K+1), got {arr.shape}")
            object.__setattr__(self, name, arr)
        if self.work_s.shape != self.crit_s.shape:
            raise ValueError(f"work_s {self.work_s.shape} and crit_s {self.crit_s.shape} differ")
        n = np.arange(1, self.max_instances + 1, dtype=float)[None, :, None, None]
        with np.errstate(invalid="ignore"):
            times = np.maximum(self.crit_s, self.work_s * (1 - _EPS) / n)
        object.__setattr__(self, "_times", times)

    @property
    def num_bins(self) -> int:
        return self.work_s.shape[2] - 1

    @property
    def max_instances(self) -> int:
        """N: the instance counts priced individually (larger counts price like N)."""
        return self.work_s.shape[1]

    def group_time_s(self, ti: int, instances: int, i: int, j: int) -> float:
        """Makespan of bins i..j-1 on `instances` instances of TP `tps[ti]` (inf if they cannot)."""
        m = min(instances, self.max_instances) - 1
        return float(max(self.crit_s[ti, m, i, j], self.work_s[ti, m, i, j] / instances))

    def group_times_s(self, ti: int) -> np.ndarray:
        """(N, K+1, K+1) group makespans of TP `tps[ti]` for n = 1..N (NaN/inf where invalid)."""
        return self._times[ti]


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


def _beyond(table: SegmentTable, ti: int, j: int | None, targets: np.ndarray) -> np.ndarray:
    """Fewest counts > N meeting each target (inf where none does): (K+1, K+1, L) for every range,
    or (j, L) for the ranges ending at bin j."""
    nn = table.max_instances
    c, w = table.crit_s[ti, nn - 1], table.work_s[ti, nn - 1]
    if j is not None:
        c, w = c[:j, j], w[:j, j]
    c, w = c[..., None], w[..., None]
    with np.errstate(invalid="ignore"):
        n = np.maximum(nn + 1.0, np.ceil(w / targets * (1 - _EPS)))
        return np.where(c <= targets, n, np.inf)


def fewest_instances(table: SegmentTable, ti: int, target_s: float) -> np.ndarray:
    """(K+1, K+1) fewest instances of TP `tps[ti]` serving each range within `target_s` (inf if none)."""
    ok = table.group_times_s(ti) <= target_s  # (N, K+1, K+1)
    beyond = _beyond(table, ti, None, np.array([target_s]))[:, :, 0]
    return np.where(ok.any(axis=0), np.argmax(ok, axis=0) + 1.0, beyond)


def _best_before(f: np.ndarray, monotone: bool, strict: bool = False) -> np.ndarray:
    """g[i, t, ...]: fewest GPUs for bins [0, i) (i > 0) whose last group's TP index is <= t
    (monotone), < t (strict: each degree serves one range), or any (neither)."""
    if strict:
        out = np.full_like(f, np.inf)
        out[:, 1:] = np.minimum.accumulate(f, axis=1)[:, :-1]
        return out
    if monotone:
        return np.minimum.accumulate(f, axis=1)
    return np.broadcast_to(f.min(axis=1, keepdims=True), f.shape)


def min_gpus(
    table: SegmentTable, target_s: float, monotone: bool = True, strict: bool = False
) -> tuple[float, tuple[Group, ...]]:
    """Fewest GPUs meeting makespan `target_s`, and the groups (inf, () if impossible).

    `monotone`: a longer range never gets a smaller TP degree than a shorter one (what a router
    that promotes requests from short to long buckets assumes). `strict`: a longer range always
    gets a larger degree, so each degree serves one range (one router bucket per degree: the
    simulator deploys a plan so, merging neighbouring groups of one degree)."""
    k, nt = table.num_bins, len(table.tps)
    need = [fewest_instances(table, ti, target_s) for ti in range(nt)]
    f = np.full((k + 1, nt), np.inf)
    f[0] = 0.0
    choice = np.zeros((k + 1, nt, 2), dtype=int)  # (start bin, instances) of the last group
    g = np.empty_like(f)  # row i is final once f[i] is
    g[0] = 0.0  # the first range may take any degree
    for j in range(1, k + 1):
        for ti, tp in enumerate(table.tps):
            n = need[ti][:j, j]
            cost = g[:j, ti] + tp * n
            i = int(np.argmin(cost))
            if math.isfinite(cost[i]):
                f[j, ti] = cost[i]
                choice[j, ti] = (i, int(n[i]))
        g[j] = _best_before(f[j : j + 1], monotone, strict)[0]
    if not np.isfinite(f[k]).any():
        return math.inf, ()
    ti = int(np.argmin(f[k]))
    total = float(f[k, ti])
    groups = []
    j = k
    while j > 0:
        i, count = (int(x) for x in choice[j, ti])
        groups.append(Group(table.tps[ti], count, i, j, table.group_time_s(ti, count, i, j)))
        allowed = f[i, :ti] if strict else f[i, : ti + 1] if monotone else f[i]
        ti, j = (int(np.argmin(allowed)) if i > 0 else 0), i
    return total, tuple(reversed(groups))


def solve(
    table: SegmentTable, gpu_budget: int, rel_tol: float = 1e-4, monotone: bool = True, strict: bool = False
) -> Assignment | None:
    """Makespan-optimal assignment within `gpu_budget` GPUs (None if nothing fits)."""
    k = table.num_bins
    # Upper bracket: the whole range on the largest group any single TP can form.
    hi = math.inf
    for ti, tp in enumerate(table.tps):
        n = gpu_budget // tp
        if n >= 1:
            hi = min(hi, table.group_time_s(ti, n, 0, k))
    if not math.isfinite(hi):
        return None
    lo = hi * 1e-6
    best = min_gpus(table, hi, monotone, strict)
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        gpus, groups = min_gpus(table, mid, monotone, strict)
        if gpus <= gpu_budget:
            hi, best = mid, (gpus, groups)
        else:
            lo = mid
    gpus, groups = best
    return Assignment(max(g.time_s for g in groups), int(gpus), groups)


def homogeneous(table: SegmentTable, gpu_budget: int) -> Assignment | None:
    """The fastest single-TP layout within `gpu_budget`: one group of `gpu_budget // t` TP-t
    instances serving every length (one least-load bucket), best over the table's degrees (None if
    no degree fits). What a system without heterogeneous instances (verl, AReaL) deploys; priced
    exactly by the table, no DP. Every instance that fits is deployed, as such a system does."""
    k = table.num_bins
    best: Assignment | None = None
    for ti, tp in enumerate(table.tps):
        n = gpu_budget // tp
        if n < 1:
            continue
        t = table.group_time_s(ti, n, 0, k)
        if math.isfinite(t) and (best is None or t < best.makespan_s):
            best = Assignment(t, n * tp, (Group(tp, n, 0, k, t),))
    return best


def one_degree(table: SegmentTable, ti: int) -> SegmentTable:
    """`table` restricted to its degree `tps[ti]` (same bins and instance counts)."""
    sl = slice(ti, ti + 1)
    return SegmentTable(
        (table.tps[ti],), table.work_s[sl], table.crit_s[sl], table.bin_edges, table.bin_max_len
    )


def homogeneous_dp(table: SegmentTable, gpu_budget: int, rel_tol: float = 1e-3) -> Assignment | None:
    """Like `homogeneous` (every instance of one degree that fits, one bucket), but each degree's
    layout is priced by the DP restricted to that degree: several length ranges, each at the batch
    its share of the instances runs, as one least-load bucket spreads them. The one-range price
    takes the whole range's slowest trajectory at the full range's batch and is 1.0-1.5x the
    simulated rollout (`benchmarks/sim_homogeneous_price.py`)."""
    best: Assignment | None = None
    for ti, tp in enumerate(table.tps):
        n = gpu_budget // tp
        if n < 1:
            continue
        a = solve(one_degree(table, ti), n * tp, rel_tol)
        if a is not None and (best is None or a.makespan_s < best.makespan_s):
            best = Assignment(a.makespan_s, n * tp, (Group(tp, n, 0, table.num_bins, a.makespan_s),))
    return best


def _counts_over(table: SegmentTable, ti: int, targets: np.ndarray) -> np.ndarray:
    """(K+1, K+1, L) int: for each range, how many of n = 1..N miss each (ascending) target
    with every count up to n; the fewest instances meeting target l is that count + 1 when some
    n <= N meets it."""
    best = np.minimum.accumulate(np.nan_to_num(table.group_times_s(ti), nan=np.inf), axis=0)
    nn, k1 = best.shape[0], best.shape[1]
    # best is non-increasing in n; n misses target l iff targets[l] < best[n], i.e. l < idx[n].
    idx = np.searchsorted(targets, best, side="left").reshape(nn, -1)  # (N, (K+1)^2)
    width = len(targets) + 1
    # Counts fit in int16 up to 32,766 instances: one (K+1)^2 x L array, filled and summed in
    # place. An int64 histogram and its cumulative sums touched 12x the memory, and fresh pages
    # cost more than the arithmetic (0.1 s a call on the 2-core machine; a planner search makes 4-8).
    # More instances (a cluster past 32k GPUs of TP1, and as many trajectories) take int32 (until
    # 2026-12-06 an AssertionError, a traceback from `libra plan`).
    dtype = np.int16 if nn < np.iinfo(np.int16).max else np.int32
    hist = np.zeros((k1 * k1, width), dtype=dtype)
    np.add.at(hist, (np.broadcast_to(np.arange(k1 * k1), idx.shape), idx), 1)
    np.cumsum(hist, axis=1, out=hist)
    np.subtract(nn, hist, out=hist)  # #{n: idx[n] > l}
    return hist[:, :-1].reshape(k1, k1, len(targets))


def frontier(
    table: SegmentTable, targets_s: np.ndarray, monotone: bool = True, strict: bool = False
) -> np.ndarray:
    """min_gpus for every makespan in `targets_s` at once (inf where impossible)."""
    k, T = table.num_bins, np.asarray(targets_s, dtype=float)
    order = np.argsort(T, kind="stable")
    T_sorted = T[order]
    nn, nt = table.max_instances, len(table.tps)
    missed = [_counts_over(table, ti, T_sorted) for ti in range(nt)]
    f = np.full((k + 1, nt, len(T)), np.inf)
    f[0] = 0.0
    g = np.empty_like(f)  # row i is final once f[i] is
    g[0] = 0.0  # the first range may take any degree
    for j in range(1, k + 1):
        for ti, tp in enumerate(table.tps):
            m = missed[ti][:j, j]  # (j, L)
            n = np.where(m < nn, m + 1.0, _beyond(table, ti, j, T_sorted))
            f[j, ti] = (g[:j, ti] + tp * n).min(axis=0)
        g[j] = _best_before(f[j : j + 1], monotone, strict)[0]
    out = np.empty(len(T))
    out[order] = f[k].min(axis=0)
    return out


def brute_force(table: SegmentTable, gpu_budget: int, monotone: bool = True, strict: bool = False) -> float:
    """Best makespan over every contiguous partition and every (TP, instance count) per range
    (TP non-decreasing along the ranges when `monotone`, increasing when `strict`)."""
    k = table.num_bins
    best = math.inf
    for cuts in itertools.product((False, True), repeat=k - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], k]
        ranges = list(itertools.pairwise(bounds))
        options = []
        for i, j in ranges:
            opts = []
            for ti, tp in enumerate(table.tps):
                for n in range(1, gpu_budget // tp + 1):
                    t = table.group_time_s(ti, n, i, j)
                    if math.isfinite(t):
                        opts.append((tp, tp * n, t))
            options.append(opts)
        for combo in itertools.product(*options):
            if strict and any(a[0] >= b[0] for a, b in itertools.pairwise(combo)):
                continue
            if monotone and any(a[0] > b[0] for a, b in itertools.pairwise(combo)):
                continue
            if sum(g for _, g, _ in combo) <= gpu_budget:
                best = min(best, max(t for _, _, t in combo))
    return best
