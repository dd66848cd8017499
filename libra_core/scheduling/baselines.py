"""Reference schedulers that C-MLFQ is compared against (and that tests use as trivial implementations).

- `static`: everything in the shortest bucket, never moves (the system without routing).
- `round_robin`: admission cycles over buckets, never moves.
- `least_load`: admission to the bucket with the fewest requests in flight, never moves.
- `mlfq`: classic multi-level feedback queue: start in the shortest bucket and move to a longer one
  as soon as the tokens processed pass the current bucket's bound (no prediction, every move pays).
- `input_length`: predicts the trajectory's size from its prompt size (the mean size of recently
  finished trajectories with a similar prompt size) and places it once; never moves.
- `oracle`: reads the realised turns the trace evaluator attaches and places each trajectory in the
  bucket of its final size; never moves. An upper bound for evaluation only.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import (
    BucketTracker,
    FinishedTrajectory,
    Move,
    SchedRequest,
    ToolReturn,
    bucket_of,
    total_tokens,
)


class TrackedScheduler:
    """Shared plumbing: bucket tracking, stay-on-tool-return, free-on-finish, ignore versions."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.bounds = tuple(cfg.buckets)
        self.tracker = BucketTracker(len(self.bounds) + 1)

    @property
    def num_buckets(self) -> int:
        return self.tracker.num_buckets

    def in_flight(self) -> int:
        return self.tracker.in_flight()

    def admit(self, request: SchedRequest) -> int:
        return self.tracker.place(request.request_id, self.choose(request))

    def choose(self, request: SchedRequest) -> int:
        raise NotImplementedError

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        self.tracker.current(request.request_id)  # fail loudly on a request never admitted
        return None

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.tracker.release(trajectory.request_id)

    def on_policy_version(self, version: int) -> None:
        return None


class StaticScheduler(TrackedScheduler):
    def choose(self, request: SchedRequest) -> int:
        return 0


class RoundRobinScheduler(TrackedScheduler):
    def __init__(self, cfg: SchedulerConfig) -> None:
        super().__init__(cfg)
        self._cycle = itertools.cycle(range(self.num_buckets))

    def choose(self, request: SchedRequest) -> int:
        with self.tracker.lock:
            return next(self._cycle)


class LeastLoadScheduler(TrackedScheduler):
    def choose(self, request: SchedRequest) -> int:
        with self.tracker.lock:
            loads = self.tracker.loads
            return min(range(self.num_buckets), key=lambda b: (loads[b], b))


class MLFQScheduler(TrackedScheduler):
    def choose(self, request: SchedRequest) -> int:
        return 0

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        current = self.tracker.current(request.request_id)
        if current < len(self.bounds) and ret.context_tokens > self.bounds[current]:
            target = bucket_of(ret.context_tokens, self.bounds)
            self.tracker.place(request.request_id, target)
            return Move(target)
        return None


class InputLengthScheduler(TrackedScheduler):
    """Size predictor keyed by prompt size: bins of a quarter octave, each keeping the sizes of its
    last `window` finished trajectories (so it follows drift). A prompt whose bin is empty uses the
    nearest populated bin; with no data at all, the prompt size itself."""

    window = 256

    def __init__(self, cfg: SchedulerConfig) -> None:
        super().__init__(cfg)
        self._sizes: dict[int, deque[int]] = {}

    @staticmethod
    def _bin(prompt_tokens: int) -> int:
        return int(4 * math.log2(prompt_tokens + 1))

    def choose(self, request: SchedRequest) -> int:
        key = self._bin(request.prompt_tokens)
        with self.tracker.lock:
            if not self._sizes:
                return bucket_of(request.prompt_tokens, self.bounds)
            nearest = min(self._sizes, key=lambda b: (abs(b - key), b))
            sizes = self._sizes[nearest]
            predicted = sum(sizes) / len(sizes)
        return bucket_of(predicted, self.bounds)

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        size = total_tokens(trajectory.prompt_tokens, trajectory.turns)
        with self.tracker.lock:
            key = self._bin(trajectory.prompt_tokens)
            self._sizes.setdefault(key, deque(maxlen=self.window)).append(size)
        super().on_finish(trajectory)


class OracleScheduler(TrackedScheduler):
    def choose(self, request: SchedRequest) -> int:
        if request.realised is None:
            raise ValueError(
                f"oracle needs the realised turns of request {request.request_id!r}; it only works "
                "inside the trace evaluator"
            )
        return bucket_of(total_tokens(request.prompt_tokens, request.realised), self.bounds)
