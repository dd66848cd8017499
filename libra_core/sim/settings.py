"""`SimSettings`: the simulator's knobs (router, engine, planner what-ifs), frozen and checked.

Built once per run (`libra simulate --setting FIELD=VALUE`, the `simulate` flow's `settings`,
`benchmarks/sim_table.py --setting`; sim/overrides.py parses the pairs) and read by the
`Simulator` (engine.py) and its pipeline; nothing mutates it.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class SimSettings:
    max_num_seqs: int = 256
    num_bins: int = 48
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
        for name in ("max_num_seqs", "num_bins", "replan_every", "window_iterations"):
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
            "engine_restart_s": MAX_SWITCH_S,
            "wake_s": MAX_SWITCH_S,
            "serving_step_overhead_us": MAX_SERVING_OVERHEAD_US,
            "serving_seq_overhead_us": MAX_SERVING_OVERHEAD_US,
        }
        for name, limit in most.items():
            if getattr(self, name) > limit:
                low = int(name == "max_num_seqs")
                raise ValueError(
                    f"SimSettings.{name} must be in [{low}, {limit:g}], got {getattr(self, name):g}"
                )
        if not self.spill_factor > 0:
            raise ValueError(f"SimSettings.spill_factor must be > 0, got {self.spill_factor}")
