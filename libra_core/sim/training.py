"""The simulated training stage: one update at a time, priced by the planner's training cost model.

An update on the layout's `train_gpus` takes `estimate_train(...)` seconds for the iteration's actual
token counts and sequence lengths (`TrainShape`); if that layout no longer fits in memory, the best
layout on the same GPUs (`best_train`) is used, as the planner's re-pricing does, and if none fits
that policy's run stops with UpdateDoesNotFit (an update that cannot run has no time); `simulate`
reports the policy as failed and goes on with the others. Progress is a
fraction of the update; elastic hybrids (whole data-parallel replicas, docs/elastic.md) change the
rate while it runs: with `g` GPUs the rate is `(min(g, n) + efficiency x max(0, g - n)) / n` of the
core rate, and fewer than `n` (hybrids not back yet) slows it proportionally.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.planner.search import best_train
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.train_cost import TrainLayout, TrainShape, estimate_train


class UpdateDoesNotFit(ValueError):
    """No training layout on the policy's training GPUs holds an iteration's update in memory: the
    policy cannot run this workload on this cluster (a result about the policy, not a bad input)."""


HYBRID_EFFICIENCY = 0.9  # a hybrid replica's share of a core replica's throughput (extra all-reduce)


def update_time_s(
    model: ModelSpec, hw: HardwareSpec, layout: TrainLayout, shape: TrainShape, who: str = "an update"
) -> float:
    """Seconds of one update of `shape` on `layout`'s GPUs (pipeline.try_start_train, per update).
    Raises a ValueError, opening with `who` (the policy and iteration), when no layout on those
    GPUs fits the update in memory; before 2026-12-06 the layout's time was used as if it did."""
    est = estimate_train(model, hw, layout, shape)
    if est.feasible:
        return est.time_s
    alt = best_train(model, hw, layout.num_gpus, shape)
    if alt is None:
        n = layout.num_gpus
        raise UpdateDoesNotFit(
            f"{who}: the training layout {layout.label()} needs {est.memory.total_bytes / 1e9:,.1f} GB "
            f"per GPU for sequences of up to {shape.max_seq_len:,.0f} tokens, where the GPU "
            f"({hw.name}) has {hw.mem_bytes / 1e9:,.1f} GB, and no layout on {n} GPU{'s' * (n > 1)} "
            "fits. Use more or larger GPUs, or shorter trajectories (max_total_tokens)"
        )
    return alt.time_s


@dataclass
class Trainer:
    """State of the update in progress (if any); times in seconds of simulated time."""

    train_gpus: int
    iteration: int = -1  # iteration whose data is being trained (-1: idle)
    remaining: float = 0.0  # fraction of the update left
    core_time_s: float = 0.0  # the update's time on exactly `train_gpus`
    gpus: float = 0.0  # GPUs currently working on it
    last_s: float = 0.0
    started_s: float = 0.0  # when the update in progress (or the last one) started its work
    version: int = 0
    busy_gpu_s: float = 0.0  # GPU-seconds spent training

    @property
    def busy(self) -> bool:
        return self.iteration >= 0

    def rate(self) -> float:
        n = self.train_gpus
        eff = min(self.gpus, n) + HYBRID_EFFICIENCY * max(0.0, self.gpus - n)
        return eff / n / self.core_time_s if self.core_time_s > 0 else float("inf")

    def advance(self, now_s: float) -> None:
        # Before `started_s` (a colocated update's switch) nothing trains and nothing is booked.
        since = max(self.last_s, self.started_s)
        if self.busy and now_s > since:
            self.remaining = max(0.0, self.remaining - (now_s - since) * self.rate())
            self.busy_gpu_s += (now_s - since) * self.gpus
        self.last_s = now_s

    def start(self, now_s: float, iteration: int, time_s: float, gpus: float, setup_s: float = 0.0) -> None:
        """Begin `iteration`'s update of `time_s` seconds on `gpus`, its work `setup_s` from now
        (colocated: the rollout engines sleep and the training states come back to HBM first; that
        wait is no training, so it is not booked busy)."""
        assert not self.busy, "an update is already running"
        self.iteration, self.remaining, self.core_time_s = iteration, 1.0, time_s
        self.gpus, self.last_s, self.started_s = gpus, now_s, now_s + setup_s
        self.version += 1

    def set_gpus(self, now_s: float, gpus: float) -> None:
        self.advance(now_s)
        self.gpus = gpus
        self.version += 1

    def done_s(self) -> float:
        r = self.rate()
        return max(self.last_s, self.started_s) + (self.remaining / r if r > 0 else float("inf"))

    def finish(self, now_s: float) -> int:
        self.advance(now_s)
        it, self.iteration = self.iteration, -1
        self.version += 1
        return it
