"""The scheduler interface: which bucket of rollout instances serves a trajectory, turn by turn.

A *bucket* is a group of rollout instances sized for a range of trajectory sizes (prompt + generated +
tool payload tokens). Bucket bounds are upper bounds in tokens: N ascending bounds `(B1, ..., BN)`
give N + 1 buckets, bucket i holds sizes `<= B(i+1)` and the last bucket is open (`bucket_of`).

Who calls a scheduler: the rollout router (libra_core/rollout/router.py) on the rollout's asyncio
thread (`admit` once per trajectory, `on_tool_return` after every tool return), and the trace
evaluator (libra_core/traces/evaluate.py) when it replays a trace. `on_finish` may arrive from
another thread (statistics updates), so implementations guard their state with a lock. Schedulers
track each in-flight request's current bucket themselves, keyed by `request_id`; `on_finish` frees it.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

ToolStatus = Literal["success", "failure", "timeout"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One generation and the tool return it caused (`tool`/`status` are None on the last turn)."""

    gen_tokens: int
    tool: str | None
    payload_tokens: int
    status: ToolStatus | None


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """What a scheduler sees of a trajectory at admission."""

    request_id: str
    prompt_id: str
    prompt_tokens: int
    iteration: int
    realised: tuple[Turn, ...] | None = None  # only the trace evaluator fills this; only `oracle` reads it


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """Passed at each tool return, before the next generation starts."""

    turn_index: int  # 0-based index of the turn whose tool call returned
    gen_tokens: int  # tokens generated in that turn
    tool: str
    payload_tokens: int  # tokens of the observation appended to the context
    status: ToolStatus
    context_tokens: int  # prompt + all generated + all payload tokens so far, including this return


def reprefill_tokens(ret: ToolReturn) -> int:
    """Context tokens a move at this tool return prefills again: everything before the payload
    that just arrived. The payload itself is prefilled once wherever the next turn runs, so it is
    no extra cost of a move (before 2026-12-06 it was charged and counted as migrated)."""
    return ret.context_tokens - ret.payload_tokens


@dataclass(frozen=True, slots=True)
class Move:
    """Decision to serve the rest of a trajectory from another bucket (re-prefilling its context)."""

    bucket: int


@dataclass(frozen=True, slots=True)
class FinishedTrajectory:
    """A trajectory that ended; the statistics schedulers learn from."""

    request_id: str
    prompt_id: str
    prompt_tokens: int
    iteration: int
    policy_version: int  # version of the policy that generated it (the trace evaluator uses the iteration)
    turns: tuple[Turn, ...]


class Scheduler(Protocol):
    def admit(self, request: SchedRequest) -> int:
        """Bucket index in `[0, num_buckets)` for a new trajectory; called once per request, before
        its first generation, on the rollout thread. Records the request as in flight."""
        ...

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        """Called after every tool return of an admitted request that another turn follows, on the
        rollout thread (not after a return that ends the trajectory at its turn or token limit). None
        keeps the request in its bucket (and its prefix cache); `Move(b)` with `b` a different
        existing bucket serves the next turns from bucket `b`, which re-prefills the context before
        the payload there (`reprefill_tokens(ret)`; the payload is prefilled wherever it runs)."""
        ...

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        """Called once when a trajectory ends (any thread): update statistics, free per-request state.
        The trace evaluator calls it only after every decision of the trajectory's iteration."""
        ...

    def on_policy_version(self, version: int) -> None:
        """Called when the rollout starts using a new policy version (once per iteration, before its
        admissions); schedulers may age their statistics."""
        ...


def bucket_of(tokens: float, bounds: Sequence[int]) -> int:
    """Bucket of a token count: the first i with `tokens <= bounds[i]`, else `len(bounds)` (open)."""
    return bisect.bisect_left(bounds, tokens)


def total_tokens(prompt_tokens: int, turns: Sequence[Turn]) -> int:
    """A trajectory's size: prompt + every generated and every tool payload token."""
    return prompt_tokens + sum(t.gen_tokens + t.payload_tokens for t in turns)


class BucketTracker:
    """In-flight bookkeeping shared by the implementations: request id -> current bucket, and the
    number of requests per bucket. Thread-safe; every method is O(1)."""

    def __init__(self, num_buckets: int) -> None:
        assert num_buckets >= 1, f"need at least one bucket, got {num_buckets}"
        self.num_buckets = num_buckets
        self.lock = threading.RLock()
        self._bucket: dict[str, int] = {}
        self.loads = [0] * num_buckets

    def place(self, request_id: str, bucket: int) -> int:
        assert 0 <= bucket < self.num_buckets, f"bucket {bucket} outside [0, {self.num_buckets})"
        with self.lock:
            old = self._bucket.get(request_id)
            if old is not None:
                self.loads[old] -= 1
            self._bucket[request_id] = bucket
            self.loads[bucket] += 1
        return bucket

    def current(self, request_id: str) -> int:
        with self.lock:
            bucket = self._bucket.get(request_id)
        if bucket is None:
            raise KeyError(f"request {request_id!r} is not in flight; call admit() before on_tool_return()")
        return bucket

    def release(self, request_id: str) -> None:
        with self.lock:
            bucket = self._bucket.pop(request_id, None)
            if bucket is not None:
                self.loads[bucket] -= 1

    def in_flight(self) -> int:
        with self.lock:
            return len(self._bucket)
