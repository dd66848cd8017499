"""Trace replay: a trace's recorded tool latencies reach the simulated trajectories and the bound;
the planner prices the period the simulator runs when iterations are as short as a CPU run's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from libra_core.scheduling.base import Turn
from libra_core.sim import SimReport, simulate
from libra_core.sim.settings import SimSettings
from libra_core.sim.trace_replay import TraceSpec, TraceWorkload
from libra_core.sim.workloads import ScenarioSpec, load_scenario, spec_class
from libra_core.traces.schema import TraceTrajectory, trace_table, write_trace
from tests.sim.builders import build_sim

SLOW_CALL_S = 400.0  # one call far slower than anything else: it alone sets the path bound


def trace_file(tmp_path: Path, iterations: int = 2) -> Path:
    """Per iteration: a trajectory with one timed slow call, one with a timed fast call and an
    untimed timeout, and one with no call."""
    rows = []
    for it in range(iterations):
        rows += [
            TraceTrajectory(
                f"slow-{it}", "p0", it, 100, (Turn(50, "bash", 20, "success"), Turn(30, None, 0, None)),
                (SLOW_CALL_S, None),
            ),
            TraceTrajectory(
                f"mixed-{it}", "p1", it, 80,
                (Turn(40, "bash", 10, "success"), Turn(20, "bash", 5, "timeout"), Turn(10, None, 0, None)),
                (0.5, None, None),
            ),
            TraceTrajectory(f"plain-{it}", "p2", it, 60, (Turn(25, None, 0, None),)),
        ]  # fmt: skip
    return write_trace(trace_table(rows), tmp_path / "run.parquet")


def test_recorded_latencies_replay_and_untimed_calls_fall_back(tmp_path: Path) -> None:
    wl = TraceWorkload(trace_file(tmp_path), "qwen3-8b", TraceSpec(tool_latency_s=2.0, latency_scale=3.0))
    slow, mixed, plain = wl.trajectories(1)
    assert slow.tool_latency_s == (3 * SLOW_CALL_S, 0.0)  # recorded, scaled
    assert mixed.tool_latency_s == (1.5, 3 * 2.0, 0.0)  # recorded 0.5 x3; an untimed timeout: 3x 2 s
    assert plain.tool_latency_s == (0.0,)
    assert (wl.timed_calls, wl.untimed_calls) == (4, 2)  # over both recorded iterations
    assert slow.trajectory_id == "slow-1@1" and wl.trajectories(2)[0].trajectory_id == "slow-0@2"  # cycles
    line = wl.describe()
    assert "6 trajectories in 2 recorded iterations" in line
    want = "4 of 6 tool calls at their recorded latency x3, the rest 2 s (x3 on a timeout) each"
    assert line.endswith(want), line


def test_latency_scale_moves_the_path_bound_by_the_slow_call(tmp_path: Path) -> None:
    path, iters = trace_file(tmp_path), 3

    def run(scale: float) -> SimReport:
        return simulate(path, "8xH100", iters, ["static-optimal"], spec_overrides={"latency_scale": scale})

    one, three = run(1.0), run(3.0)
    # The slow call dominates every iteration's slowest trajectory, so tripling the recorded
    # latencies adds exactly 2 x 400 s per iteration to the path bound.
    assert three.lower_bound_path_s - one.lower_bound_path_s == pytest.approx(2 * SLOW_CALL_S * iters)
    for report in (one, three):
        (r,) = report.results
        assert report.lower_bound_path_s <= r.makespan_s
        assert report.workload.startswith("trace replay of run: 6 trajectories")
    assert three.results[0].makespan_s > one.results[0].makespan_s + 2 * SLOW_CALL_S * iters * 0.99


def test_trace_spec_fields_are_the_ones_a_trace_takes(tmp_path: Path) -> None:
    path = trace_file(tmp_path)
    assert spec_class(path) is TraceSpec and spec_class(str(path)) is TraceSpec
    assert spec_class("r2e-gym") is ScenarioSpec
    with pytest.raises(ValueError, match=r"\['group_size'\] do not apply to a trace replay.*latency_scale"):
        load_scenario(path, 2, 0, spec_overrides={"group_size": 4})
    with pytest.raises(ValueError, match="tool_latency_s must be a finite number >= 0, got -1"):
        load_scenario(path, 2, 0, spec_overrides={"tool_latency_s": -1.0})


def test_a_trace_without_latencies_says_so(tmp_path: Path) -> None:
    rows = [TraceTrajectory("t", "p", 0, 10, (Turn(5, "calc", 2, "success"), Turn(3, None, 0, None)))]
    wl = TraceWorkload(write_trace(trace_table(rows), tmp_path / "synth.parquet"), "qwen3-8b")
    assert wl.trajectories(0)[0].tool_latency_s == (1.0, 0.0)
    assert "no tool call timed: each costs 1 s" in wl.describe()


def test_a_trace_without_tool_calls_says_so_and_an_upper_case_suffix_is_a_trace(tmp_path: Path) -> None:
    rows = [TraceTrajectory("t", "p", 0, 10, (Turn(3, None, 0, None),))]
    path = write_trace(trace_table(rows), tmp_path / "plain.PARQUET")
    assert spec_class(str(path)) is TraceSpec  # was an unknown scenario
    wl = load_scenario(str(path), 1, 0)
    assert wl.describe().endswith("no tool calls")  # was "all 0 tool calls at their recorded latency"


def test_the_planner_prices_the_period_the_simulator_runs(tmp_path: Path) -> None:
    # Iterations of under a second (a CPU run's trace replayed on GPUs), where the 8B model's
    # weight sync (~0.44 s on H100) is as long as a stage: priced as overlapping the rollout, as
    # the simulator runs it, the plan's period is the simulated one; priced as the runtime's pause
    # (sync_overlaps=False) it is too long by most of a sync.
    rng = random.Random(0)
    rows = [
        TraceTrajectory(
            f"t{it}-{k}", f"p{k // 8}", it, 30,
            (Turn(rng.randint(20, 60), "calc", 3, "success"), Turn(10, None, 0, None)), (0.001, None),
        )
        for it in range(2)
        for k in range(128)
    ]  # fmt: skip
    path = write_trace(trace_table(rows), tmp_path / "short.parquet")
    errors = {}
    for overlaps in (True, False):
        sim = build_sim(
            str(path), "static-optimal", 12, settings=SimSettings(sync_overlaps=overlaps), gpus="8xH100"
        )
        ends = [r.train_end_s for r in sim.run().records]
        period_s = (ends[-1] - ends[1]) / (len(ends) - 2)  # steady state, past the pipeline's fill
        assert sim.dep is not None and sim.dep.plan is not None
        errors[overlaps] = sim.dep.plan.t_iter_s / period_s - 1.0
    assert abs(errors[True]) < 0.05, errors
    assert errors[False] > 0.25, errors


def test_a_tool_return_that_ends_the_trajectory_asks_no_one_and_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trace's 0-token closing turn marks a trajectory that ended on a tool return (max_turns):
    # the agent loop and the trace evaluator ask no scheduler there; the simulator asked (a move
    # there was counted) and prefilled the payload for a turn that generates nothing.
    import libra_core.sim.deployments as deployments

    asked: list[int] = []
    real = deployments.build_scheduler

    def spying(*args: object, **kwargs: object) -> object:
        sched = real(*args, **kwargs)  # type: ignore[arg-type]
        inner = sched.on_tool_return

        def on_tool_return(req, ret):  # type: ignore[no-untyped-def]
            asked.append(ret.turn_index)
            return inner(req, ret)

        sched.on_tool_return = on_tool_return  # type: ignore[method-assign]
        return sched

    monkeypatch.setattr(deployments, "build_scheduler", spying)
    rows = [
        TraceTrajectory(  # two calls, the second ends it (closing turn of 0 tokens)
            f"cut-{it}", "p0", it, 50,
            (Turn(40, "bash", 10, "success"), Turn(30, "bash", 500, "success"), Turn(0, None, 0, None)),
            (1.0, 7.0, None),
        )
        for it in range(2)
    ]  # fmt: skip
    sim = build_sim(str(write_trace(trace_table(rows), tmp_path / "cut.parquet")), "greedy", 2, gpus="8xH100")
    records = sim.run().records
    assert all(r.trajectories == 1 for r in records)  # every trajectory finished
    assert asked == [0, 0]  # per iteration only the first return, which a turn follows
    # the trajectory ends when its last call returns: its latency is 1 s + 7 s of tools plus the two
    # generating turns, with no third turn's prefill of the 500-token payload after it
    first = sim.stats.latencies_s[0]
    assert 8.0 < first < 8.5, first


@pytest.mark.parametrize("closing_gen", [0, 1])
def test_a_last_payload_never_prefilled_is_not_in_the_bound(tmp_path: Path, closing_gen: int) -> None:
    # A trajectory ending on a tool return (a 0-token closing turn) ends when the call returns, its
    # payload never prefilled; both bounds charged that prefill, and with one long last payload the
    # "lower bound" was above the makespan (0.557 s against 0.447 s here).
    turns = (Turn(1, "calc", 20_000, "success"), Turn(closing_gen, None, 0, None))
    path = write_trace(
        trace_table([TraceTrajectory("t0", "p0", 0, 1, turns, (0.0, None))]), tmp_path / "t.parquet"
    )
    rep = simulate(path, "8xH100", 1, ["colocated"], model="qwen3-8b", settings=SimSettings(wake_s=0.0))
    assert rep.lower_bound_s <= rep.results[0].makespan_s
    assert rep.lower_bound_tokens_per_s >= rep.results[0].tokens_per_s
