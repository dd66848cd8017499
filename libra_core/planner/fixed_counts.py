"""Re-pricing a running rollout layout: the assignment DP with each TP degree's instance count fixed.

A running plan's instances are engines already started; on a new workload only the length ranges
can move for free (the router's bucket bounds), not how many instances of each degree run. The
search's DP (assignment.py) chooses the counts; this one takes them from the running plan and finds
the best ranges for them: degrees ascending along the length-sorted bins (monotone, as the routers
promote), each degree serving one contiguous block of bins that it may cut into ranges whose
instance counts sum to at most its count (`strict`: one range per degree), as the search prices
ranges. `evaluate_plan` (reprice.py) calls it once per re-pricing of a heterogeneous plan; until
2026-12-07 it ran the search's DP on the plan's degrees, which re-chose the counts (48xA800
swe-longtail's 14xTP1 2xTP2 3xTP4 re-priced on search-medium as 3xTP1 7xTP4), so the "running plan"
a replan compared with, and the prediction the stage correction learnt from, were another plan.

Bisection on the makespan T, as `assignment.solve`: for a target, `fewest_instances` gives the fewest
instances of each degree meeting T on every range, `_block_need` the fewest covering a block of
bins with ranges, and a pass over the degrees checks that some boundaries keep every degree within
its count. Instances a degree does not need join its slowest range (the router spreads a bucket
over all of its instances), which is then priced with them.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from libra_core.planner.assignment import Assignment, Group, SegmentTable, fewest_instances


def _block_need(need: np.ndarray, strict: bool) -> tuple[np.ndarray, np.ndarray]:
    """(K+1, K+1) fewest instances covering bins [a, b) with ranges of one degree (0 when a == b,
    inf where impossible), and the start of the last range of that cover (for reconstruction)."""
    k1 = need.shape[0]
    h = np.full((k1, k1), np.inf)
    np.fill_diagonal(h, 0.0)
    last = np.tile(np.arange(k1)[:, None], (1, k1))  # cover of [a, b) ends with range [last, b)
    upper = np.triu(np.ones((k1, k1), dtype=bool), 1)
    if strict:
        h = np.where(upper, need, h)
        return h, last
    for b in range(1, k1):
        # h[a, b] = min over c in [a, b) of h[a, c] + need[c, b] (h[a, c] is inf for c < a)
        cost = h[:, :b] + need[:b, b][None, :]
        c = np.argmin(cost, axis=1)
        h[:b, b] = cost[np.arange(b), c[:b]]
        last[:b, b] = c[:b]
    return h, last


def _feasible(
    table: SegmentTable, counts: list[tuple[int, int]], target_s: float, strict: bool
) -> list[list[tuple[int, int, int]]] | None:
    """Each degree's ranges (start, end, instances) meeting `target_s` within its count, in the
    order of `counts` ((table degree index, count), ascending TP); None if no boundaries do."""
    k = table.num_bins
    covers = []
    reach = np.zeros(k + 1, dtype=bool)
    reach[0] = True
    came = []  # per degree: the block start chosen for each end bin
    for ti, count in counts:
        need = fewest_instances(table, ti, target_s)
        h, last = _block_need(need, strict)
        ok = reach[:, None] & (h <= count)  # (start a, end b): degree covers [a, b)
        came.append(np.argmax(ok, axis=0))
        covers.append((need, last))
        reach = np.asarray(ok.any(axis=0))
    if not reach[k]:
        return None
    out: list[list[tuple[int, int, int]]] = []
    b = k
    for (need, last), start in zip(reversed(covers), reversed(came), strict=True):
        a = int(start[b])
        ranges = []
        j = b
        while j > a:
            i = int(last[a, j])
            ranges.append((i, j, int(need[i, j])))
            j = i
        out.append(list(reversed(ranges)))
        b = a
    return list(reversed(out))


def solve_counts(
    table: SegmentTable, instances: dict[int, int], rel_tol: float = 1e-4, strict: bool = False
) -> Assignment | None:
    """The makespan-optimal ranges for `instances` (TP degree -> count, every degree in the
    table's `tps`), using at most each degree's count; None if they cannot serve the workload."""
    counts = [(table.tps.index(tp), n) for tp, n in sorted(instances.items()) if n > 0]
    assert counts, "a rollout layout needs at least one instance"
    k = table.num_bins
    # Upper bracket: every length on the largest degree that can take them all.
    hi = min(table.group_time_s(ti, n, 0, k) for ti, n in counts)
    if not math.isfinite(hi):
        return None
    best = _feasible(table, counts, hi, strict)
    assert best is not None, "the bracket's layout (one degree on every length) meets its own time"
    lo = hi * 1e-6
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        found = _feasible(table, counts, mid, strict)
        if found is not None:
            hi, best = mid, found
        else:
            lo = mid
    groups: list[Group] = []
    for (ti, count), ranges in zip(counts, best, strict=True):
        if not ranges:
            continue  # this degree's instances idle: the other degrees cover every length sooner
        tp = table.tps[ti]
        sizes = [n for _, _, n in ranges]
        times = [table.group_time_s(ti, n, i, j) for i, j, n in ranges]
        slowest = int(np.argmax(times))
        sizes[slowest] += count - sum(sizes)
        for (i, j, _), n in zip(ranges, sizes, strict=True):
            groups.append(Group(tp, n, i, j, table.group_time_s(ti, n, i, j)))
    gpus = sum(g.tp * g.instances for g in groups)
    return Assignment(max(g.time_s for g in groups), gpus, tuple(groups))


def brute_force_counts(table: SegmentTable, instances: dict[int, int], strict: bool = False) -> float:
    """Best makespan over every contiguous partition and every (degree, instance count) per range
    with TP non-decreasing along the ranges (increasing when `strict`) and at most each degree's
    count in all; for tests (a handful of bins)."""
    k = table.num_bins
    best = math.inf
    degrees = sorted(instances)
    for cuts in itertools.product((False, True), repeat=k - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], k]
        options = []
        for i, j in itertools.pairwise(bounds):
            options.append(
                [
                    (tp, n, table.group_time_s(table.tps.index(tp), n, i, j))
                    for tp in degrees
                    for n in range(1, instances[tp] + 1)
                ]
            )
        for combo in itertools.product(*options):
            tps = [c[0] for c in combo]
            if any(a > b or (strict and a == b) for a, b in itertools.pairwise(tps)):
                continue
            if any(sum(n for t, n, _ in combo if t == tp) > instances[tp] for tp in degrees):
                continue
            best = min(best, max(t for _, _, t in combo))
    return best
