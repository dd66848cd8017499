"""Simulation results: per-policy metrics, the lower bound, tables, JSON and CSV output.

Throughput is trained tokens (prompt + generated + tool payload, what the planner counts) over the
time the last update's weights are ready. Idle shares are per side: 1 - busy GPU-seconds / GPU-seconds
the side held (rollout busy = an instance has a running sequence, prefill included; training busy =
an update runs on the GPU; a colocated update's switches are not). The lower bound of a scenario is
the larger of two: the work bound, all GPU-seconds of work over the cluster with no straggler and no
pipeline dependency (rollout decode at the largest batch and the shortest context of the iteration
on the most efficient TP degree, prefill of prompts and payloads likewise, training FLOPs at
`train_mfu`: `train_lower_bound_s`), and the path bound, the slowest trajectory of every rollout
plus the last update.
"""

from __future__ import annotations

import csv
import functools
import json
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from libra_core.data.atomic import atomic_path
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.train_cost import TrainShape, train_lower_bound_s
from libra_core.sim.instance import CostTables
from libra_core.sim.policies import ABLATION
from libra_core.sim.trajectory import SimTrajectory
from libra_core.sim.workloads import long_tail_share

# `plots.figures`'s files (named here: plots.py imports matplotlib, this module stays light).
PLOT_FILES = ("throughput.png", "iterations.png")

PAPER = {
    "r2e-gym": "paper (48xA800, R2E-Gym ablation): 423 -> 510 (+planning) -> 551 (+hetero TP) -> 666 "
    "(+C-MLFQ) -> 763 (+elastic) tok/s",
    "search-r1": "paper (48xA800, Search-R1): Libra ~2,700 tok/s; +63% / +80% / +300% over baselines",
    "dapo-math": "paper: 3.0-4.2x throughput over baselines across workloads",
}


@dataclass
class PolicyResult:
    policy: str
    tokens_per_s: float
    makespan_s: float
    mean_iteration_s: float
    rollout_idle_share: float
    train_idle_share: float
    moves: int
    replans_applied: int
    long_tail_share: float  # share of summed trajectory latency taken by the slowest 10%
    tail_time_share: float  # share of rollout wall time after 90% of trajectories finished
    first_deployment: str
    last_deployment: str
    events: int
    wall_s: float
    lent_joins: int = 0
    hybrid_rollouts: int = 0
    iteration_s: list[float] = field(default_factory=list)  # time between consecutive weight versions
    replans: list[dict[str, Any]] = field(default_factory=list)
    # Heterogeneous policies: at iteration 0, the planner's best mixed-TP price over its best
    # one-degree price, minus 1 (0.02: mixed priced 2% slower); None otherwise.
    mixed_gap: float | None = None


@dataclass(frozen=True)
class PolicyFailure:
    """A policy that could not run the workload to its end (`training.UpdateDoesNotFit`): which,
    and why, naming the iteration. Its row in the table says so; the claims it is part of are not
    compared."""

    policy: str
    reason: str


@dataclass
class SimReport:
    scenario: str
    hardware: str
    model: str
    iterations: int
    seed: int | None  # None: a trace replay, which draws nothing
    lower_bound_s: float
    lower_bound_tokens_per_s: float
    results: list[PolicyResult]
    lower_bound_work_s: float = 0.0  # GPU-seconds of work / GPUs
    lower_bound_path_s: float = 0.0  # sum of the slowest trajectory per rollout (+ last update)
    workload: str = ""  # what was simulated, one line (`describe()` of the workload)
    # The resolved specs simulated (HardwareSpec, ModelSpec fields; the hardware with the settings'
    # serving overheads): a run from a spec file stays reproducible from summary.json after the
    # file changes.
    hardware_spec: dict[str, Any] = field(default_factory=dict)
    model_spec: dict[str, Any] = field(default_factory=dict)
    # The what-ifs of the run: every SimSettings field (`--setting`) and the scenario generator's
    # changed fields (`--spec`); until 2026-12-06 neither was in summary.json.
    settings: dict[str, Any] = field(default_factory=dict)
    spec_overrides: dict[str, Any] = field(default_factory=dict)
    # Policies that stopped part-way (until 2026-12-07 the first one stopped the whole simulation,
    # the other policies' results with it).
    failures: list[PolicyFailure] = field(default_factory=list)

    def result(self, policy: str) -> PolicyResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(f"policy {policy!r} was not simulated; have {[r.policy for r in self.results]}")

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus `verdicts`: the paper's ordering and ablation (None: not compared)."""
        return {**asdict(self), "verdicts": asdict(verdicts(self))}

    def write(self, out_dir: Path) -> list[Path]:
        """summary.json (`to_dict`), iterations.csv (makespan per iteration and policy), policies.csv
        and the PNG plots (`plots.figures`): `OUTPUT_FILES`, all or none. An OSError (a full disk, a
        folder in a file's place) propagates naming the file; `write_problem` tells the causes that
        show beforehand."""
        from libra_core.sim.plots import figures, save_png

        # Every file is written to a temporary name first, and the names are replaced only once all
        # are written: benchmarks and notebooks read summary.json back, and a failed write left the
        # new files next to an earlier run's plots (each file was atomic, not the set; 2026-12-07).
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = figures(self)
        writers: dict[str, Callable[[Path], object]] = {
            OUTPUT_FILES[0]: lambda tmp: tmp.write_text(json.dumps(self.to_dict(), indent=1, default=str)),
            OUTPUT_FILES[1]: self._write_iterations,
            OUTPUT_FILES[2]: self._write_policies,
            **{name: functools.partial(save_png, fig) for name, fig in plots.items()},
        }
        assert tuple(writers) == OUTPUT_FILES, "every output file has a writer"
        with ExitStack() as stack:
            temps = {name: stack.enter_context(atomic_path(out_dir / name)) for name in OUTPUT_FILES}
            for name, write in writers.items():
                try:
                    write(temps[name])
                except OSError as err:
                    if err.filename:
                        raise
                    # a full disk names no file: name the one being written (OSError maps the errno
                    # to its subclass, ENOSPC and EACCES alike)
                    raise OSError(err.errno, err.strerror or str(err), str(out_dir / name)) from err
        return [out_dir / name for name in OUTPUT_FILES]

    def _write_iterations(self, path: Path) -> None:
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["iteration", *[r.policy for r in self.results]])
            for i in range(self.iterations):
                w.writerow(
                    [i, *[f"{r.iteration_s[i]:.3f}" if i < len(r.iteration_s) else "" for r in self.results]]
                )

    def _write_policies(self, path: Path) -> None:
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            cols = [k for k in asdict(self.results[0]) if k not in ("iteration_s", "replans")]
            w.writerow(cols)
            for r in self.results:
                d = asdict(r)
                w.writerow([d[c] for c in cols])


# What `SimReport.write` writes into its folder, the last two drawn by `plots.figures`.
OUTPUT_FILES = ("summary.json", "iterations.csv", "policies.csv", *PLOT_FILES)


def write_problem(out_dir: Path) -> str | None:
    """Why `SimReport.write` would fail in `out_dir`, as far as looking (not writing) tells; None
    when nothing shows. Checked before a simulation, so a run is not lost to its output path."""
    if out_dir.exists() and not out_dir.is_dir():
        return f"{out_dir}: exists and is not a folder"
    for name in OUTPUT_FILES:
        path = out_dir / name
        if path.exists() and not path.is_file():
            return f"{path}: is a folder (or not a file); the simulation writes a file there"
    return None


def lower_bound_s(
    iters: Iterable[list[SimTrajectory]],
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    tables: CostTables,
    tps: tuple[int, ...],
) -> tuple[float, int, float, float]:
    """(seconds, tokens, work bound s, path bound s) over all iterations; seconds = the larger bound.

    Work bound: all GPU-seconds of work over the cluster (no straggler, no dependency). Path bound:
    rollouts run one after another in every policy (rollout j starts after rollout j - 1 ends), so
    the makespan is at least the sum over iterations of the slowest trajectory's own latency on an
    otherwise empty cluster (its tool calls, its decode at batch 1 on the fastest TP degree and the
    smallest tabulated context, its prompt and payload prefill likewise), plus the last update on
    every GPU at `train_mfu`.
    """
    work_s, path_s, tokens = 0.0, 0.0, 0
    b = tables.max_num_seqs
    itl1 = min(tables.itl_s(tp, 1, 16.0) for tp in tps)  # batch 1, shortest context, fastest TP
    pre1 = min(tables.prefill_s(tp, 1.0, 16.0) for tp in tps)
    train = 0.0
    for ts in iters:
        ctx = min(t.prompt_tokens for t in ts)
        dec = min(tp * tables.itl_s(tp, b, ctx) / b for tp in tps)
        pre = min(tp * tables.prefill_s(tp, 1.0, ctx) for tp in tps)
        gen = sum(x.gen_tokens for t in ts for x in t.turns)
        fill = sum(_prefilled_tokens(t) for t in ts)
        sizes = [float(t.total_tokens) for t in ts]
        shape = TrainShape(sum(sizes), sum(s * s for s in sizes), max(sizes))
        train = train_lower_bound_s(model, hw, 1, shape)
        work_s += (gen * dec + fill * pre + train) / num_gpus
        path_s += max(
            sum(t.tool_latency_s) + itl1 * sum(x.gen_tokens for x in t.turns) + pre1 * _prefilled_tokens(t)
            for t in ts
        )
        tokens += int(sum(sizes))
    path_s += train / num_gpus
    return max(work_s, path_s), tokens, work_s, path_s


def _prefilled_tokens(t: SimTrajectory) -> int:
    """The prompt and payload tokens a replay prefills. A trajectory whose last turn generates
    nothing (a trace's 0-token closing turn) ends at its last tool return, whose payload is never
    prefilled (`turns.on_tool_return`); until 2026-12-06 the bounds charged it, and one long last
    payload put the "lower bound" above a real run."""
    turns = t.turns
    payload = sum(x.payload_tokens for x in turns)
    if len(turns) >= 2 and turns[-1].gen_tokens == 0:
        payload -= turns[-2].payload_tokens
    return t.prompt_tokens + payload


def tail_share(latencies_s: list[float]) -> float:
    return long_tail_share(latencies_s, 0.1)


def format_table(report: SimReport) -> str:
    """Plain markdown table of every policy and the lower bound, then the workload and the paper's figures."""
    drawn = "trace replay (no seed)" if report.seed is None else f"seed {report.seed}"
    head = f"{report.scenario} on {report.hardware} ({report.model}), {report.iterations} iterations, {drawn}"
    rows = [
        "| policy | tok/s | makespan s | mean iter s | rollout idle | train idle | request moves | "
        "plan moves | tail lat / wall | deployment (last) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.results:
        rows.append(
            f"| {r.policy} | {r.tokens_per_s:,.0f} | {r.makespan_s:,.0f} | {r.mean_iteration_s:.1f} | "
            f"{r.rollout_idle_share:.0%} | {r.train_idle_share:.0%} | {r.moves} | {r.replans_applied} | "
            # a deployment's label joins its halves with " | ", which would split the cell
            f"{r.long_tail_share:.0%} / {r.tail_time_share:.0%} | {r.last_deployment.replace(' | ', '; ')} |"
        )
    for f in report.failures:
        rows.append(f"| {f.policy} | could not run (below) | | | | | | | | |")
    rows.append(
        f"| lower bound | {report.lower_bound_tokens_per_s:,.0f} | {report.lower_bound_s:,.0f} | "
        f"{report.lower_bound_s / max(1, report.iterations):.1f} | | | | | | "
        f"max(work {report.lower_bound_work_s:,.0f} s, path {report.lower_bound_path_s:,.0f} s) |"
    )
    paper = PAPER.get(report.scenario, "")
    # The workload's line follows the table, so a script still finds the table's header on line 2.
    extra = [x for x in (f"workload: {report.workload}" if report.workload else "", paper) if x]
    extra += [f"{f.policy} could not run: {f.reason}" for f in report.failures]
    return "\n".join([head, *rows, *extra])


# The paper's ordering, best first: Libra (every part on) > static-optimal > greedy > colocated.
PAPER_ORDER = ("+elastic", "static-optimal", "greedy", "colocated")


@dataclass(frozen=True)
class Verdicts:
    """Whether a report reproduces the paper's two claims (issue 5's acceptance), strictly: a tie is
    not a gain. None when the report lacks a policy the claim compares."""

    ordering: bool | None  # Libra > static-optimal > greedy > colocated, in tok/s
    ablation: bool | None  # greedy < +planning < +hetero-tp < +cmlfq < +elastic, in tok/s


def _strictly_falling(report: SimReport, names: Iterable[str]) -> bool | None:
    ran = {r.policy: r.tokens_per_s for r in report.results}
    names = list(names)
    if not set(names) <= set(ran):
        return None
    return all(ran[a] > ran[b] for a, b in zip(names, names[1:], strict=False))


def verdicts(report: SimReport) -> Verdicts:
    return Verdicts(_strictly_falling(report, PAPER_ORDER), _strictly_falling(report, reversed(ABLATION)))


def format_verdicts(report: SimReport) -> list[str]:
    """The ablation chain and both verdicts as lines (what `libra simulate` prints under the table)."""
    v = verdicts(report)
    lines = []
    if v.ablation is not None:
        chain = " -> ".join(f"{report.result(p).tokens_per_s:,.0f}" for p in ABLATION)
        lines += [
            f"ablation ({' -> '.join(ABLATION)}): {chain} tok/s",
            f"ablation increasing at every step: {v.ablation}",
        ]
        if not v.ablation:
            lines.append(f"ablation steps that add nothing: {'; '.join(_ablation_misses(report))}")
        gains = _ablation_gains(report)
        if gains:
            lines.append(f"where the ablation's gains come from: {'; '.join(gains)}")
    if v.ordering is not None:
        lines.append(f"paper ordering Libra > static-optimal > greedy > colocated reproduced: {v.ordering}")
    failed = {f.policy for f in report.failures}
    asked = failed | {r.policy for r in report.results}
    for claim, names in (("ablation", ABLATION), ("paper ordering", PAPER_ORDER)):
        if set(names) <= asked and failed & set(names):  # asked for, left out above: say why
            lines.append(f"{claim} not compared: {', '.join(n for n in names if n in failed)} could not run")
    return lines


def _ablation_misses(report: SimReport) -> list[str]:
    """Each ablation step that does not raise throughput: a tie (saying when the two policies ran
    the same deployments, i.e. the part had nothing to act on) or the share it lost."""
    out = []
    for a, b in zip(ABLATION, ABLATION[1:], strict=False):
        ra, rb = report.result(a), report.result(b)
        if rb.tokens_per_s > ra.tokens_per_s:
            continue
        if rb.tokens_per_s == ra.tokens_per_s:
            same = (ra.first_deployment, ra.last_deployment) == (rb.first_deployment, rb.last_deployment)
            why = ""
            if same and b == "+elastic":  # the pool is the step: say whether it ever lent a GPU
                why = (
                    ": the elastic pool moved no GPU between training and rollout"
                    if rb.lent_joins == rb.hybrid_rollouts == 0
                    else f": its {rb.lent_joins} loans to training and {rb.hybrid_rollouts} hybrid "
                    "rollouts gained nothing"
                )
            elif same and rb.mixed_gap is not None:  # why the heterogeneous search kept one degree
                gap = rb.mixed_gap
                why = ": at iteration 0 its planner priced the best mixed-TP layout " + (
                    f"{gap:.1%} slower than one degree"
                    if gap >= 0
                    else f"only {-gap:.1%} faster than one degree, inside the mixed-layout margin"
                )
            out.append(f"{b} ties {a}" + (f" (the same deployments{why})" if same else ""))
        else:
            out.append(f"{b} {rb.tokens_per_s / ra.tokens_per_s - 1:+.1%} against {a}")
    return out


def _ablation_gains(report: SimReport) -> list[str]:
    """Each ablation step that raises throughput, with how much sooner its run ends and how much of
    that is the last iteration (the elastic pool's typical gain: the run's last update on every
    GPU) rather than the iterations before it. Empty when the runs carry no per-iteration times."""
    out = []
    for a, b in zip(ABLATION, ABLATION[1:], strict=False):
        ra, rb = report.result(a), report.result(b)
        if (
            rb.tokens_per_s <= ra.tokens_per_s
            or len(ra.iteration_s) != len(rb.iteration_s)
            or not ra.iteration_s
        ):
            continue
        sooner = sum(ra.iteration_s) - sum(rb.iteration_s)
        last = ra.iteration_s[-1] - rb.iteration_s[-1]
        where = (
            "all in the last iteration"
            if abs(sooner - last) < 0.05  # nothing before the last iteration at the printed 0.1 s
            else f"{last:,.1f} s in the last iteration, {sooner - last:,.1f} s before it"
        )
        out.append(
            f"{b} {rb.tokens_per_s / ra.tokens_per_s - 1:+.1%} over {a} ({sooner:,.1f} s sooner: {where})"
        )
    return out
