"""`SimTrajectory`: one trajectory as the simulator replays it, whichever workload made it.

A workload yields a list of them per iteration: the scenario generator (generator.py) draws them,
a trace replay (trace_replay.py) reads them from a trace. The engine replays each turn in order
(prefill and decode on an instance, then the turn's tool call for its latency), the planner prices
an iteration's list (`Simulator.workload_of_trajectories`), and the report measures their
latencies. Frozen: nothing changes a trajectory after its workload built it.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.scheduling.base import Turn


@dataclass(frozen=True, slots=True)
class SimTrajectory:
    """One trajectory to replay: its turns and the latency of each turn's tool call (0 on the last)."""

    trajectory_id: str
    prompt_id: str
    iteration: int
    prompt_tokens: int
    turns: tuple[Turn, ...]
    tool_latency_s: tuple[float, ...]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(t.gen_tokens + t.payload_tokens for t in self.turns)
