"""Small builders for simulator tests: one seeded `Simulator` from a scenario name and a policy."""

from __future__ import annotations

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import load_scenario

# The planner's prices before the fourteenth session: one-degree layouts as one range, the critical
# path at the KV-capped batch for its whole life. Tests of mechanisms that exist to recover from
# those prices' failures (re-ranking, the audit, a mixed layout's moves) run on them.
OLD_PRICES = SimSettings(one_degree_dp=False, two_phase_path=False)

# The generators' shapes before the fifteenth session (no per-prompt tool-latency spread; dapo-math
# with longer, less spread turns). Tests whose case was found on those workloads (a replan that ran
# slower, a move that pays) keep them: the mechanism is what they test, not the built-in shape.
OLD_SHAPES: dict[str, dict[str, float]] = {
    "r2e-gym": {"prompt_latency_sigma": 0.0},
    "search-r1": {"prompt_latency_sigma": 0.0},
    "dapo-math": {"prompt_latency_sigma": 0.0, "gen_median": 1800.0, "turn_sigma": 0.6},
}


def build_sim(
    scenario: str,
    policy: str,
    iterations: int = 1,
    *,
    settings: SimSettings | None = None,
    drift_iterations: int | None = None,
    gpus: str | None = None,
    record_events: bool = False,
    **spec: float,
) -> Simulator:
    """Seed 0; `tiny` on 8xA800, the others on 48xA800. The workload's drift is spread over
    `drift_iterations` (default: the iterations simulated); `spec` changes generator fields."""
    cluster = parse_cluster(gpus or ("8xA800" if scenario == "tiny" else "48xA800"))
    wl = load_scenario(scenario, drift_iterations or iterations, 0, spec_overrides=spec or None)
    return Simulator(
        resolve_policies([policy])[0],
        wl,
        get_model(wl.model),
        cluster.hardware,
        cluster.num_gpus,
        iterations,
        settings=settings,
        record_events=record_events,
    )
