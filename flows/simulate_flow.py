"""The simulate flow: `libra simulate` as a Prefect flow, so it can be deployed and scheduled.

Same inputs and same numbers as `libra simulate` (one task runs every policy on the same seeded
workload); writes summary.json and the CSVs under `out_dir` and attaches the comparison table to
the flow run as a markdown artifact. All simulation logic lives in libra_core.sim.
"""

from __future__ import annotations

import base64
from datetime import datetime
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from flows.cli_common import output_problem
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim import SimReport, SimSettings, format_table, resolve_policies, simulate
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import check_cluster_size
from libra_core.sim.report import format_verdicts, write_problem
from libra_core.sim.workloads import is_trace, scenario_spec, spec_class
from libra_core.traces.schema import read_trace
from tasks.common import TASK_OPTIONS


class _ArtifactProgress:
    """`simulate`'s progress as one progress artifact on the task run (percent of all the policies'
    iterations and the lower bound's pass), written when the whole percent changes: at most ~100
    API calls however long the run."""

    def __init__(self, stages: int, iterations: int, description: str) -> None:
        self.total = stages * iterations
        self.done: dict[str, int] = {}  # per stage: with several jobs, stages report interleaved
        self.percent = 0
        # Called from a sync task, so it returns the id (its async twin would return a coroutine).
        self.artifact_id = cast(UUID, create_progress_artifact(progress=0.0, description=description))

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.done[stage] = done
        percent = int(100 * sum(self.done.values()) / max(1, self.total))
        if percent > self.percent:
            self.percent = percent
            update_progress_artifact(self.artifact_id, progress=float(min(100, percent)))


@task(name="simulate-policies", **TASK_OPTIONS)
def simulate_task(
    scenario: str,
    hardware: str,
    iterations: int,
    policies: list[str],
    seed: int,
    settings: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    jobs: int = 1,
    model: str | None = None,
) -> SimReport:
    stages = len(resolve_policies(policies)) + 1  # and the lower bound
    progress = _ArtifactProgress(stages, iterations, f"Simulating {scenario} on {hardware}: iterations done")
    return simulate(
        scenario,
        hardware,
        iterations,
        policies,
        seed=seed,
        settings=SimSettings(**(settings or {})),
        spec_overrides=spec or None,
        progress=progress,
        jobs=jobs,
        model=model,
    )


def _under(base: Path, path: str) -> Path:
    """`path` as an absolute folder, resolved against `base` when relative."""
    return (base / Path(path).expanduser()).resolve()


def _claim_run_folder(parent: Path, stem: str) -> Path:
    """A new folder `parent/STEM-TIMESTAMP` (`-2`, `-3`, ... after it if taken), created now, before
    the simulation: two runs started in the same second no longer write into one folder."""
    problem = output_problem(parent, folder=True)
    if problem:
        raise ValueError(f"out_dir: {problem}")
    parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = parent / f"{stem}-{stamp}" if n == 1 else parent / f"{stem}-{stamp}-{n}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ValueError(f"out_dir: 999 runs of {stem} at {stamp} already in {parent}; give out_dir")


@flow(name="simulate", flow_run_name="simulate-{scenario}-{hardware}", log_prints=False)
def simulate_flow(
    scenario: str = "r2e-gym",
    hardware: str = "48xA800",
    iterations: int = 20,
    policies: str = "all",
    seed: int = 0,
    out_dir: str | None = None,
    settings: list[str] | None = None,
    spec: list[str] | None = None,
    jobs: int = 1,
    model: str | None = None,
    base_dir: str | None = None,
) -> str:
    """Simulate each policy on the same seeded workload; returns the output folder.

    `settings` / `spec`: what-if `FIELD=VALUE` changes to the simulator's `SimSettings` and to the
    scenario generator's `ScenarioSpec` (a trace's replay: `TraceSpec`), as `libra simulate
    --setting/--spec` takes them; `jobs`: policies simulated at once, each in its own process (the
    same numbers as one at a time); `model`: a model spec name, or a Hugging Face config.json or model
    spec YAML file (None: the scenario's); `hardware`'s GPU may be a hardware spec YAML file.
    `out_dir` (None: a new folder `runs/simulate/SCENARIO-TIMESTAMP`, made as the flow starts, with
    `-2`, `-3`... if that is taken) is resolved against `base_dir` when relative: `libra serve` sets
    that to its working folder at start, so where a served run writes does not depend on the working
    folder at the time it runs; None: this process's.

    Args:
        scenario: r2e-gym, search-r1, dapo-math or tiny, or a trace .parquet file to replay.
        hardware: the cluster, COUNTxGPU (48xA800; the GPU may be a hardware spec YAML file).
        iterations: RL iterations simulated per policy.
        policies: comma-separated policy names, or all.
        seed: the generated workload's seed (a trace replays as recorded).
        out_dir: the output folder (None: runs/simulate/SCENARIO-TIMESTAMP).
        settings: FIELD=VALUE what-if changes to the simulator's settings.
        spec: FIELD=VALUE changes to the scenario generator (or the trace replay).
        jobs: policies simulated at once, each in its own process.
        model: a model spec name or file (None: the scenario's model).
        base_dir: the folder a relative out_dir is resolved against (None: this process's).
    """
    if is_trace(scenario):
        # checked and read as the same file: the task got the unexpanded `~/t.parquet` (until
        # 2026-12-06), which the check had accepted and the reader could not find
        scenario = str(Path(scenario).expanduser())
    # As `libra simulate` reads `--policies`: "greedy, +elastic" names two policies.
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise ValueError(f"policies names no policy ({policies!r}); give names or `all`")
    # Every input fails here, before the task runs (the same checks as `libra simulate`).
    for name, value, least in (("iterations", iterations, 1), ("jobs", jobs, 1), ("seed", seed, 0)):
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    # an unknown GPU, a bad spec file, or a cluster too small for a policy (every one but colocated
    # needs 2 GPUs; until 2026-12-07 that failed inside the task) fails here too
    check_cluster_size(resolve_policies(names), parse_cluster(hardware).num_gpus)
    if model is not None:
        get_model(model)
    knobs = parse_overrides(settings or [], SimSettings, "settings")
    SimSettings(**knobs)  # range checks
    shape = parse_overrides(spec or [], spec_class(scenario), "spec")
    scenario_spec(scenario, model, shape)  # the name, and the spec's ranges
    if is_trace(scenario) and not Path(scenario).is_file():
        raise ValueError(f"scenario {scenario!r}: no such trace file")
    if is_trace(scenario):
        read_trace(scenario)  # a TraceSchemaError (a ValueError) naming the problem, before the task
    if is_trace(scenario) and seed != 0:  # as `libra simulate --seed` says it
        get_run_logger().warning("seed %d has no effect on a trace replay (%s)", seed, scenario)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if out_dir is not None:
        # an empty out_dir is refused as such, not taken for base_dir itself
        problem = output_problem(out_dir.strip() and _under(base, out_dir), folder=True)
        problem = problem or write_problem(_under(base, out_dir))
        if problem:  # before the simulation, not after it
            raise ValueError(f"out_dir: {problem}")
        out = _under(base, out_dir)
    else:
        out = _claim_run_folder(_under(base, str(Path("runs") / "simulate")), Path(scenario).stem)
    report = None
    try:
        report = simulate_task(scenario, hardware, iterations, names, seed, knobs, shape, jobs, model)
    finally:
        if report is None and out_dir is None and not any(out.iterdir()):
            out.rmdir()  # the folder claimed for this run, left empty by its failure
    report.write(out)
    images = [
        f"![{png.stem}](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode('ascii')})"
        for png in sorted(out.glob("*.png"))
    ]
    create_markdown_artifact(
        markdown="\n\n".join([format_table(report), *format_verdicts(report), *images, f"Outputs: `{out}`"]),
        description=f"Simulated {scenario} on {hardware}",
    )
    return str(out)
