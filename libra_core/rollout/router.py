"""The rollout router: turns a scheduler's bucket decisions into concrete vLLM instances.

A scheduler (libra_core.scheduling) reasons about buckets, i.e. groups of instances sized for
short or long remaining work. The agent loop asks this router, on its one asyncio thread, for an
instance at admission (`admit`) and after every tool return (`after_tool`); a move hands the next
turn to the least-loaded instance of the new bucket, which re-prefills the context there. When the
trajectory ends the loop calls `finish`, which feeds the scheduler's statistics.

Buckets map onto the instance list in order (`bucket_instances`): with more instances than buckets
each bucket gets a contiguous slice (later buckets get the larger remainder, since long work needs
the most capacity); with fewer, neighbouring buckets share an instance, and a move between buckets
of one instance is not a migration (no re-prefill happens).
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.scheduling.base import FinishedTrajectory, SchedRequest, Scheduler, ToolReturn


def bucket_instances(num_buckets: int, num_instances: int) -> list[list[int]]:
    """Instance indices serving each bucket; every bucket gets at least one instance."""
    assert num_buckets >= 1 and num_instances >= 1, "need at least one bucket and one instance"
    if num_instances <= num_buckets:
        return [[b * num_instances // num_buckets] for b in range(num_buckets)]
    base, extra = divmod(num_instances, num_buckets)
    sizes = [base + (1 if b >= num_buckets - extra else 0) for b in range(num_buckets)]
    groups, start = [], 0
    for size in sizes:
        groups.append(list(range(start, start + size)))
        start += size
    return groups


@dataclass(frozen=True)
class RoutingStats:
    """What routing did in one rollout stage (written to the run history)."""

    decisions: int  # admissions + tool returns the scheduler was asked about
    moves: int  # bucket changes the scheduler asked for
    migrations: int  # moves that changed the instance (and so re-prefilled the context)
    migrated_tokens: int  # context tokens re-prefilled because of migrations
    tokens_by_instance: tuple[int, ...]  # generated tokens per instance


class InstanceRouter:
    def __init__(self, scheduler: Scheduler, num_buckets: int, num_instances: int) -> None:
        self.scheduler = scheduler
        self.groups = bucket_instances(num_buckets, num_instances)
        self.in_flight = [0] * num_instances
        self._tokens = [0] * num_instances
        self._decisions = self._moves = self._migrations = self._migrated_tokens = 0

    def _least_loaded(self, bucket: int) -> int:
        assert 0 <= bucket < len(self.groups), f"scheduler chose bucket {bucket} of {len(self.groups)}"
        return min(self.groups[bucket], key=lambda i: self.in_flight[i])

    def admit(self, request: SchedRequest) -> int:
        self._decisions += 1
        instance = self._least_loaded(self.scheduler.admit(request))
        self.in_flight[instance] += 1
        return instance

    def after_tool(self, request: SchedRequest, ret: ToolReturn, instance: int) -> int:
        """Instance for the next turn; counts tokens generated so far on `instance`."""
        self._decisions += 1
        self._tokens[instance] += ret.gen_tokens
        move = self.scheduler.on_tool_return(request, ret)
        if move is None:
            return instance
        self._moves += 1
        assert 0 <= move.bucket < len(self.groups), (
            f"scheduler chose bucket {move.bucket} of {len(self.groups)}"
        )
        if instance in self.groups[move.bucket]:
            return instance
        target = self._least_loaded(move.bucket)
        self._migrations += 1
        self._migrated_tokens += ret.context_tokens
        self.in_flight[instance] -= 1
        self.in_flight[target] += 1
        return target

    def finish(self, trajectory: FinishedTrajectory, instance: int, last_gen_tokens: int) -> None:
        self._tokens[instance] += last_gen_tokens
        self.in_flight[instance] -= 1
        self.scheduler.on_finish(trajectory)

    def stats(self) -> RoutingStats:
        return RoutingStats(
            self._decisions, self._moves, self._migrations, self._migrated_tokens, tuple(self._tokens)
        )


def static_router(num_instances: int = 1) -> InstanceRouter:
    """Every trajectory on the first bucket's instances (benchmarks and tests that do not route)."""
    from libra_core.config.models import SchedulerConfig
    from libra_core.scheduling.registry import build_scheduler

    cfg = SchedulerConfig(type="static")
    return InstanceRouter(build_scheduler(cfg), cfg.num_buckets, num_instances)
