"""Entry point: simulate policies on a scenario and cluster (the `libra simulate` CLI calls this)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libra_core.planner.rollout_cost import RolloutCostModel, instance_tp_degrees
from libra_core.planner.specs import ClusterSpec, HardwareSpec, ModelSpec, get_model, parse_cluster
from libra_core.sim.engine import Simulator
from libra_core.sim.instance import CostTables
from libra_core.sim.policies import Deployment, PolicySpec, check_cluster_size, resolve_policies
from libra_core.sim.report import (
    PolicyFailure,
    PolicyResult,
    SimReport,
    lower_bound_s,
    tail_share,
    write_problem,
)
from libra_core.sim.settings import SimSettings
from libra_core.sim.stats import IterationRecord, RunStats
from libra_core.sim.training import UpdateDoesNotFit
from libra_core.sim.workloads import is_trace, load_scenario

log = logging.getLogger(__name__)


def tail_time_share(records: list[IterationRecord]) -> float:
    """Mean over iterations of the share of rollout wall time spent after 90% of the trajectories
    had finished (the slowest 10% alone)."""
    shares = [
        (r.rollout_end_s - r.t90_s) / (r.rollout_end_s - r.rollout_start_s)
        for r in records
        if r.rollout_end_s > r.rollout_start_s and r.t90_s > 0
    ]
    return sum(shares) / len(shares) if shares else 0.0


def _result(name: str, st: RunStats, wall_s: float) -> PolicyResult:
    ends = [r.train_end_s for r in st.records]
    makespan = st.makespan_s
    iters = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    return PolicyResult(
        policy=name,
        tokens_per_s=st.tokens_per_s,
        makespan_s=makespan,
        mean_iteration_s=makespan / max(1, len(ends)),
        rollout_idle_share=1.0 - st.roll_busy_gpu_s / st.roll_gpu_s if st.roll_gpu_s > 0 else 0.0,
        train_idle_share=1.0 - st.train_busy_gpu_s / st.train_gpu_s if st.train_gpu_s > 0 else 0.0,
        moves=sum(r.moves for r in st.records),
        replans_applied=sum(1 for d in st.replans if d["action"] in ("apply", "revert")),  # moves
        long_tail_share=tail_share(st.latencies_s),
        tail_time_share=tail_time_share(st.records),
        first_deployment=st.deployments[0],
        last_deployment=st.deployments[-1],
        events=st.events,
        wall_s=wall_s,
        lent_joins=st.lent_joins,
        hybrid_rollouts=st.hybrid_rollouts,
        iteration_s=iters,
        replans=st.replans,
        mixed_gap=st.mixed_gap,
    )


LOWER_BOUND = "lower bound"  # the progress stage of the lower bound's pass over the workload


def _ticker(progress: Callable[[str, int, int], None], stage: str, total: int) -> Callable[[int], None]:
    """Announce `stage` as starting (done 0) and return its per-iteration callback."""
    progress(stage, 0, total)
    return lambda done: progress(stage, done, total)


def scenario_lower_bound(
    wl: Any,
    iterations: int,
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    on_iteration: Callable[[int], None] | None = None,
    max_num_seqs: int = SimSettings().max_num_seqs,
) -> tuple[float, int, float, float]:
    """`report.lower_bound_s` over `iterations` of workload `wl` (seconds, tokens, work s, path s),
    on the cost model's tables for every TP degree an instance can run, with the batch the
    simulated instances run (`max_num_seqs`: a larger batch decodes a token for fewer
    GPU-seconds); `on_iteration(k)` after the k-th iteration's share."""
    tps = instance_tp_degrees(model, hw)
    tables = CostTables(RolloutCostModel(model, hw, max_num_seqs), tps)

    def iters() -> Iterator[list[Any]]:
        for j in range(iterations):
            if j > 0 and on_iteration is not None:
                on_iteration(j)
            yield wl.trajectories(j)

    bound = lower_bound_s(iters(), model, hw, num_gpus, tables, tps)
    if on_iteration is not None:
        on_iteration(iterations)
    return bound


@dataclass(frozen=True)
class SimRun:
    """The inputs every policy of one `simulate` call shares, as the caller gave them: small and
    picklable, so a worker process (`jobs.py`) rebuilds the workload and specs from them."""

    scenario: str | Path
    hardware: str
    iterations: int
    seed: int = 0
    model: str | None = None
    settings: SimSettings | None = None
    spec_overrides: dict[str, Any] | None = None

    def load(self) -> tuple[ClusterSpec, Any, ModelSpec, HardwareSpec]:
        """(cluster, workload, model, hardware with the settings' what-ifs); bad names raise."""
        cluster = parse_cluster(self.hardware)
        wl = load_scenario(self.scenario, self.iterations, self.seed, self.model, self.spec_overrides)
        return cluster, wl, get_model(wl.model), (self.settings or SimSettings()).hardware(cluster.hardware)


def first_deployment(
    run: SimRun, loaded: tuple[ClusterSpec, Any, ModelSpec, HardwareSpec], spec: PolicySpec
) -> tuple[Deployment, float]:
    """(`spec`'s deployment for iteration 0, seconds it took): what its `Simulator` would build
    (the planner's search, and with `rerank_plans` the candidates' simulations). `simulate` builds
    every policy's before it runs any, so one that cannot deploy on the cluster (a ValueError that
    names it) stops the run before the others have spent their time."""
    cluster, wl, mspec, hw = loaded
    t0 = time.perf_counter()
    try:
        sim = Simulator(spec, wl, mspec, hw, cluster.num_gpus, run.iterations, run.settings)
    except ValueError as err:  # the planner's and the layouts' messages do not know the policy
        raise ValueError(f"policy {spec.name} cannot deploy: {err}") from err
    assert sim.dep is not None, "a Simulator deploys as it is built"
    return sim.dep, time.perf_counter() - t0


def run_policy(
    run: SimRun,
    loaded: tuple[ClusterSpec, Any, ModelSpec, HardwareSpec],
    spec: PolicySpec,
    progress: Callable[[str, int, int], None] | None = None,
    deployment: tuple[Deployment, float] | None = None,
) -> PolicyResult | PolicyFailure:
    """Simulate `spec` on `run.load()` (every random draw is the workload's, seeded by the run),
    from `deployment` (`first_deployment`'s, whose seconds count in the wall time) if given; a
    PolicyFailure when an iteration's update fits no training layout of the policy."""
    cluster, wl, mspec, hw = loaded
    t0 = time.perf_counter()
    tick = None if progress is None else _ticker(progress, spec.name, run.iterations)
    dep, setup_s = deployment or (None, 0.0)
    sim = Simulator(
        spec,
        wl,
        mspec,
        hw,
        cluster.num_gpus,
        run.iterations,
        run.settings,
        deployment=dep,
        on_iteration=tick,
    )
    try:
        stats = sim.run()
    except UpdateDoesNotFit as err:
        log.info("%s could not run: %s", spec.name, err)  # the report says so
        return PolicyFailure(spec.name, str(err))
    result = _result(spec.name, stats, setup_s + time.perf_counter() - t0)
    log.info("%s: %.0f tok/s in %.1fs wall", spec.name, result.tokens_per_s, result.wall_s)
    return result


def simulate(
    scenario: str | Path,
    hardware: str,
    iterations: int,
    policies: list[str],
    seed: int = 0,
    out_dir: str | Path | None = None,
    model: str | None = None,
    settings: SimSettings | None = None,
    spec_overrides: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    jobs: int = 1,
) -> SimReport:
    """Simulate each policy on the same workload (same seed) and cluster; write outputs to `out_dir`.

    `scenario`: a name in `workloads.SCENARIOS` or a trace Parquet path; `hardware`: `COUNTxGPU`
    (e.g. `48xA800`); `policies`: names in `policies.POLICIES`, `libra` or `all`; `settings`: the
    simulator's knobs; `spec_overrides`: changed fields of the scenario's generator (overrides.py);
    `progress(stage, done, total)`: called on this thread with `stage` a policy's name (then
    `LOWER_BOUND`), `done` = 0 as it starts and 1..`iterations` as each of its iterations ends
    (the CLI's bars, the flow's progress artifact); `jobs`: policies simulated at once, each in
    its own process (the same results as one at a time; with several, stages report interleaved).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if seed < 0:  # as `libra simulate --seed` refuses it
        raise ValueError(f"seed must be >= 0, got {seed}")
    run = SimRun(scenario, hardware, iterations, seed, model, settings, spec_overrides)
    specs = resolve_policies(policies)
    if not specs:
        raise ValueError("no policy to simulate; give policy names or `all`")
    problem = out_dir is not None and write_problem(Path(out_dir))
    if problem:  # before the simulation, not after it
        raise ValueError(problem)
    loaded = run.load()
    cluster, wl, mspec, hw = loaded
    check_cluster_size(specs, cluster.num_gpus)
    deployments = [first_deployment(run, loaded, spec) for spec in specs]
    if jobs > 1 and len(specs) > 1:
        from libra_core.sim.jobs import run_in_processes

        ran = run_in_processes(run, specs, jobs, progress, deployments)
    else:
        # One at a time, each run freed (its C-MLFQ tree is the largest live structure) before the
        # next and before the lower bound's pass, whose garbage collections would rescan it.
        ran = [
            run_policy(run, loaded, spec, progress, dep) for spec, dep in zip(specs, deployments, strict=True)
        ]
    results = [r for r in ran if isinstance(r, PolicyResult)]
    failures = [r for r in ran if isinstance(r, PolicyFailure)]
    if not results:  # nothing to report: the reasons are the answer
        raise ValueError("; ".join(f"{f.policy} could not run: {f.reason}" for f in failures))
    lb_s, tokens, work_s, path_s = scenario_lower_bound(
        wl,
        iterations,
        mspec,
        hw,
        cluster.num_gpus,
        None if progress is None else _ticker(progress, LOWER_BOUND, iterations),
        (settings or SimSettings()).max_num_seqs,
    )
    report = SimReport(
        str(scenario),
        cluster.label,
        mspec.name,
        iterations,
        None if is_trace(scenario) else seed,  # a replay draws nothing: no seed shapes it
        lb_s,
        tokens / lb_s if lb_s > 0 else 0.0,
        results,
        work_s,
        path_s,
        wl.describe(),
        hw.model_dump(),  # with the settings' serving overheads, as simulated
        mspec.model_dump(),
        asdict(settings or SimSettings()),
        dict(spec_overrides or {}),
        failures,
    )
    if out_dir is not None:
        report.write(Path(out_dir))
    return report
