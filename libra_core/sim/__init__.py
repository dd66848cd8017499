"""Cluster-scale discrete-event simulator of agentic RL post-training (docs/simulator.md).

Reuses the real planner (cost model, search, replanning) and the real schedulers; never imports
Prefect. Entry point: `simulate(...) -> SimReport`; `format_table(report)` (markdown; the CLI prints it).
"""

from libra_core.sim.engine import Simulator
from libra_core.sim.policies import ABLATION, POLICIES, resolve_policies
from libra_core.sim.report import PolicyResult, SimReport, format_table
from libra_core.sim.settings import SimSettings
from libra_core.sim.simulate import simulate
from libra_core.sim.workloads import SCENARIOS, load_scenario

__all__ = [
    "ABLATION",
    "POLICIES",
    "SCENARIOS",
    "PolicyResult",
    "SimReport",
    "SimSettings",
    "Simulator",
    "format_table",
    "load_scenario",
    "resolve_policies",
    "simulate",
]
