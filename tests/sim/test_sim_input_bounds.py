"""Extreme inputs are refused with a message naming the field, the value and the range, and the
engine finishes (or stops loudly) where a float clock can no longer resolve a decode step.

Each value below passed validation before 2026-12-06 and then hung or crashed: a day-long-plus tool
latency or switch pushed the clock past ~1e8 s, where a decode step rounded to no time and the same
event was re-scheduled forever; huge sigmas overflowed a log-normal; a huge mean subtask count made
the geometric draw divide by zero; a huge pool or batch filled memory before the first event.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.scheduling.base import Turn
from libra_core.sim import events
from libra_core.sim.engine import Simulator
from libra_core.sim.instance import Instance
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import resolve_policies
from libra_core.sim.settings import SimSettings
from libra_core.sim.trace_replay import TraceSpec, TraceWorkload
from libra_core.sim.workloads import SCENARIOS, ScenarioWorkload, load_scenario
from libra_core.traces.schema import MAX_TOOL_LATENCY_S, TraceTrajectory, trace_table, write_trace
from tests.sim.builders import build_sim


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tool_latency_s", 1e7, r"tool_latency_s must be in \(0, 86,400\], got 10000000.0"),
        ("timeout_s", 1e308, r"timeout_s must be in \[0, 86,400\], got 1e\+308"),
        ("difficulty_sigma", 1000.0, r"difficulty_sigma must be in \[0, 10\], got 1000.0"),
        ("difficulty_sigma", 200.0, r"difficulty_sigma must be in \[0, 10\], got 200.0"),
        ("prompt_latency_sigma", 1000.0, r"prompt_latency_sigma must be in \[0, 2\], got 1000.0"),
        ("prompt_latency_sigma", 10.0, r"prompt_latency_sigma must be in \[0, 2\], got 10.0"),
        ("timeout_s", math.nan, r"timeout_s must be a finite number, got nan"),
        ("gen_median", 1e300, r"gen_median must be in \(0, 10,000,000\], got 1e\+300"),
        # the value as given: `:g` printed 10000001 as 1e+07, inside the range (until 2026-12-07)
        ("gen_median", 10_000_001, r"gen_median must be in \(0, 10,000,000\], got 10000001"),
        ("gen_drift", 1e300, r"gen_drift must be in \(0, 100\], got 1e\+300"),
        ("max_turns", 10**9, r"max_turns must be in \[1, 10,000\], got 1000000000"),
        ("prompt_pool", 2 * 10**6, r"prompt_pool must be in \[1, 1,000,000\], got 2000000"),
        ("prompt_pool", 10**6 + 1, r"prompt_pool must be in \[1, 1,000,000\], got 1000001"),
        (
            "mean_subtasks",
            1e17,
            r"mean_subtasks x turn_drift \(the mean subtasks at the last iteration\) must be in "
            r"\(0, 10000\], got 1e\+17 x 1.5 = 1.5e\+17",
        ),
        ("turn_drift", 1e17, r"mean_subtasks x turn_drift .* got 2 x 1e\+17 = 2e\+17"),
        (
            "group_size",
            10**6,
            r"prompts_per_iteration x group_size .* must be in \[1, 100000\], got 4 x 1000000",
        ),
    ],
)
def test_a_scenario_value_past_its_range_is_refused(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=rf"scenario 'tiny': {message}"):
        load_scenario("tiny", 2, 0, spec_overrides={field: value})


def test_trajectories_times_turns_per_iteration_is_bounded() -> None:
    # Each bound alone allowed 100,000 trajectories of up to 10,000 turns: 1e9 turns an iteration.
    with pytest.raises(
        ValueError,
        match=r"scenario 'tiny': prompts_per_iteration x group_size x max_turns \(the most turns an "
        r"iteration may draw\) must be at most 5,000,000, got 4 x 25000 x 100 = 10,000,000",
    ):
        load_scenario("tiny", 2, 0, spec_overrides={"group_size": 25_000, "max_turns": 100})
    wl = load_scenario("tiny", 2, 0, spec_overrides={"group_size": 25_000, "max_turns": 50})
    assert isinstance(wl, ScenarioWorkload)  # 5,000,000 exactly is allowed


def test_the_subtask_draw_of_a_prompt_of_astronomic_difficulty_is_finite() -> None:
    # A difficulty of 1e40 (sigma 10 allows e^120): `1 - 1/mean` rounds to 1, and the geometric
    # draw divided by its log, 0 (ZeroDivisionError before 2026-12-06).
    wl = load_scenario("tiny", 2, 0)
    assert isinstance(wl, ScenarioWorkload)
    wl._difficulty = [1e40] * len(wl._difficulty)
    for j in range(2):
        ts = wl.trajectories(j)
        assert ts and all(len(t.turns) <= SCENARIOS["tiny"].max_turns for t in ts)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("wake_s", 1e308, r"wake_s must be in \[0, 86400\], got 1e\+308"),
        ("engine_restart_s", 1e6, r"engine_restart_s must be in \[0, 86400\], got 1e\+06"),
        ("max_num_seqs", 10**9, r"max_num_seqs must be in \[1, 4096\], got 1e\+09"),
        ("serving_step_overhead_us", 1e300, r"serving_step_overhead_us must be in \[0, 1e\+06\]"),
        ("min_gain_fraction", 1.0, r"min_gain_fraction must be in \[0, 1\), got 1.0"),
        ("min_gain_fraction", 5.0, r"min_gain_fraction must be in \[0, 1\), got 5.0"),
        ("num_bins", 10**5, r"num_bins must be in \[1, 128\], got 100000"),
        ("cmlfq_cost_ratio", 1e308, r"cmlfq_cost_ratio must be in \[0, 100\], got 1e\+308"),
        ("spill_factor", 1e-300, r"spill_factor must be in \[0.01, 1e\+09\], got 1e-300"),
        ("spill_factor", 1e10, r"spill_factor must be in \[0.01, 1e\+09\], got 1e\+10"),
        ("spill_factor", 0.0, r"spill_factor must be > 0, got 0.0 \(its range: \[0.01, 1e\+09\]\)"),
        ("rerank_plans", 10**8, r"rerank_plans must be in \[0, 128\], got 1e\+08"),
        ("audit_window", 10**9, r"audit_window must be in \[0, 1000\], got 1e\+09"),
        ("wake_s", math.nan, r"wake_s must be a finite number, got nan"),
    ],
)
def test_a_setting_past_its_range_is_refused(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=rf"SimSettings.{message}"):
        SimSettings(**{field: value})


def test_the_settings_bounds_themselves_are_accepted() -> None:
    # The ends of each new range run (`spill_factor=1e9` is benchmarks/sim_diag.py's "never spill").
    edges = SimSettings(num_bins=128, cmlfq_cost_ratio=100.0, rerank_plans=128, audit_window=1000)
    assert (edges.num_bins, edges.rerank_plans, edges.audit_window) == (128, 128, 1000)
    assert SimSettings(spill_factor=0.01).spill_factor == 0.01
    assert SimSettings(spill_factor=1e9).spill_factor == 1e9


@pytest.mark.parametrize("pair", ["num_bins=1e5", "spill_factor=1e-300", "rerank_plans=100000000"])
def test_a_setting_pair_past_its_range_names_the_field_value_and_range(pair: str) -> None:
    # What `--setting` and the flow's `settings` do with a pair: parse it, then build the settings.
    overrides = parse_overrides([pair], SimSettings, "--setting")
    field = pair.partition("=")[0]
    with pytest.raises(ValueError, match=rf"SimSettings.{field} must be in \[[0-9.]+, [0-9.e+]+\], got "):
        SimSettings(**overrides)


def test_tool_latencies_at_the_latency_sigma_bound_stay_under_a_day() -> None:
    # At sigma 10 (accepted before) the longest call of 10 r2e-gym iterations lasted 9e12 s;
    # at the bound, 2, every sampled latency of the three agentic scenarios stays under a day.
    for name in ("r2e-gym", "search-r1", "dapo-math"):
        wl = load_scenario(name, 3, 0, spec_overrides={"prompt_latency_sigma": 2.0})
        longest = max(x for j in range(3) for t in wl.trajectories(j) for x in t.tool_latency_s)
        assert 100.0 < longest < MAX_TOOL_LATENCY_S, (name, longest)


def _trace(tmp_path: Path, latency_s: float) -> Path:
    turns = (Turn(30, "calc", 5, "success"), Turn(20, None, 0, None))
    rows = [TraceTrajectory(f"t{g}", "p0", 0, 50, turns, (latency_s, None)) for g in range(4)]
    return write_trace(trace_table(rows), tmp_path / "t.parquet")


def test_a_trace_replay_past_a_day_per_call_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"trace replay: tool_latency_s must be in \[0, 86400\] \(a day\), got 1e\+06"
    ):
        TraceSpec(tool_latency_s=1e6)
    day_long = _trace(tmp_path, 80_000.0)
    with pytest.raises(
        ValueError, match=r"latency_scale 10000 makes the longest tool call .* \(80000 s\) last 8e\+08 s"
    ):
        TraceWorkload(day_long, "qwen3-8b", TraceSpec(latency_scale=10_000.0))
    with pytest.raises(ValueError, match=r"for this trace latency_scale must be in \[0, 1.08\]"):
        TraceWorkload(day_long, "qwen3-8b", TraceSpec(latency_scale=2.0))
    # A microsecond call (a CPU run's calculator) may be scaled a millionfold: a second.
    quick = TraceWorkload(_trace(tmp_path, 1e-6), "qwen3-8b", TraceSpec(latency_scale=1e6))
    assert quick.trajectories(0)[0].tool_latency_s == pytest.approx((1.0, 0.0))


def test_a_decode_shorter_than_the_clocks_resolution_still_ends() -> None:
    # At 1e10 s a float moves in steps of 1.9e-6 s, more than the turn's last 2e-6 decode steps
    # take: the end rounded to `now`, where `advance` did nothing, and the event came back forever.
    sim = build_sim("tiny", "greedy")
    now = 1e10
    inst = Instance(0, 1, 0, sim.tables, sim.tables.kv_capacity[1], last_s=now)
    inst.join(now, "turn", 100.0, 0.0, 1)
    inst.clock = 1.0 - 2e-6  # the turn's end is 2e-6 steps away
    assert now + 2e-6 * sim.tables.itl_s(1, 1, 100.0) == now
    done: list[object] = []
    for _ in range(3):
        t = inst.next_done_s()
        assert t is not None
        done = inst.pop_done(t)
        if done:
            break
    assert done == ["turn"]
    assert t == math.nextafter(now, math.inf)


def test_a_run_whose_clock_passes_1e8_s_finishes() -> None:
    # `tiny` with 1e7 s tool calls (refused as a spec now, fed to the engine directly): its second
    # iteration's decode rounded to `now` at ~1.1e8 s and the run never ended.
    spec = copy.copy(SCENARIOS["tiny"])
    object.__setattr__(spec, "tool_latency_s", 1e7)
    wl = ScenarioWorkload(spec, 2, 0)
    cluster = parse_cluster("8xA800")
    policy = resolve_policies(["greedy"])[0]
    sim = Simulator(policy, wl, get_model(wl.model), cluster.hardware, 8, 2)
    stats = sim.run()
    assert len(stats.records) == 2 and stats.makespan_s > 1e8


def test_an_event_that_moves_nothing_forward_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for any such bug: an instance whose next event is always its last time.
    monkeypatch.setattr(events, "STUCK_EVENTS", 1000)
    monkeypatch.setattr(Instance, "next_done_s", lambda self: self.last_s if self.heap else None)
    sim = build_sim("tiny", "greedy")
    with pytest.raises(
        AssertionError, match=r"the simulation is stuck at 0.0 s: 1,000 events there in a row"
    ):
        sim.run()


@pytest.mark.parametrize("ctx", [300_000.0, 1_000_000.0, 50_000_000.0])
def test_contexts_past_a_quarter_million_tokens_are_priced_by_the_cost_model(ctx: float) -> None:
    """The cost tables ended at 262,144 tokens of context and priced any longer one as that one:
    at batch 1 a 1M-token decode step at 7.3 ms against the cost model's 11.7 ms (this test's
    assertion on the old tables), though configs and traces allow such contexts."""
    from libra_core.planner.rollout_cost import RolloutCostModel
    from libra_core.sim.instance import CostTables

    cluster = parse_cluster("8xH100")
    cost = RolloutCostModel(get_model("qwen3-8b"), cluster.hardware, 16)
    tables = CostTables(cost, (8,))
    for batch in (1, 16):
        want = float(cost.decode_step_s(8, float(batch), ctx))
        assert tables.itl_s(8, batch, ctx) == pytest.approx(want, rel=0.01)
    assert tables.prefill_s(8, 1.0, ctx) == pytest.approx(float(cost.prefill_s_per_token(8, ctx)), rel=0.01)
