"""Plan search end to end: feasibility on the acceptance clusters, formulas, report, traces."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra_core.planner import format_plain, iteration_time_s, plan_cluster, read_trace
from libra_core.planner.presets import workload_preset
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import SearchSettings, mixed_gap, plan_rank, search_plans
from libra_core.planner.specs import get_hardware, get_model
from libra_core.scheduling.base import Turn
from libra_core.sim.trace_replay import TraceSpec, TraceWorkload
from libra_core.traces.schema import TRACE_SCHEMA, TraceTrajectory, trace_table, write_trace
from libra_core.traces.schema import read_trace as read_validated_trace
from libra_core.traces.synthetic import synthetic_trace


def test_iteration_time_formulas() -> None:
    assert iteration_time_s(10, 4, 1, staleness=0) == 15
    assert iteration_time_s(10, 4, 1, staleness=1) == 11
    assert iteration_time_s(3, 8, 1, staleness=2) == 8
    assert iteration_time_s(3, 8, 1, staleness=2, colocated=True) == 12
    # The sync overlapping the rollout (the simulator's pipeline) shows only in the s + 1 cycle.
    assert iteration_time_s(10, 4, 1, staleness=1, sync_overlaps=True) == 10
    assert iteration_time_s(3, 3, 2, staleness=1, sync_overlaps=True) == 4  # (3 + 3 + 2) / 2
    assert iteration_time_s(3, 3, 2, staleness=2, sync_overlaps=True) == 3
    assert iteration_time_s(3, 8, 1, staleness=0, sync_overlaps=True) == 12  # on-policy: serial


@pytest.mark.parametrize("cluster,model", [("48xA800", "qwen3-14b"), ("16xH100", "qwen3-30b-a3b")])
def test_acceptance_clusters_are_feasible(cluster: str, model: str) -> None:
    report = plan_cluster(cluster, model, "swe-longtail")
    best = report.best
    assert best is not None
    assert best.train_gpus + best.rollout_gpus == report.cluster.num_gpus
    assert best.train.feasible and best.train.memory.total_bytes <= report.cluster.hardware.mem_bytes
    assert best.train.layout.num_gpus == best.train_gpus
    assert best.rollout.gpus <= best.rollout_gpus
    assert best.t_iter_s == pytest.approx(best.t_rollout_s + best.t_train_s + best.t_sync_s)
    assert all(p.t_iter_s >= best.t_iter_s * (1 - 1e-3) for p in report.plans)
    json.dumps(report.to_dict())  # JSON-able for --json


def test_staleness_one_overlaps_and_is_never_slower() -> None:
    m, hw, w = get_model("qwen3-8b"), get_hardware("H100"), workload_preset("search-medium")
    sync = search_plans(m, hw, 32, w, SearchSettings(staleness=0))[0]
    overlap = search_plans(m, hw, 32, w, SearchSettings(staleness=1))[0]
    assert overlap.t_iter_s <= sync.t_iter_s
    assert overlap.t_iter_s == pytest.approx(max(overlap.t_rollout_s + overlap.t_sync_s, overlap.t_train_s))


def test_longer_trajectories_shift_gpus_to_rollout() -> None:
    # On-policy, rollout and training add up; 4x longer trajectories need more rollout instances
    # (less KV room per sequence, more decode work), so the best split gives rollout more GPUs.
    m, hw = get_model("qwen3-8b"), get_hardware("A800")
    base = workload_preset("math-short")
    short = search_plans(m, hw, 48, base, SearchSettings(staleness=0))[0]
    long = search_plans(m, hw, 48, base.scaled(4.0), SearchSettings(staleness=0))[0]
    assert long.t_rollout_s > short.t_rollout_s
    assert long.rollout_gpus > short.rollout_gpus


def test_local_cpu_plan_is_colocated() -> None:
    report = plan_cluster("1xcpu", "tiny", "arith-tiny")
    assert report.best is not None and report.best.colocated
    assert report.best.instance_tps == {1: 1}
    assert "1xcpu" in format_plain(report)


def test_model_that_cannot_fit_has_no_plan() -> None:
    report = plan_cluster("2xcpu", "qwen3-32b", "math-short")
    assert report.best is None
    assert "no feasible plan" in format_plain(report)


def test_corrections_scale_predictions() -> None:
    m, hw, w = get_model("qwen3-4b"), get_hardware("H100"), workload_preset("math-short")
    plain = search_plans(m, hw, 16, w, SearchSettings(staleness=1))[0]
    slow = evaluate_plan(plain, m, hw, w, SearchSettings(staleness=1, corrections={"rollout": 2.0}))
    assert slow.t_rollout_s == pytest.approx(
        2 * evaluate_plan(plain, m, hw, w, SearchSettings(staleness=1)).t_rollout_s
    )


def test_trace_round_trip(tmp_path: Path) -> None:
    rows = []
    for it in range(2):
        for p in range(3):
            for g in range(4):
                turns = [
                    {"gen_tokens": 100 + 10 * g, "tool": "python", "payload_tokens": 50, "status": "success"},
                    {"gen_tokens": 200, "tool": None, "payload_tokens": 0, "status": None},
                ]
                rows.append(
                    {
                        "trajectory_id": f"{it}-{p}-{g}",
                        "prompt_id": f"p{p}",
                        "iteration": it,
                        "prompt_tokens": 300,
                        "turns": turns,
                    }
                )
    path = tmp_path / "trace.parquet"
    write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path)
    w = read_trace(path, tool_latency_s=2.0)
    assert (w.prompts_per_iteration, w.group_size, w.num_samples) == (3, 4, 24)
    assert w.gen_tokens[0] == 300 and w.payload_tokens[0] == 50 and w.tool_calls[0] == 1
    assert w.reprefill_ctx_tokens[0] == 300 + 100  # context when the tool returned
    assert w.tool_latency_s[0] == 2.0
    report = plan_cluster("8xH100", "qwen3-4b", str(path))
    assert report.best is not None


def test_a_trace_from_libra_trace_synth_plans(tmp_path: Path) -> None:
    # The one trace format: what `libra trace synth` and `libra trace export` write, `libra plan`,
    # `libra simulate` and `libra trace-eval` read.
    path = write_trace(synthetic_trace(random.Random(0), "causal"), tmp_path / "synth.parquet")
    w = read_trace(path)
    trajs = read_validated_trace(path)
    assert w.num_samples == len(trajs)
    calls = sum(1 for t in trajs for u in t.turns if u.tool)
    drawn_s = sum(x for t in trajs for x in t.tool_latency_s or () if x is not None)  # the generator's
    assert float(w.tool_calls.sum()) == calls and float(w.tool_latency_s.sum()) == pytest.approx(drawn_s)
    assert drawn_s > calls * 0.5
    assert plan_cluster("8xH100", "qwen3-4b", str(path)).best is not None


def test_a_trace_prices_its_recorded_tool_latencies(tmp_path: Path) -> None:
    # What `libra trace export` writes from a run: each call's measured wall time; one call untimed.
    turns = (Turn(10, "calc", 4, "success"), Turn(6, "calc", 2, "failure"), Turn(3, None, 0, None))
    rows = [
        TraceTrajectory("a", "p", 0, 20, turns, (0.25, 4.0, None)),
        TraceTrajectory("b", "p", 0, 20, turns, (0.5, None, None)),
        TraceTrajectory("c", "p", 0, 20, turns),  # the trace did not time this one
    ]
    timeout = (Turn(10, "calc", 4, "timeout"), Turn(3, None, 0, None))
    rows.append(TraceTrajectory("d", "p", 0, 20, timeout))  # untimed, and it timed out
    path = write_trace(trace_table(rows), tmp_path / "timed.parquet")
    w = read_trace(path, tool_latency_s=2.0)
    assert list(w.tool_latency_s) == [4.25, 0.5 + 2.0, 2 * 2.0, 3 * 2.0]
    # The plan prices each trajectory's tool time as the simulator's replay waits it.
    replay = TraceWorkload(path, "qwen3-4b", TraceSpec(tool_latency_s=2.0)).trajectories(0)
    assert [sum(t.tool_latency_s) for t in replay] == list(w.tool_latency_s)


def test_a_call_whose_observation_is_empty_still_counts(tmp_path: Path) -> None:
    # A cut or empty observation (0 payload tokens) is still a tool call: its latency was charged
    # while the call, its context at the return and the context after the last call were not.
    turns = (Turn(10, "calc", 0, "success"), Turn(6, "calc", 0, "timeout"), Turn(3, None, 0, None))
    path = write_trace(
        trace_table([TraceTrajectory("a", "p", 0, 20, turns, (30.0, 2.0, None))]), tmp_path / "t.parquet"
    )
    w = read_trace(path)
    assert list(w.tool_calls) == [2.0] and list(w.tool_latency_s) == [32.0]
    assert list(w.reprefill_ctx_tokens) == [(20 + 10) + (20 + 10 + 6)]
    assert w.last_call_ctx_tokens is not None and list(w.last_call_ctx_tokens) == [36.0]


def test_a_trace_that_breaks_an_invariant_is_a_clear_error(tmp_path: Path) -> None:
    turns = [{"gen_tokens": -5, "tool": None, "payload_tokens": 0, "status": None}]
    row = {"trajectory_id": "t", "prompt_id": "p", "iteration": 0, "prompt_tokens": 10, "turns": turns}
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=TRACE_SCHEMA), path)
    with pytest.raises(ValueError, match="turn 0 has negative token counts"):
        plan_cluster("8xH100", "qwen3-4b", str(path))


def test_unknown_workload_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        plan_cluster("8xH100", "qwen3-4b", "nope")
    with pytest.raises(ValueError, match="unknown workload preset"):
        workload_preset("nope")


def test_presets_are_seeded() -> None:
    a, b = workload_preset("swe-longtail", seed=1), workload_preset("swe-longtail", seed=1)
    assert (a.total_tokens == b.total_tokens).all()
    assert replace(a, minibatches=2).minibatches == 2


def test_homogeneous_search_plans_one_degree_on_every_rollout_gpu() -> None:
    m, hw, w = get_model("qwen3-14b"), get_hardware("A800"), workload_preset("swe-longtail")
    hetero = search_plans(m, hw, 48, w, SearchSettings(staleness=1))
    homog = search_plans(m, hw, 48, w, SearchSettings(staleness=1, homogeneous=True))
    assert homog and hetero
    for plan in homog:
        (g,) = plan.rollout.groups
        assert plan.rollout.gpus == (plan.rollout_gpus // g.tp) * g.tp
        # Re-pricing keeps it homogeneous and gives the same numbers on the same workload.
        again = evaluate_plan(plan, m, hw, w, SearchSettings(staleness=1, homogeneous=True))
        assert len(again.rollout.groups) == 1
        assert again.t_rollout_s == pytest.approx(plan.t_rollout_s)
    # The heterogeneous search includes every homogeneous layout, so its best is never worse beyond
    # the split ranking's frontier grid (~0.6%) and the bisection's rel_tol; this workload is far inside.
    assert hetero[0].t_iter_s <= homog[0].t_iter_s * (1 + 2e-3)


@pytest.mark.parametrize(
    "preset,mixed_first",
    [("arith-tiny", False), ("swe-longtail", True)],  # mixed within 5% of one degree / far ahead
)
def test_mixed_margin_ranks_a_close_mixed_layout_behind_one_bucket(preset: str, mixed_first: bool) -> None:
    m, hw, w = get_model("qwen3-14b"), get_hardware("A800"), workload_preset(preset)
    by_price = search_plans(m, hw, 48, w, SearchSettings(staleness=1, top_k=8))
    margin = search_plans(m, hw, 48, w, SearchSettings(staleness=1, top_k=8, mixed_margin=0.05))
    degrees = lambda p: {g.tp for g in p.rollout.groups}  # noqa: E731
    assert len(degrees(by_price[0])) > 1  # by price alone both presets run mixed layouts
    one = min((p for p in margin if len(degrees(p)) == 1), key=lambda p: p.t_iter_s)
    mixed = min((p for p in margin if len(degrees(p)) > 1), key=lambda p: p.t_iter_s)
    assert mixed.t_iter_s == pytest.approx(by_price[0].t_iter_s)  # the margin changes ranks, not prices
    assert (mixed.t_iter_s < 0.95 * one.t_iter_s) == mixed_first
    assert margin[0] is (mixed if mixed_first else one)
    # What `libra simulate` reports when a heterogeneous policy keeps one degree: the price gap.
    gap = mixed_gap(margin)
    assert gap is not None and gap == pytest.approx(plan_rank(mixed) / plan_rank(one) - 1)
    assert (gap < -0.05) == mixed_first and gap < 0  # mixed is priced faster on both presets
    assert mixed_gap([one]) is None and mixed_gap([mixed]) is None


def test_plan_report_notes_the_margin_only_when_it_reorders() -> None:
    def note(margin: float) -> str | None:
        return plan_cluster(
            "48xA800", "qwen3-14b", "arith-tiny", staleness=1, top_k=8, mixed_margin=margin
        ).margin_note

    assert note(0.0) is None  # by price alone nothing priced faster ranks behind
    assert note(0.05) is not None and "5%" in note(0.05)


def test_top_n_lists_without_changing_the_best_plan_or_repeating_one() -> None:
    """`libra plan --top 1` printed another best plan than `--top 4` (a smaller pool of splits was
    re-solved exactly), and the DP and the one-bucket search listed one plan's resources twice."""
    args = ("48xA800", "qwen3-14b", "swe-longtail")
    best = {plan_cluster(*args, staleness=1, top_k=n).plans[0] for n in (1, 2, 4)}
    assert len({(p.train_gpus, p.train.layout, tuple(sorted(p.instance_tps.items()))) for p in best}) == 1
    listed = plan_cluster("16xH100", "qwen3-30b-a3b", "swe-longtail", top_k=8).plans
    assert len(listed) > 3
    assert not any(p.same_resources(q) for i, p in enumerate(listed) for q in listed[:i])
