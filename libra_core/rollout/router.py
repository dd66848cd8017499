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

from collections.abc import Sequence
from dataclasses import dataclass

from libra_core.scheduling.base import (
    FinishedTrajectory,
    SchedRequest,
    Scheduler,
    ToolReturn,
    bucket_of,
    reprefill_tokens,
    total_tokens,
)


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
    migrated_tokens: int  # context tokens re-prefilled because of migrations (payloads excluded)
    tokens_by_instance: tuple[int, ...]  # generated tokens per instance
    # share of generated tokens decoded in the bucket of their trajectory's final size (the trace
    # evaluator's class_accuracy, measured live); None without bucket bounds or finished work
    class_accuracy: float | None = None
    # migrated_tokens / every token of the finished trajectories (prompt, generated, payloads); None
    # when nothing finished. The trace evaluator's migration_token_ratio charges every move (it
    # gives each bucket instances of its own); this one only the moves that changed the instance,
    # the re-prefills that ran: with fewer instances than buckets (the CPU default: one instance,
    # three buckets) it is lower than a replay's, while class_accuracy credits the bucket either way
    migration_token_ratio: float | None = None


class InstanceRouter:
    def __init__(
        self,
        scheduler: Scheduler,
        num_buckets: int,
        num_instances: int,
        bounds: Sequence[int] | None = None,
    ) -> None:
        """`bounds`: the scheduler's bucket bounds (scheduler.buckets); with them the router also
        measures class accuracy."""
        self.scheduler = scheduler
        self.groups = bucket_instances(num_buckets, num_instances)
        self.in_flight = [0] * num_instances
        self._tokens = [0] * num_instances
        self._decisions = self._moves = self._migrations = self._migrated_tokens = 0
        self.bounds = tuple(bounds) if bounds is not None else None
        self._bucket: dict[str, int] = {}  # request -> bucket it decodes in now
        self._decoded: dict[str, dict[int, int]] = {}  # request -> bucket -> tokens decoded there
        self._gen_right = self._gen_total = 0
        self._processed = 0  # tokens of the finished trajectories (total_tokens)

    def _credit(self, request_id: str, tokens: int) -> None:
        by_bucket = self._decoded.setdefault(request_id, {})
        bucket = self._bucket.get(request_id, 0)
        by_bucket[bucket] = by_bucket.get(bucket, 0) + tokens

    def _least_loaded(self, bucket: int) -> int:
        assert 0 <= bucket < len(self.groups), f"scheduler chose bucket {bucket} of {len(self.groups)}"
        return min(self.groups[bucket], key=lambda i: self.in_flight[i])

    def admit(self, request: SchedRequest) -> int:
        self._decisions += 1
        bucket = self.scheduler.admit(request)
        instance = self._least_loaded(bucket)
        self._bucket[request.request_id] = bucket
        self.in_flight[instance] += 1
        return instance

    def after_tool(self, request: SchedRequest, ret: ToolReturn, instance: int, *, last: bool = False) -> int:
        """Instance for the next turn; counts tokens generated so far on `instance`. With `last` (no
        turn follows: the trajectory hit its turn or token limit) the scheduler is not asked, since
        a move would be a migration that nothing runs after."""
        self._tokens[instance] += ret.gen_tokens
        self._credit(request.request_id, ret.gen_tokens)
        if last:
            return instance
        self._decisions += 1
        move = self.scheduler.on_tool_return(request, ret)
        if move is None:
            return instance
        self._moves += 1
        assert 0 <= move.bucket < len(self.groups), (
            f"scheduler chose bucket {move.bucket} of {len(self.groups)}"
        )
        self._bucket[request.request_id] = move.bucket
        if instance in self.groups[move.bucket]:
            return instance
        target = self._least_loaded(move.bucket)
        self._migrations += 1
        self._migrated_tokens += reprefill_tokens(ret)
        self.in_flight[instance] -= 1
        self.in_flight[target] += 1
        return target

    def finish(self, trajectory: FinishedTrajectory, instance: int, last_gen_tokens: int) -> None:
        self._tokens[instance] += last_gen_tokens
        self.in_flight[instance] -= 1
        rid = trajectory.request_id
        self._credit(rid, last_gen_tokens)
        decoded = self._decoded.pop(rid, {})
        self._bucket.pop(rid, None)
        size = total_tokens(trajectory.prompt_tokens, trajectory.turns)
        self._processed += size
        if self.bounds is not None:
            right = min(bucket_of(size, self.bounds), len(self.groups) - 1)
            self._gen_right += decoded.get(right, 0)
            self._gen_total += sum(decoded.values())
        self.scheduler.on_finish(trajectory)

    def stats(self) -> RoutingStats:
        accuracy = self._gen_right / self._gen_total if self._gen_total else None
        return RoutingStats(
            self._decisions,
            self._moves,
            self._migrations,
            self._migrated_tokens,
            tuple(self._tokens),
            accuracy,
            self._migrated_tokens / self._processed if self._processed else None,
        )


def static_router(num_instances: int = 1) -> InstanceRouter:
    """Every trajectory on the first bucket's instances (benchmarks and tests that do not route)."""
    from libra_core.config.models import SchedulerConfig
    from libra_core.scheduling.registry import build_scheduler

    cfg = SchedulerConfig(type="static")
    return InstanceRouter(build_scheduler(cfg), cfg.num_buckets, num_instances)
