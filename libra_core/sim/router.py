"""The simulated router: buckets of instances, driven by a real scheduler (libra_core/scheduling).

The scheduler picks the bucket (`admit` at admission, `on_tool_return` after each tool call, exactly
as the rollout router calls it); the router picks the instance inside the bucket:
- `least_load`: a turn stays on the instance that served the previous turn if that one serves this
  bucket or a longer one (its prefix cache holds the context: only the tool payload is prefilled; a
  longer bucket's larger TP serves short work too), waiting in that instance's queue when it is full,
  as the rollout router does (`holder`; `SimSettings.sticky_turns`, default on; off, a full instance
  sends the turn elsewhere). A new trajectory, a turn the scheduler has just moved, or one whose
  instance left goes to the instance with the fewest running sequences that has room (the whole
  context is prefilled again there); with no room anywhere the turn waits in the bucket's FIFO queue.
- `round_robin`: a trajectory is pinned at admission to the next instance in turn and always waits
  for that one (no load awareness: the static-uniform baseline).
With several buckets, a turn whose bucket has no room, or whose least-loaded instance runs more
than `spill_factor` (default `SPILL_FACTOR`) x its TP degree x (the cluster's mean sequences per
GPU + 1) sequences (the + 1: an idle cluster does not make one sequence an overload), spills to the
least-loaded instance of this or a longer bucket (the planner sized each bucket for the trajectories
that *end* in its range, but a scheduler that admits to the shortest bucket sends every new
trajectory there first); only when no such instance has room does it wait in its bucket's queue,
which an instance of that bucket or of a longer one drains when it frees room (`Router.drain_order`).
Scheduler bucket indices beyond the deployment's buckets map to the last bucket.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from libra_core.sim.instance import Instance

SPILL_FACTOR = 2.0  # spill when the bucket's best instance runs > 2x the cluster's load per GPU


class Router:
    def __init__(
        self, instances: list[Instance], num_buckets: int, placement: str, spill_factor: float = SPILL_FACTOR
    ) -> None:
        self.placement = placement
        self.spill_factor = spill_factor
        self.num_buckets = num_buckets
        self.instances = instances
        self.by_bucket: list[list[Instance]] = [[] for _ in range(num_buckets)]
        for inst in instances:
            self.by_bucket[inst.bucket].append(inst)
        self.queues: list[deque[Any]] = [deque() for _ in range(num_buckets)]
        # Per-instance queues (pinned trajectories, turns waiting for their prefix's instance); an
        # instance added later (a training hybrid) gets one on first use.
        self.pinned_queues: defaultdict[int, deque[Any]] = defaultdict(deque)
        self._rr = 0

    def clamp(self, bucket: int) -> int:
        b = min(max(bucket, 0), self.num_buckets - 1)
        while b > 0 and not self.by_bucket[b]:
            b -= 1
        return b

    def pin(self) -> Instance:
        inst = self.instances[self._rr % len(self.instances)]
        self._rr += 1
        return inst

    def holder(self, bucket: int, previous: Instance | None) -> Instance | None:
        """The instance a turn stays on whether or not it has room now: the one that served the
        trajectory's previous turn, if it is active and serves this bucket or a longer one."""
        if previous is not None and previous.active and previous.bucket >= bucket:
            return previous
        return None

    def choose(self, bucket: int, previous: Instance | None, final_ctx: float) -> Instance | None:
        """An instance of `bucket` with room for a turn ending at `final_ctx` tokens, or None."""
        held = self.holder(bucket, previous)
        if held is not None and held.fits(final_ctx):
            return held
        best = self._least(self.by_bucket[bucket], final_ctx)
        if self.num_buckets > 1 and (
            best is None or best.batch > self.spill_factor * best.tp * (self._mean_load() + 1)
        ):
            # Work-conserving spill: the bucket is full or overloaded against the cluster, so the turn
            # goes to the least-loaded instance of this or a longer bucket (longer buckets can serve
            # short work).
            wider = self._least(
                [i for b in range(bucket, self.num_buckets) for i in self.by_bucket[b]], final_ctx
            )
            if wider is not None:
                return wider
        return best

    @staticmethod
    def _least(instances: list[Instance], final_ctx: float) -> Instance | None:
        best: Instance | None = None
        for inst in instances:
            if (
                inst.active
                and inst.fits(final_ctx)
                and (best is None or inst.batch * best.tp < best.batch * inst.tp)
            ):
                best = inst
        return best

    def _mean_load(self) -> float:
        """Running sequences per active GPU over the whole cluster."""
        gpus = sum(i.tp for i in self.instances if i.active)
        return sum(i.batch for i in self.instances if i.active) / max(1, gpus)

    def drain_order(self, bucket: int) -> list[deque[Any]]:
        """Queues an instance of `bucket` takes waiting turns from: its own, then shorter buckets'."""
        return [self.queues[b] for b in range(bucket, -1, -1)]

    def active_in(self, bucket: int) -> int:
        return sum(1 for i in self.by_bucket[bucket] if i.active)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues) + sum(len(q) for q in self.pinned_queues.values())
