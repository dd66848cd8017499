"""Simulated workloads: where a run's trajectories come from, picked by the scenario's name.

A built-in scenario's generator (generator.py, its shape in scenarios.py) or a trace replayed from
a Parquet file (trace_replay.py). `load_scenario` builds either for `simulate` and the benchmarks;
`scenario_spec` and `spec_class` let a caller check a run's `--spec` pairs before a long task.
The generator's and the trajectory's names are re-exported here, where they lived before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.sim.generator import ScenarioWorkload
from libra_core.sim.scenarios import SCENARIOS, ScenarioSpec
from libra_core.sim.trajectory import SimTrajectory

if TYPE_CHECKING:
    from libra_core.sim.trace_replay import TraceSpec, TraceWorkload

__all__ = [
    "SCENARIOS",
    "ScenarioSpec",
    "ScenarioWorkload",
    "SimTrajectory",
    "is_trace",
    "load_scenario",
    "long_tail_share",
    "scenario_spec",
    "spec_class",
]


def is_trace(scenario: str | Path) -> bool:
    """Whether `scenario` names a trace file to replay rather than a built-in generator."""
    return isinstance(scenario, Path) or str(scenario).lower().endswith(".parquet")  # also x.PARQUET


def spec_class(scenario: str | Path) -> type:
    """The dataclass `--spec FIELD=VALUE` changes for `scenario`: `ScenarioSpec` for a generator,
    `trace_replay.TraceSpec` for a trace."""
    if is_trace(scenario):
        from libra_core.sim.trace_replay import TraceSpec

        return TraceSpec
    return ScenarioSpec


def scenario_spec(
    scenario: str | Path, model: str | None = None, spec_overrides: dict[str, Any] | None = None
) -> ScenarioSpec | TraceSpec:
    """The spec `load_scenario` runs `scenario` with: a built-in generator's `ScenarioSpec`, or a
    trace replay's `TraceSpec`, changed by `spec_overrides`. Reads no file and draws nothing, so a
    caller checks names, fields and ranges with it before a long task (ValueErrors)."""
    if is_trace(scenario):
        from libra_core.sim.trace_replay import TraceSpec

        valid = {f.name for f in fields(TraceSpec)}
        bad = sorted(set(spec_overrides or {}) - valid)
        if bad:
            raise ValueError(
                f"fields {bad} do not apply to a trace replay; a trace's --spec fields are {sorted(valid)}"
            )
        return TraceSpec(**(spec_overrides or {}))
    if scenario not in SCENARIOS:
        raise ValueError(
            f"unknown scenario {scenario!r}; valid: {sorted(SCENARIOS)} or a trace .parquet path"
        )
    spec = SCENARIOS[scenario]
    if model is not None:
        spec = replace(spec, model=model)
    if spec_overrides:
        spec = replace(spec, **spec_overrides)
    return spec


def load_scenario(
    scenario: str | Path,
    iterations: int,
    seed: int,
    model: str | None = None,
    spec_overrides: dict[str, Any] | None = None,
) -> ScenarioWorkload | TraceWorkload:
    """A scenario name (`SCENARIOS`) or a trace Parquet path; unknown names raise a ValueError.
    `spec_overrides` changes fields of the scenario's `spec_class` (a what-if)."""
    spec = scenario_spec(scenario, model, spec_overrides)
    if isinstance(spec, ScenarioSpec):
        return ScenarioWorkload(spec, iterations, seed)
    from libra_core.sim.trace_replay import TraceWorkload

    return TraceWorkload(scenario, model or "qwen3-8b", spec)


def long_tail_share(latencies_s: Sequence[float], top: float = 0.1) -> float:
    """Share of summed trajectory latency taken by the slowest `top` fraction."""
    xs = sorted(latencies_s, reverse=True)
    k = max(1, round(len(xs) * top))
    total = sum(xs)
    return sum(xs[:k]) / total if total > 0 else 0.0
