"""Deployments of the experiment and simulate flows, served by this process (`libra serve`).

Import this module only after PREFECT_API_URL points at the server (Prefect reads it on import).
A run started from the UI (or the API, or the nightly schedule) executes `rl_experiment` with the
deployment's parameters, the same flow `libra run` calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.schedules import Cron

from flows.rl_experiment import rl_experiment
from flows.simulate_flow import simulate_flow
from libra_core.config.models import LibraConfig

EXPERIMENT_DEPLOYMENT = "experiment"
SIMULATE_DEPLOYMENT = "simulate"


def experiment_parameters(config_path: str | None, overrides: list[str]) -> dict[str, Any]:
    """Default parameters of the experiment deployment. `base_dir`, this process's working folder
    now, is where the run resolves relative paths (`config_path`, `resume`, and the
    `experiment.output_dir` of whichever config a UI run loads), so runs started by the server do
    not depend on its working folder when they run, and a run given another `config_path` in the
    UI writes under that config's `output_dir`, not the served one's."""
    return {
        "config_path": str(Path(config_path).resolve()) if config_path else None,
        "overrides": list(overrides),
        "base_dir": str(Path.cwd()),
    }


def simulate_parameters() -> dict[str, Any]:
    """Default parameters of the simulate deployment: its default `out_dir`,
    `runs/simulate/SCENARIO-TIMESTAMP`, and a relative one given in the UI, land under this
    process's working folder now (`base_dir`)."""
    return {"out_dir": None, "base_dir": str(Path.cwd())}


def build_deployments(config_path: str | None, overrides: list[str], cfg: LibraConfig) -> list[Any]:
    sched = cfg.schedule
    schedules = [Cron(sched.cron, timezone=sched.timezone, active=sched.active)] if sched.cron else []
    experiment = rl_experiment.to_deployment(
        name=EXPERIMENT_DEPLOYMENT,
        parameters=experiment_parameters(config_path, overrides),
        schedules=schedules,
        description=f"RL experiment {cfg.experiment.name!r} from {config_path or 'defaults'}",
        tags=["libra", cfg.experiment.name],
    )
    sim = simulate_flow.to_deployment(
        name=SIMULATE_DEPLOYMENT,
        parameters=simulate_parameters(),
        description="Cluster-scale what-if simulation of Libra and the baselines (docs/simulator.md)",
        tags=["libra", "simulate"],
    )
    return [experiment, sim]


def serve_forever(deployments: list[Any], limit: int) -> None:
    """Register the deployments and execute their runs here (blocks until interrupted; the runs in
    progress then end their own way first: flows/serve_shutdown.py). Runs an earlier serve process
    left RUNNING (killed outright) are marked Crashed first, CANCELLING ones Cancelled:
    flows/serve_orphans.py; runs it
    scheduled get this serve's parameters: flows/serve_schedule_refresh.py."""
    from flows.serve_orphans import mark_orphaned_runs
    from flows.serve_schedule_refresh import refresh_scheduled_runs
    from flows.serve_shutdown import serve_until_interrupted

    mark_orphaned_runs([d.full_name for d in deployments])
    refresh_scheduled_runs(deployments)
    serve_until_interrupted(deployments, limit)
