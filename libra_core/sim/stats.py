"""What one simulated run records: per-iteration timings (`IterationRecord`) and run totals
(`RunStats`). The `Simulator` (engine.py) and its pipeline write them as events happen;
simulate.py and report.py read them once the run ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class IterationRecord:
    iteration: int
    rollout_start_s: float = 0.0
    rollout_end_s: float = 0.0
    train_end_s: float = 0.0
    train_s: float = 0.0  # the update's own wall time (start to end, before the weight sync)
    tokens: int = 0
    trajectories: int = 0
    moves: int = 0
    replan: str = ""
    t90_s: float = 0.0  # when 90% of the iteration's trajectories had finished
    # Per bucket, when the last trajectory whose final turn ran on one of its instances finished
    # (diagnostics: compare with the planner's group times, benchmarks/sim_diag.py).
    bucket_end_s: dict[int, float] = field(default_factory=dict)


@dataclass
class RunStats:
    records: list[IterationRecord] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    replans: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[str] = field(default_factory=list)
    roll_gpu_s: float = 0.0
    train_gpu_s: float = 0.0
    roll_busy_gpu_s: float = 0.0
    train_busy_gpu_s: float = 0.0
    events: int = 0
    lent_joins: int = 0
    hybrid_rollouts: int = 0
    hybrid_early_returns: int = 0  # hybrids sent back to training before the rollout ended (idle)
    mixed_gap: float | None = None  # the first deployment's (`Deployment.mixed_gap`)

    @property
    def makespan_s(self) -> float:
        """When the last update's weights were ready to serve: its end plus the weight sync (and, for
        colocated, the wake of the rollout engines); 0 before any iteration finished."""
        return self.records[-1].train_end_s if self.records else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Throughput: every iteration's tokens over the makespan (0 before any iteration finished)."""
        end = self.makespan_s
        return sum(r.tokens for r in self.records) / end if end > 0 else 0.0
