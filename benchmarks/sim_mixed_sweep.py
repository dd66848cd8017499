"""Static mixed-TP layouts simulated by brute force: can any two-degree layout beat one degree?

    .venv/bin/python benchmarks/sim_mixed_sweep.py [--scenario r2e-gym] [--iterations 10]
        [--rollout-gpus 28 32 36] [--shares 0.5 0.75 0.9] [--schedulers cmlfq oracle]
        [--setting FIELD=VALUE ...] [--spec FIELD=VALUE ...] [--top 8] [--jobs 2]

The R2E-Gym ablation's `+hetero-tp` and `+cmlfq` tie `+planning` because the planner keeps one TP
degree (docs/simulator-notebook.md). That could be the planner's price missing a mixed layout that
runs faster, or the cost model's physics leaving no mixed layout that does. This separates the two
without the planner: for each rollout GPU count (training gets the rest, on the layout the cost
model prices best), it simulates

- every one-degree layout (one bucket, least-load routing: what `static-optimal` runs), and
- every two-degree layout `n_a x TP a + n_b x TP b` (a < b, both counts >= 1, every GPU used) with
  two buckets: trajectories of at most the bound's total tokens (prompt + generated + tool payload)
  in the TP-a bucket, the rest in the TP-b bucket. The bound is the `--shares` quantile of iteration
  0's trajectory lengths. Each runs under each of `--schedulers` (`cmlfq`: admission to the short
  bucket, moves at tool returns by the prefix tree; `oracle`: each trajectory admitted to the bucket
  of its final length, the routing no scheduler can beat at admission).

Layouts are static (no replanning, no elastic pool), seed 0, so the numbers compare layouts and
routing only. The last line says how far the best mixed layout is from the best one-degree layout.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from libra_core.planner.rollout_cost import instance_tp_degrees
from libra_core.planner.search import best_train
from libra_core.planner.specs import HardwareSpec, ModelSpec, get_model, parse_cluster
from libra_core.planner.train_cost import TrainShape
from libra_core.sim.engine import Simulator
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import OPEN_BOUND, Deployment, PolicySpec
from libra_core.sim.settings import SimSettings
from libra_core.sim.trace_replay import TraceWorkload
from libra_core.sim.workloads import SCENARIOS, ScenarioSpec, ScenarioWorkload, load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, add_overrides, positive_int  # noqa: E402

ONE_DEGREE = PolicySpec("one-degree")  # least-load routing over one bucket, no replanning


@dataclass(frozen=True)
class Case:
    """One simulation of the sweep: a layout, its bucket bound and the router's scheduler."""

    dep: Deployment
    scheduler: str  # "least_load" for one bucket
    share: float | None  # the quantile the bound was taken at (None for one bucket)


@dataclass(frozen=True)
class Job:
    scenario: str
    iterations: int
    hardware: str
    settings: tuple[str, ...]
    spec: tuple[str, ...]


def two_degree_layouts(degrees: tuple[int, ...], rollout_gpus: int) -> list[tuple[int, int, int, int]]:
    """(a, n_a, b, n_b) with a < b from `degrees`, n_a, n_b >= 1 and n_a a + n_b b = rollout_gpus."""
    out = []
    for i, a in enumerate(degrees):
        for b in degrees[i + 1 :]:
            for n_b in range(1, rollout_gpus // b + 1):
                rest = rollout_gpus - n_b * b
                if rest >= a and rest % a == 0:
                    out.append((a, rest // a, b, n_b))
    return out


def share_bound(lengths: list[int], share: float) -> int:
    """The total-token bound under which `share` of the trajectories fall (the short bucket's)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"--shares must lie strictly between 0 and 1, got {share}")
    return int(np.quantile(np.asarray(lengths, dtype=float), share))


def _inputs(job: Job) -> tuple[ScenarioWorkload | TraceWorkload, ModelSpec, HardwareSpec, int, SimSettings]:
    settings = SimSettings(**parse_overrides(list(job.settings), SimSettings, "--setting"))
    spec = parse_overrides(list(job.spec), ScenarioSpec, "--spec")
    cluster = parse_cluster(job.hardware)
    wl = load_scenario(job.scenario, job.iterations, 0, spec_overrides=spec)
    return wl, get_model(wl.model), cluster.hardware, cluster.num_gpus, settings


def simulate_case(job: Job, case: Case) -> float:
    """tok/s of `case` over the job's iterations (seed 0)."""
    wl, model, hw, num_gpus, settings = _inputs(job)
    policy = (
        ONE_DEGREE
        if case.scheduler == "least_load"
        else PolicySpec(f"mixed-{case.scheduler}", hetero=True, scheduler=case.scheduler)
    )
    sim = Simulator(policy, wl, model, hw, num_gpus, job.iterations, settings, deployment=case.dep)
    return sim.run().tokens_per_s


def cases(job: Job, rollout_counts: list[int], shares: list[float], schedulers: list[str]) -> list[Case]:
    wl, model, hw, num_gpus, settings = _inputs(job)
    trajs = wl.trajectories(0)
    lengths = [t.total_tokens for t in trajs]  # what the oracle admits by
    # The planner's view of iteration 0 (for the training shape) comes from a simulator; building one
    # plans its first layout, once per sweep.
    probe = Simulator(ONE_DEGREE, wl, model, hw, num_gpus, 1, settings, deployment=None)
    shape = TrainShape.from_workload(probe.workload_of_trajectories(trajs))
    degrees = instance_tp_degrees(model, hw)
    out = []
    for roll in rollout_counts:
        if not 0 < roll < num_gpus:
            raise ValueError(f"--rollout-gpus must lie between 1 and {num_gpus - 1}, got {roll}")
        train = best_train(model, hw, num_gpus - roll, shape)
        if train is None:
            print(f"skipped {roll} rollout GPUs: the model does not train on {num_gpus - roll}")
            continue
        for tp in degrees:
            if roll % tp == 0:
                inst = tuple((tp, 0) for _ in range(roll // tp))
                dep = Deployment(num_gpus - roll, train.layout, inst, (OPEN_BOUND,), roll)
                out.append(Case(dep, "least_load", None))
        for a, n_a, b, n_b in two_degree_layouts(degrees, roll):
            inst = tuple([(a, 0)] * n_a + [(b, 1)] * n_b)
            for share in shares:
                dep = Deployment(num_gpus - roll, train.layout, inst, (share_bound(lengths, share),), roll)
                out.extend(Case(dep, s, share) for s in schedulers)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="r2e-gym", choices=sorted(SCENARIOS))
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--iterations", type=positive_int, default=10)
    ap.add_argument("--rollout-gpus", type=int, nargs="+", action=ExtendList, default=[28, 32, 36])
    ap.add_argument("--shares", type=float, nargs="+", action=ExtendList, default=[0.5, 0.75, 0.9])
    routings = ["cmlfq", "mlfq", "oracle"]
    ap.add_argument(
        "--schedulers", nargs="+", action=ExtendList, default=["cmlfq", "oracle"], choices=routings
    )
    add_overrides(ap)
    ap.add_argument("--top", type=positive_int, default=8, help="fastest layouts printed")
    ap.add_argument("--jobs", type=positive_int, default=1, help="simulations run side by side")
    args = ap.parse_args(argv)
    bad = [x for x in args.shares if not 0.0 < x < 1.0]
    if bad:
        ap.error(f"--shares must lie strictly between 0 and 1, got {bad}")
    job = Job(args.scenario, args.iterations, args.hardware, tuple(args.setting), tuple(args.spec))
    try:
        todo = cases(job, args.rollout_gpus, args.shares, args.schedulers)
    except ValueError as e:
        ap.error(str(e))
    if not todo:
        ap.error("no layout to simulate: no --rollout-gpus count leaves GPUs the model trains on")
    print(f"{len(todo)} simulations of {args.iterations} iterations")
    run = partial(simulate_case, job)
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        results = pool.map(run, todo) if pool else map(run, todo)
        rates = []
        for rate in results:  # in order, as they finish
            rates.append(rate)
            print(f"\r{len(rates)}/{len(todo)} simulated", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    rows = sorted(zip(rates, todo, strict=True), key=lambda r: -r[0])
    what = " ".join(args.setting + args.spec) or "default"
    print(f"{args.scenario}, {args.hardware}, {args.iterations} iterations, seed 0, settings: {what}")
    print("| layout | bound (share) | routing | tok/s |")
    print("|---|---|---|---:|")
    for rate, c in rows[: args.top]:
        bound = "one bucket" if c.share is None else f"{c.dep.bucket_bounds[0]:,} ({c.share:.0%})"
        label = c.dep.label().replace(" | ", "; ")
        print(f"| {label} | {bound} | {c.scheduler} | {rate:,.0f} |")
    ones = [r for r, c in rows if c.share is None]
    if not ones or len(ones) == len(rows):
        print("no comparison: these rollout GPU counts give no one-degree or no two-degree layout")
        return
    one = ones[0]  # rows are sorted fastest first
    for s in args.schedulers:
        best, c = next((r, c) for r, c in rows if c.scheduler == s)
        print(
            f"best {s} mixed layout: {c.dep.label()}, bound {c.dep.bucket_bounds[0]:,} ({c.share:.0%})"
            f" at {best:,.0f} tok/s, {best / one - 1:+.1%}"
            f" against the best one-degree layout ({one:,.0f})"
        )


if __name__ == "__main__":
    main()
