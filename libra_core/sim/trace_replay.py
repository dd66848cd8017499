"""Trace replay: the simulator's workload read from a trace Parquet file instead of a generator.

A trace (libra_core/traces/schema.py) is what `libra trace export` writes from a real run's
trajectory lake, or `libra trace synth` generates. Iteration k of a simulation replays the trace's
k-th recorded iteration (cycling when the simulation runs longer than the trace), with the tokens
of every turn as recorded. A tool call costs the wall time recorded for it (the trace's
`latency_s`: measured by the run, or drawn by `libra trace synth`), times
`TraceSpec.latency_scale`; a call the trace did not time (one exported before latencies were
kept) costs `TraceSpec.tool_latency_s`, `UNTIMED_TIMEOUT_FACTOR` times that if it timed out
(`TraceTrajectory.priced_latencies_s`, the rule `libra plan` prices a trace by).
`libra simulate --scenario PATH.parquet --spec FIELD=VALUE` changes `TraceSpec`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from libra_core.sim.trajectory import SimTrajectory
from libra_core.traces.schema import MAX_TOOL_LATENCY_S, UNTIMED_TIMEOUT_FACTOR, read_trace


@dataclass(frozen=True)
class TraceSpec:
    """What-ifs for a trace replay (`--spec` when the scenario is a trace)."""

    tool_latency_s: float = 1.0  # wall seconds of a tool call the trace did not time
    latency_scale: float = 1.0  # multiplies every recorded latency (tools slower or faster than the run's)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"trace replay: {f.name} must be a finite number >= 0, got {value}")
        # As a trace's recorded calls (traces/schema.py); `latency_scale` is bounded by the trace it
        # scales (`TraceWorkload`): a CPU run's microsecond calls may well be scaled by 1e6.
        if self.tool_latency_s > MAX_TOOL_LATENCY_S:
            raise ValueError(
                f"trace replay: tool_latency_s must be in [0, {MAX_TOOL_LATENCY_S:.0f}] (a day), "
                f"got {self.tool_latency_s:g}"
            )


class TraceWorkload:
    """Iteration -> trajectories replayed from a trace; the same trace gives the same iterations."""

    def __init__(self, path: str | Path, model: str, spec: TraceSpec | None = None) -> None:
        self.spec = spec or TraceSpec()
        rows = read_trace(path)
        self.name = Path(path).stem
        self.model = model
        self.timed_calls = 0  # tool calls whose latency the trace recorded
        self.untimed_calls = 0  # calls that cost `spec.tool_latency_s`
        by_iter: dict[int, list[SimTrajectory]] = {}
        longest_s = 0.0  # the longest recorded call
        for r in rows:
            calls = [x for u, x in zip(r.turns, r.turn_latencies_s(), strict=True) if u.tool]
            recorded = [x for x in calls if x is not None]
            longest_s = max(longest_s, *recorded) if recorded else longest_s
            self.timed_calls += len(recorded)
            self.untimed_calls += len(calls) - len(recorded)
            lat = r.priced_latencies_s(self.spec.tool_latency_s, self.spec.latency_scale)
            traj = SimTrajectory(r.trajectory_id, r.prompt_id, r.iteration, r.prompt_tokens, r.turns, lat)
            by_iter.setdefault(r.iteration, []).append(traj)
        if not by_iter:
            raise ValueError(f"trace {path} holds no trajectories; nothing to replay")
        scale = self.spec.latency_scale
        if longest_s * scale > MAX_TOOL_LATENCY_S:  # a wait no trace may record (a unit error)
            raise ValueError(
                f"trace replay: latency_scale {scale:g} makes the longest tool call of {path} "
                f"({longest_s:g} s) last {longest_s * scale:g} s, over a day; for this trace "
                f"latency_scale must be in [0, {MAX_TOOL_LATENCY_S / longest_s:g}]"
            )
        self._iters = [by_iter[k] for k in sorted(by_iter)]

    def describe(self) -> str:
        """One line for the report: what is replayed and where its tool latencies come from."""
        n = sum(len(ts) for ts in self._iters)
        calls = self.timed_calls + self.untimed_calls
        scaled = self.spec.latency_scale != 1.0 and self.timed_calls > 0
        recorded = f"their recorded latency{f' x{self.spec.latency_scale:g}' if scaled else ''}"
        untimed = f"{self.spec.tool_latency_s:g} s (x{UNTIMED_TIMEOUT_FACTOR:g} on a timeout)"
        if calls == 0:
            source = "no tool calls"
        elif self.untimed_calls == 0:
            source = f"all {calls:,} tool calls at {recorded}"
        elif self.timed_calls == 0:
            source = f"no tool call timed: each costs {untimed}"
        else:
            # the untimed ones' timeout factor was not said here until 2026-12-07
            source = f"{self.timed_calls:,} of {calls:,} tool calls at {recorded}, the rest {untimed} each"
        return (
            f"trace replay of {self.name}: {n:,} trajectories in {len(self._iters)} recorded iterations; "
            f"{source}"
        )

    def trajectories(self, iteration: int) -> list[SimTrajectory]:
        src = self._iters[iteration % len(self._iters)]
        return [
            SimTrajectory(
                f"{t.trajectory_id}@{iteration}",
                t.prompt_id,
                iteration,
                t.prompt_tokens,
                t.turns,
                t.tool_latency_s,
            )
            for t in src
        ]
