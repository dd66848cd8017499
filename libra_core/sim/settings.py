"""`SimSettings`: the simulator's knobs (router, engine, planner what-ifs), frozen and checked.

Built once per run (`libra simulate --setting FIELD=VALUE`, the `simulate` flow's `settings`,
`benchmarks/sim_table.py --setting`; sim/overrides.py parses the pairs) and read by the
`Simulator` (engine.py) and its pipeline; nothing mutates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from libra_core.planner.search import DEFAULT_MIXED_MARGIN
from libra_core.planner.specs import HardwareSpec
from libra_core.sim.router import SPILL_FACTOR
from libra_core.traces.schema import MAX_TOOL_LATENCY_S

# The instances' cost tables hold a row per batch size and TP degree (`instance.CostTables`): at
# 4,096 sequences, ~30 MB and half a second to build; vLLM serves 256 by default, and no KV cache
# holds 4,096 agentic contexts. Larger values filled memory before the first event.
MAX_NUM_SEQS = 4096
# A switch or restart longer than a day is a unit error (and past ~1e8 s of simulated time the
# float clock can no longer resolve a decode step), as a trace's tool call (traces/schema.py).
MAX_SWITCH_S = MAX_TOOL_LATENCY_S
MAX_SERVING_OVERHEAD_US = 1e6  # a second of CPU time per decode step
# The planner's assignment DP tabulates every contiguous range of length bins per TP degree and
# instance count, ~(bins + 1)^2 x degrees x GPUs entries. A search-r1 plan on 48 GPUs took 2 s at
# the default 48 bins, 8 s and 330 MB at 128, 62 s and 1.1 GB at 256; on 16 GPUs 512 bins (one per
# two trajectories) took 4 minutes and 3.5 GB, and more filled memory. Bins past an iteration's
# trajectory count are not used.
MAX_NUM_BINS = 128
# `cmlfq_cost_ratio` prices re-prefilling one context token in decoded tokens. Prefill is batched
# and compute-bound, so on a GPU a prefilled token costs far less than a decoded one (0.1 here, 1.0
# the library's trace score); 100 leaves two orders of magnitude past that for what-ifs. Past ~1e7
# (a trajectory's token cap) no move can pay, and at 1e308 a context's cost overflowed to inf.
MAX_CMLFQ_COST_RATIO = 100.0
# `spill_factor` is a ratio of loads (a bucket's best instance per GPU against the cluster's mean
# per GPU + 1; sim/router.py).
# Every value up to 0.5 ran the same as 1e-300 on the mixed layout of test_sim_engine.py (a turn
# spills whenever its bucket runs anything); past 4,096 (`MAX_NUM_SEQS`) no load spills, and 1e9 is
# the documented "never spill" (benchmarks/sim_diag.py).
SPILL_FACTOR_RANGE = (0.01, 1e9)
# `rerank` builds its candidate lists `rerank_plans` long and simulates one iteration per distinct
# plan: at 1e8 a two-iteration `tiny` run had not finished after a minute (0.6 s at 128). The
# planner keeps one plan per split, so values past the cluster's GPU count add nothing; 128 covers
# a 128-GPU cluster.
MAX_RERANK_PLANS = 128
# The audit reads `audit_window` finished iterations on each side of a move at every rollout start
# while one is pending (planner/audit.py): 1 s per rollout start at 1e7, minutes and gigabytes past
# 1e9. A window longer than the run never reaches a verdict.
MAX_AUDIT_WINDOW = 1000
_AT_LEAST_ONE = ("max_num_seqs", "num_bins", "replan_every", "window_iterations")


@dataclass(frozen=True)
class SimSettings:
    max_num_seqs: int = 256
    num_bins: int = 48  # length bins of the planner's assignment DP (at most MAX_NUM_BINS)
    replan_every: int = 10
    window_iterations: int = 5
    min_gain_fraction: float = 0.05
    engine_restart_s: float = 30.0  # restarting instances when a plan moves workers
    wake_s: float = 5.0  # vLLM sleep/wake (colocated switch, hybrid entering rollout)
    cmlfq_cost_ratio: float = 0.1  # C-MLFQ prefill_decode_cost_ratio for a wall-clock objective
    spill_factor: float = SPILL_FACTOR  # router: spill when a bucket runs > this x the mean load per GPU
    move_reprefill: bool = True  # a moved turn prefills its whole context (False: a what-if, KV moves free)
    # A turn the scheduler did not move waits for the instance that holds its prefix, as the rollout
    # router does (libra_core/rollout/router.py); False: it goes to the least-loaded instance with room.
    sticky_turns: bool = True
    # The planner plans for the expected iteration under the window's iteration-to-iteration spread
    # (planner/spread.py, from the GRPO groups of the trajectories it plans on); False: for the mean.
    plan_for_spread: bool = True
    # The DP prices each TP degree as one length range, as deployment_from_plan deploys it (one
    # bucket per degree). Off by default: with it the planner's still optimistic prices for
    # heterogeneous layouts under promotion pick ones that lose on dapo-math (docs/simulator.md).
    one_range_per_degree: bool = False
    # One-degree layouts (the one-degree policies', and a heterogeneous search's one-bucket ones)
    # are priced by the DP restricted to that degree (several length ranges in the one bucket),
    # as mixed layouts are, instead of as one range (SearchSettings.one_degree_dp). The one-range
    # price prices the slowest trajectory at the KV-capped batch whatever the instance count, so
    # under load it stops falling with more rollout GPUs (docs/simulator-notebook.md, fourteenth
    # session). False: the one-range price (the default before 2026-12-04).
    one_degree_dp: bool = True
    # Planner-driven policies simulate one iteration of the planning sample on each of the planner's
    # `rerank_plans` best candidates and run the fastest (sim/rerank.py); 0: the planner's first.
    rerank_plans: int = 0
    # With rerank_plans, a heterogeneous policy also simulates the one-degree layouts (the ones
    # +planning runs) beside its own candidates: its search prices mixed layouts optimistically.
    rerank_one_degree: bool = True
    # With rerank_plans, the two fastest one-degree candidates are also simulated on every other TP
    # degree at their split: the searches keep only the best-priced degree per split.
    rerank_degrees: bool = True
    # Finished iterations measured on each side of an applied replan; the move is reverted when
    # their throughput fell by more than min_gain_fraction (planner/audit.py); 0: no audit.
    audit_window: int = 3
    # The planner prices the wait of a slowest trajectory queued for KV room (SearchSettings
    # .queue_wait); off: with it dapo-math's heterogeneous policies pick a layout that runs slower.
    queue_wait: bool = False
    # Every planner price (policies' plans, replans, the fixed splits' degree) prices the critical
    # path in two phases: loaded while an instance works through its share, then alone
    # (SearchSettings.two_phase_path; docs/simulator-notebook.md, fourteenth session). False: the
    # path at the capped batch for its whole life (the default before 2026-12-04).
    two_phase_path: bool = True
    # Heterogeneous policies run a mixed layout only when the planner prices it faster than the
    # best one-degree layout by more than this share (SearchSettings.mixed_margin), the replan
    # hysteresis's 5%; 0: by price alone, with which Search-R1 at seed 2 ran a mixed layout priced
    # 1% faster for 50 iterations at 5% slower (docs/simulator-notebook.md, thirteenth session).
    mixed_margin: float = DEFAULT_MIXED_MARGIN
    # The planner prices the weight sync as this simulator runs it, overlapping the rollout
    # (SearchSettings.sync_overlaps; planner/iteration.py). False: as the runtime's pause, the
    # default before 2026-12-05, which on a replayed CPU run's one-second iterations hid the
    # training time behind the sync (docs/simulator-notebook.md, twentieth session).
    sync_overlaps: bool = True
    # The serving engine's CPU time per decode step, fixed and per sequence in the batch
    # (HardwareSpec.serving_*_overhead_us; 0 there): a what-if for a serving stack whose step is
    # not GPU-bound. The simulated instances and every planner call see the same costs.
    serving_step_overhead_us: float = 0.0
    serving_seq_overhead_us: float = 0.0

    def hardware(self, hw: HardwareSpec) -> HardwareSpec:
        """`hw` with these settings' serving overheads (itself when both are 0)."""
        if not (self.serving_step_overhead_us or self.serving_seq_overhead_us):
            return hw
        return hw.model_copy(
            update={
                "serving_step_overhead_us": self.serving_step_overhead_us,
                "serving_seq_overhead_us": self.serving_seq_overhead_us,
            }
        )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"SimSettings.{f.name} must be a finite number, got {value}")
        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise ValueError(f"SimSettings.{name} must be >= 1, got {getattr(self, name)}")
        nonnegative = (
            "rerank_plans",
            "audit_window",
            "min_gain_fraction",
            "engine_restart_s",
            "wake_s",
            "serving_step_overhead_us",
            "serving_seq_overhead_us",
        )
        for name in (*nonnegative, "cmlfq_cost_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"SimSettings.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("mixed_margin", "min_gain_fraction"):  # a share of the iteration time
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"SimSettings.{name} must be in [0, 1), got {getattr(self, name)}")
        most = {
            "max_num_seqs": MAX_NUM_SEQS,
            "num_bins": MAX_NUM_BINS,
            "engine_restart_s": MAX_SWITCH_S,
            "wake_s": MAX_SWITCH_S,
            "serving_step_overhead_us": MAX_SERVING_OVERHEAD_US,
            "serving_seq_overhead_us": MAX_SERVING_OVERHEAD_US,
            "cmlfq_cost_ratio": MAX_CMLFQ_COST_RATIO,
            "rerank_plans": MAX_RERANK_PLANS,
            "audit_window": MAX_AUDIT_WINDOW,
        }
        for name, limit in most.items():
            if getattr(self, name) > limit:
                low = int(name in _AT_LEAST_ONE)
                raise ValueError(
                    f"SimSettings.{name} must be in [{low}, {limit:g}], got {getattr(self, name):g}"
                )
        fewest, most_spill = SPILL_FACTOR_RANGE
        if not self.spill_factor > 0:
            raise ValueError(
                f"SimSettings.spill_factor must be > 0, got {self.spill_factor} "
                f"(its range: [{fewest:g}, {most_spill:g}])"
            )
        if not fewest <= self.spill_factor <= most_spill:
            raise ValueError(
                f"SimSettings.spill_factor must be in [{fewest:g}, {most_spill:g}], got {self.spill_factor:g}"
            )
