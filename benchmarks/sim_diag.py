"""Per-policy diagnostics of one simulated scenario: tok/s, mean rollout and iteration time, moves,
tail share, the first deployment and the plan's predicted times, and per bucket of the first
deployment the planner's group time next to when its last trajectory finished in iteration 0;
then every replan and audit decision (iteration, action, the two priced or measured figures, the
splits, the reason). Flags: `--per-iteration` also prints each iteration's rollout seconds, update
seconds and period (train end to train end); `--candidates` the planner's 8 best plans for
iteration 0 under the policy's search settings, with their rollout groups (degree, instances, bins);
`--seed=N` the workload's seed (0 by default, as `libra simulate`; the simulator draws nothing of its own);
`--slowest=N` iteration 0's N last trajectories to finish (latency, the TP degree of the instance
that served their last turn, turns, generated tokens, tool seconds, context at the last tool return);
`--hardware=COUNTxGPU` the cluster (48xA800 by default).

.venv/bin/python benchmarks/sim_diag.py SCENARIO ITERATIONS POLICY[,POLICY...] [FIELD=VALUE ...]
    [--per-iteration] [--candidates] [--seed=N] [--slowest=N] [--hardware=COUNTxGPU]
e.g.  .venv/bin/python benchmarks/sim_diag.py r2e-gym 6 greedy,+planning,oracle-routing
      .venv/bin/python benchmarks/sim_diag.py dapo-math 2 oracle-routing spill_factor=1e9
      .venv/bin/python benchmarks/sim_diag.py r2e-gym 2 +planning spec.prompts_per_iteration=96
      .venv/bin/python benchmarks/sim_diag.py run.parquet 12 static-optimal --hardware=8xH100
(FIELD=VALUE: SimSettings what-ifs, as `libra simulate --setting`; spec.FIELD=VALUE: changes to the
scenario's generator, or for a trace its replay, as `libra simulate --spec`.)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from libra_core.planner.replan import split_label
from libra_core.planner.search import search_plans
from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim.engine import Flight, Simulator
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import Deployment, check_cluster_size, resolve_policies
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import SimTrajectory, load_scenario, long_tail_share, spec_class

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int  # noqa: E402


def _count_flag(flag: str):  # noqa: ANN202 - an argparse type
    """An argparse `type=` for `--NAME=N`: a non-negative integer (0 when absent)."""

    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{flag}=N takes a non-negative integer, got {text!r}")
        return int(text)

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: positionals and flags in any order (`--seed=1 tiny 2 greedy`);
    `--help` prints this module's docstring and exits 0; a bad value exits 2 with one line."""
    ap = argparse.ArgumentParser(
        prog="sim_diag.py",
        usage="%(prog)s SCENARIO ITERATIONS POLICY[,POLICY...] [FIELD=VALUE ...] [--per-iteration]"
        " [--candidates] [--seed=N] [--slowest=N] [--hardware=COUNTxGPU]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("scenario", metavar="SCENARIO", help="a scenario name or a trace .parquet path")
    ap.add_argument("iterations", metavar="ITERATIONS", type=positive_int, help="iterations to simulate")
    ap.add_argument(
        "policies", metavar="POLICY[,POLICY...]", help="comma-separated policy names (`all`: every one)"
    )
    ap.add_argument(
        "overrides",
        metavar="FIELD=VALUE",
        nargs="*",
        default=[],
        help="SimSettings what-ifs; spec.FIELD=VALUE: the scenario's generator (or a trace's replay)",
    )
    ap.add_argument("--per-iteration", action="store_true", help="each iteration's rollout, update, period")
    ap.add_argument("--candidates", action="store_true", help="the planner's 8 best plans for iteration 0")
    ap.add_argument("--seed", type=_count_flag("--seed"), default=0, help="the workload's seed")
    ap.add_argument(
        "--slowest", type=_count_flag("--slowest"), default=0, help="iteration 0's N last finishers"
    )
    ap.add_argument("--hardware", default="48xA800", help="the cluster, COUNTxGPU")
    args = ap.parse_intermixed_args(argv)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.policies:
        ap.error("POLICY names no policy; give comma-separated policy names")
    specs = [a.removeprefix("spec.") for a in args.overrides if a.startswith("spec.")]
    try:
        args.settings = SimSettings(
            **parse_overrides(
                [a for a in args.overrides if not a.startswith("spec.")], SimSettings, "setting"
            )
        )
        args.cluster = parse_cluster(args.hardware)
        spec = parse_overrides(specs, spec_class(args.scenario), "spec")
        args.workload = load_scenario(args.scenario, args.iterations, args.seed, spec_overrides=spec)
        # `all` and aliases expand, a repeat runs once: what `libra simulate` runs for these names
        args.policy_specs = resolve_policies(args.policies)
        check_cluster_size(args.policy_specs, args.cluster.num_gpus)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    iters, slowest, settings, cluster, wl = (
        args.iterations, args.slowest, args.settings, args.cluster, args.workload
    )  # fmt: skip
    model = get_model(wl.model)
    for policy in args.policy_specs:
        name = policy.name
        t0 = time.perf_counter()
        sim = Simulator(
            policy,
            wl,
            model,
            cluster.hardware,
            cluster.num_gpus,
            iters,
            settings=settings,
        )
        first_dep = sim.dep
        assert first_dep is not None
        finished = _record_finishes(sim) if slowest else []
        if args.candidates:
            _print_candidates(sim)
        st = sim.run()
        end = st.makespan_s
        rollout = [r.rollout_end_s - r.rollout_start_s for r in st.records]
        last_dep = sim.dep
        assert last_dep is not None
        plan = last_dep.plan
        print(
            f"{name:15s} tok/s {st.tokens_per_s:8.0f}  rollout {sum(rollout) / len(rollout):7.1f} s  "
            f"iteration {end / iters:7.1f} s  request moves {sum(r.moves for r in st.records)}  "
            f"tail {long_tail_share(st.latencies_s):.2f}  wall {time.perf_counter() - t0:.1f} s"
        )
        predicted = (
            f"predicted rollout {plan.t_rollout_s:.1f} s, train {plan.t_train_s:.1f} s" if plan else ""
        )
        print(f"    {st.deployments[0]} {predicted} buckets {last_dep.bucket_bounds}")
        first = st.records[0]
        for bucket, priced, tps in _priced_buckets(first_dep):
            ended = first.bucket_end_s.get(bucket)
            sim_s = f"{ended - first.rollout_start_s:7.1f} s" if ended is not None else "  (none)"
            print(f"    bucket {bucket} ({tps}): iteration 0 priced {priced:7.1f} s, last finish {sim_s}")
        for d in st.replans:
            print(
                f"    {d['iteration']:>4} {d['action']:7s} {d['current_t_iter_s']:8.1f} -> "
                f"{d['proposed_t_iter_s']:8.1f}  {d['current_split']} => {d['proposed_split']}"
                f"  ({d['reason']})"
            )
        _print_slowest(sim, finished, slowest)
        if args.per_iteration:
            ends = [r.train_end_s for r in st.records]
            for r, prev in zip(st.records, [0.0, *ends[:-1]], strict=True):
                roll = r.rollout_end_s - r.rollout_start_s
                print(
                    f"    iteration {r.iteration:>4}: rollout {roll:7.1f} s,"
                    f" update {r.train_s:7.1f} s, period {r.train_end_s - prev:7.1f} s"
                )


def _record_finishes(sim: Simulator) -> list[tuple[float, int, SimTrajectory]]:
    """Iteration 0's finished trajectories with their latency and the TP degree of the instance
    that served their last turn, filled as the run goes (wraps `sim.finish`)."""
    rows: list[tuple[float, int, SimTrajectory]] = []
    finish = sim.finish

    def record(f: Flight) -> None:
        if f.traj.iteration == 0:
            rows.append((sim.q.now_s - f.admit_s, f.last.tp if f.last is not None else 0, f.traj))
        finish(f)

    sim.finish = record  # type: ignore[method-assign]
    return rows


def _print_slowest(sim: Simulator, finished: list[tuple[float, int, SimTrajectory]], n: int) -> None:
    """The `n` last finishers, in the planner's view of them (generated tokens, tool seconds, the
    context at the last tool return: `Workload.last_call_ctx_tokens`)."""
    rows = sorted(finished, key=lambda r: r[0], reverse=True)[:n]
    if not rows:
        return
    w = sim.workload_of_trajectories([t for _, _, t in rows])
    assert w.last_call_ctx_tokens is not None
    for k, (latency_s, tp, t) in enumerate(rows):
        gen, tools_s, ctx = w.gen_tokens[k], w.tool_latency_s[k], w.last_call_ctx_tokens[k]
        print(
            f"    slowest: {latency_s:7.1f} s on TP{tp} | {len(t.turns)} turns, {gen:.0f} generated,"
            f" {tools_s:.1f} s in tools, {ctx:.0f} tokens at the last tool return"
        )


def _print_candidates(sim: Simulator) -> None:
    """The planner's 8 best plans for iteration 0 under this policy's search settings."""
    plans = search_plans(sim.model, sim.hw, sim.G, sim.workload_of(0), replace(sim.search, top_k=8))
    print(
        "    candidates for iteration 0 (iteration / rollout / train s, split, groups as TPxinstances[bins]):"
    )
    for p in plans:
        groups = " ".join(f"TP{g.tp}x{g.instances}[{g.start_bin}:{g.end_bin}]" for g in p.rollout.groups)
        print(f"      {p.t_iter_s:7.1f} {p.t_rollout_s:7.1f} {p.t_train_s:7.1f}  {split_label(p)}  {groups}")


def _priced_buckets(dep: Deployment) -> list[tuple[int, float, str]]:
    """A deployment's buckets: the planner's time for each (the slowest of its groups, before the
    spread and the stage correction) and its instances (groups fill `dep.instances` in order)."""
    plan = dep.plan
    if plan is None:
        return []
    out: dict[int, tuple[float, dict[int, int]]] = {}
    offset = 0
    for g in plan.rollout.groups:
        for tp, bucket in dep.instances[offset : offset + g.instances]:
            t, tps = out.get(bucket, (0.0, {}))
            tps[tp] = tps.get(tp, 0) + 1
            out[bucket] = (max(t, g.time_s), tps)
        offset += g.instances
    rows = []
    for bucket, (t, tps) in sorted(out.items()):
        label = " ".join(f"{n}xTP{tp}" for tp, n in sorted(tps.items()))
        rows.append((bucket, t, label))
    return rows


if __name__ == "__main__":
    main()
