"""The `planner:` section of stages.yaml: the Global Resource Planner's settings
(libra_core/planner; formulas in docs/planner.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from libra_core.config.base import Frozen


class PlannerConfig(Frozen):
    """Global Resource Planner settings (libra_core/planner; formulas in docs/planner.md).

    Every field but `type` applies only with `type: libra`: the `static` planner returns the sizes in
    `stages` and reads none of them."""

    type: Literal["static", "libra"] = Field(
        "static",
        description="Resource planner; `static` returns the sizes in `stages`, `libra` runs the cost "
        "model and search of libra_core/planner.",
    )
    replan_every: int = Field(0, ge=0, description="libra planner: iterations between replans (0: never).")
    hardware: str = Field(
        "1xcpu",
        pattern=r"^[0-9]+x\S.*$",
        description="libra planner: cluster as COUNTxGPU, e.g. 48xA800; GPU names in "
        "libra_core/planner/hardware.yaml, or a hardware spec YAML file (e.g. 16x./my_gpu.yaml; "
        "docs/planner.md, 'Your own model or GPU'). A relative file path is read from the folder the run "
        "starts in; the run's resolved config records it absolute, so a resume from another folder reads "
        "the same file.",
    )
    gpu_budget: int = Field(
        0, ge=0, description="libra planner: devices the planner may use; 0: all of `hardware`."
    )
    model_spec: str | None = Field(
        None,
        description="libra planner: model name in libra_core/planner/models.yaml or a Hugging Face id of "
        "one, or a file: the model's Hugging Face config.json or a model spec YAML (a relative path is "
        "recorded absolute in the run's resolved config, as planner.hardware's); null: derived from "
        "`model`.",
    )
    initial_workload: str = Field(
        "arith-tiny",
        min_length=1,
        description="libra planner: workload preset assumed before any trajectory is measured.",
    )
    window_iterations: int = Field(
        8, ge=1, description="libra planner: recent iterations whose trajectory statistics drive a replan."
    )
    min_gain_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="libra planner: hysteresis, a new plan is applied only if it saves at least this share "
        "of T_iter.",
    )
    expected_iterations: int = Field(
        50,
        ge=1,
        description="libra planner: iterations a new plan is expected to serve (amortises the move cost).",
    )
    move_cost_s: float = Field(
        60.0, ge=0, description="libra planner: seconds lost when GPUs move between training and rollout."
    )
    staleness: int = Field(
        0,
        ge=0,
        description="libra planner: policy-version lag; 0 serialises rollout and training, >=1 overlaps "
        "them; it must follow pipeline.mode: 0 for sync, at least 1 for async.",
    )
    plan_for_spread: bool = Field(
        False,
        description="libra planner: plan for the expected iteration under the spread between an "
        "iteration's GRPO groups, not for the mean one (docs/planner.md; matters with staleness >= 1).",
    )
    audit_window: int = Field(
        3,
        ge=0,
        description="libra planner: iterations measured on each side of an applied replan; the move is "
        "reverted when their throughput (tokens/s) fell by more than min_gain_fraction (0: no audit).",
    )
    mixed_margin: float = Field(
        0.05,  # planner.search.DEFAULT_MIXED_MARGIN (a test keeps them equal)
        ge=0,
        lt=1,
        description="libra planner: a layout mixing TP degrees (several router buckets) is chosen over "
        "the best one-degree layout only when priced faster by more than this share (0: by price alone; "
        "docs/planner.md).",
    )
    reprefill_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        description="libra planner: share of a trajectory's context prefilled again after each tool "
        "return in the rollout price: 1 when the paused trajectory's KV is evicted while its tool runs, 0 "
        "when vLLM's prefix cache (on in Libra's engines) still holds it (docs/planner.md).",
    )
    two_phase_path: bool = Field(
        True,
        description="libra planner: price a rollout range's critical path in two phases: at the loaded "
        "pace while an instance works through its share, then alone (false: the whole path at the "
        "KV-capped batch, the price before 2026-12-04; docs/planner.md, Formulas).",
    )
