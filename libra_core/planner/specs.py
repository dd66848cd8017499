"""Hardware and model specifications: the facts the cost model starts from.

The data lives in `hardware.yaml` and `models.yaml` inside this package (with their
sources); this module parses them once into frozen pydantic models and answers look-ups by name.
Unknown names raise a `ValueError` that lists the valid ones; a name that is a file (a model's
Hugging Face config.json, or a spec YAML) is read by `spec_files`. `parse_cluster("48xA800")` turns the
CLI's cluster string into a `ClusterSpec`.
"""

from __future__ import annotations

import math
import re
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from libra_core.planner import spec_files


class _Spec(BaseModel):
    # No inf or NaN: a spec file's `.inf` would plan on infinite memory and write invalid JSON.
    # Strict types: a count is an integer and a switch a boolean, never coerced (lax mode read
    # `gpus_per_node: true` as 1, `tie_embeddings: "yes"` as True and `memory_gb: "80"` as 80.0);
    # an integer is still a valid float (`memory_gb: 80`).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


# Plausibility caps of spec fields, an order of magnitude or more above the largest device or model
# in use (B200: ~2,250 bf16 TFLOP/s, 192 GB, 8,000 GB/s; NVL72 nodes; 405B-class models have 126
# layers, hidden 16,384, FFN 53,248; vocabularies reach ~260K). They catch a value typed in the wrong
# unit (memory_gb in bytes) or with extra digits, which would otherwise be planned on (and print a
# parameter count of hundreds of digits); raise one in a spec's docs before a real model exceeds it.
MAX_TFLOPS = 100_000.0
MAX_MEMORY_GB = 10_000.0
MAX_BANDWIDTH_GBPS = 100_000.0
MAX_GPUS_PER_NODE = 1_024
MAX_OVERHEAD_US = 1_000_000.0  # one second per operator, collective or decode step
MAX_LAYERS = 10_000
MAX_HIDDEN_SIZE = 1_000_000
MAX_HEADS = 65_536
MAX_HEAD_DIM = 65_536
MAX_FFN_SIZE = 10_000_000
MAX_VOCAB_SIZE = 10_000_000
MAX_EXPERTS = 65_536
# Floors of the same kind, far below any accelerator (1 GFLOP/s, 1 MB/s, 0.1% efficiency): a value
# such as `hbm_gbps: 1e-320` passed `gt=0` and priced steps as inf or NaN (a plan of 0 tok/s).
MIN_TFLOPS = 1e-3
MIN_BANDWIDTH_GBPS = 1e-3
MIN_MEMORY_GB = 1e-3
MIN_EFFICIENCY = 1e-3


class HardwareSpec(_Spec):
    """One accelerator type; YAML fields carry human units, properties give SI units."""

    name: str
    aliases: tuple[str, ...] = Field((), strict=False)  # YAML gives a list
    bf16_tflops: float = Field(
        ge=MIN_TFLOPS, le=MAX_TFLOPS, description="Dense bf16 tensor-core peak, TFLOP/s."
    )
    fp32_tflops: float = Field(
        ge=MIN_TFLOPS, le=MAX_TFLOPS, description="fp32 peak (non-tensor-core), TFLOP/s."
    )
    memory_gb: float = Field(ge=MIN_MEMORY_GB, le=MAX_MEMORY_GB, description="Device memory, 10^9 bytes.")
    hbm_gbps: float = Field(
        ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="Device memory bandwidth, GB/s."
    )
    nvlink_gbps_per_dir: float = Field(
        ge=MIN_BANDWIDTH_GBPS,
        le=MAX_BANDWIDTH_GBPS,
        description="Intra-node bandwidth per device and direction.",
    )
    nic_gbps_per_gpu: float = Field(
        ge=MIN_BANDWIDTH_GBPS,
        le=MAX_BANDWIDTH_GBPS,
        description="Inter-node bandwidth per device and direction.",
    )
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    gemm_compute_eff: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Achieved share of peak in large GEMMs."
    )
    mem_bw_eff: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Achieved share of memory bandwidth in GEMMs/attention."
    )
    elementwise_bw_eff: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Achieved share in norms, activations, adds."
    )
    elementwise_overhead_us: float = Field(
        ge=0, le=MAX_OVERHEAD_US, description="Fixed cost per elementwise operator."
    )
    op_overhead_us: float = Field(
        ge=0, le=MAX_OVERHEAD_US, description="Fixed cost per operator (launch, tails)."
    )
    intra_allreduce_eff: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Bus-bandwidth share in intra-node rings."
    )
    intra_latency_us: float = Field(
        ge=0, le=MAX_OVERHEAD_US, description="Fixed cost of an intra-node collective."
    )
    intra_p2p_eff: float = Field(ge=MIN_EFFICIENCY, le=1, description="NVLink share reached by a send/recv.")
    intra_p2p_latency_us: float = Field(
        ge=0, le=MAX_OVERHEAD_US, description="Fixed cost of an intra-node send/recv."
    )
    inter_allreduce_eff: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Bus-bandwidth share across nodes."
    )
    inter_latency_us: float = Field(
        ge=0, le=MAX_OVERHEAD_US, description="Fixed cost of an inter-node collective."
    )
    train_mfu: float = Field(
        ge=MIN_EFFICIENCY, le=1, description="Share of peak reached by training compute."
    )
    # Per decode step of a rollout instance, outside the GPU kernels (the serving engine's CPU work:
    # scheduling, input preparation, sampling, detokenizing). The Vidur profiles the efficiencies
    # were fitted on time kernels only, so hardware.yaml leaves both at 0; the simulator sets them
    # as a what-if (SimSettings). benchmarks/rollout_tp_economics.py compares with vLLM's ITL.
    serving_step_overhead_us: float = Field(
        0.0,
        ge=0,
        le=MAX_OVERHEAD_US,
        description="Fixed CPU time per decode step of a rollout instance, microseconds.",
    )
    serving_seq_overhead_us: float = Field(
        0.0,
        ge=0,
        le=MAX_OVERHEAD_US,
        description="CPU time per decode step per sequence in the batch, microseconds.",
    )
    source: str

    def peak_flops_per_s(self, dtype: str) -> float:
        return (self.bf16_tflops if dtype == "bfloat16" else self.fp32_tflops) * 1e12

    @property
    def mem_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    @property
    def intra_bw_bytes_per_s(self) -> float:
        return self.nvlink_gbps_per_dir * 1e9

    @property
    def inter_bw_bytes_per_s(self) -> float:
        return self.nic_gbps_per_gpu * 1e9


class ModelSpec(_Spec):
    """A decoder-only transformer (dense or MoE); parameter counts are derived, not typed in."""

    name: str
    hf_id: str
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_HIDDEN_SIZE)
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    num_kv_heads: int = Field(ge=1, le=MAX_HEADS)
    head_dim: int = Field(ge=1, le=MAX_HEAD_DIM)
    intermediate_size: int = Field(ge=1, le=MAX_FFN_SIZE)
    vocab_size: int = Field(ge=1, le=MAX_VOCAB_SIZE)
    tie_embeddings: bool
    num_experts: int = Field(0, ge=0, le=MAX_EXPERTS)
    experts_per_token: int = Field(0, ge=0, le=MAX_EXPERTS)
    moe_intermediate_size: int = Field(0, ge=0, le=MAX_FFN_SIZE)
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    reported_params_b: float | None = None
    reported_active_params_b: float | None = None
    source: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if not self.num_experts and (self.experts_per_token or self.moe_intermediate_size):
            # A dense model would silently ignore them (e.g. `base:` a MoE model, `num_experts: 0`).
            raise ValueError(
                f"{self.name}: experts_per_token ({self.experts_per_token}) and moe_intermediate_size "
                f"({self.moe_intermediate_size}) are mixture-of-experts fields but num_experts is 0; "
                "set them to 0 for a dense model, or set num_experts"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts):
            raise ValueError(f"{self.name}: experts_per_token must be in 1..num_experts")
        if self.num_experts and not self.moe_intermediate_size:
            raise ValueError(f"{self.name}: a MoE model needs moe_intermediate_size")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def bytes_per_param(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 2 * h  # + 2 RMSNorm weights

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.num_experts * self.expert_params + self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.experts_per_token * self.expert_params + self.hidden_size * self.num_experts
        return self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def num_params(self) -> int:
        layer = self.attn_params_per_layer + self.mlp_params_per_layer
        return self.num_layers * layer + self.embedding_params

    @property
    def num_active_params(self) -> int:
        layer = self.attn_params_per_layer + self.active_mlp_params_per_layer
        return self.num_layers * layer + self.embedding_params

    @property
    def flops_params(self) -> int:
        """Parameters that cost 2 FLOPs per token in a forward pass: active layers + LM head."""
        layer = self.attn_params_per_layer + self.active_mlp_params_per_layer
        return self.num_layers * layer + self.vocab_size * self.hidden_size

    @property
    def expert_params_total(self) -> int:
        return self.num_layers * self.num_experts * self.expert_params if self.is_moe else 0

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.bytes_per_param

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads one TP rank holds: heads are split, and replicated when tp exceeds them."""
        return math.ceil(self.num_kv_heads / tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on each GPU of a TP-`tp` instance: 2 x L x ceil(kv/tp) x d x bytes."""
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.bytes_per_param

    def supports_tp(self, tp: int) -> bool:
        """vLLM and Megatron shard attention heads evenly over TP ranks."""
        return self.num_heads % tp == 0 and (tp % self.num_kv_heads == 0 or self.num_kv_heads % tp == 0)


class ClusterSpec(_Spec):
    hardware: HardwareSpec
    num_gpus: int = Field(ge=1)

    @property
    def label(self) -> str:
        return f"{self.num_gpus}x{self.hardware.name}"


def _load_yaml(name: str) -> dict[str, Any]:
    text = resources.files("libra_core.planner").joinpath(name).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{name} must be a mapping of name -> spec"
    return data


@cache
def hardware_specs() -> dict[str, HardwareSpec]:
    return {name: HardwareSpec(name=name, **fields) for name, fields in _load_yaml("hardware.yaml").items()}


@cache
def model_specs() -> dict[str, ModelSpec]:
    return {name: ModelSpec(name=name, **fields) for name, fields in _load_yaml("models.yaml").items()}


def builtin_hardware(name: str) -> HardwareSpec | None:
    """The built-in accelerator `name` names (its name or an alias, case-insensitive), else None."""
    key = name.strip().lower()
    for spec in hardware_specs().values():
        if key == spec.name.lower() or key in (a.lower() for a in spec.aliases):
            return spec
    return None


def builtin_model(name: str) -> ModelSpec | None:
    """The built-in model `name` names (its name or Hugging Face id, case-insensitive), else None."""
    specs = model_specs()
    key = name.strip().lower()
    if key in specs:
        return specs[key]
    return next((spec for spec in specs.values() if key == spec.hf_id.lower()), None)


def get_hardware(name: str) -> HardwareSpec:
    """A built-in accelerator by name or alias (case-insensitive), or a hardware spec YAML file
    (`spec_files`: hardware.yaml's fields, optionally `base: NAME` to start from a built-in one)."""
    specs = hardware_specs()
    spec = builtin_hardware(name)
    if spec is not None:
        return spec
    if spec_files.looks_like_file(name.strip()):
        return spec_files.load_hardware_file(name.strip())
    valid = sorted([*specs, *(a for s in specs.values() for a in s.aliases)])
    raise ValueError(f"unknown hardware {name!r}; valid: {valid}, or a hardware spec YAML file")


def get_model(name: str) -> ModelSpec:
    """A built-in model by name or Hugging Face id (case-insensitive), or a file: the model's
    Hugging Face config.json, or a model spec YAML file (`spec_files`)."""
    specs = model_specs()
    spec = builtin_model(name)
    if spec is not None:
        return spec
    if spec_files.looks_like_file(name.strip()):
        return spec_files.load_model_file(name.strip())
    raise ValueError(
        f"unknown model {name!r}; valid: {sorted(specs)}, or a Hugging Face config.json or a model spec YAML"
    )


def model_spec_from_tiny(cfg: Any, vocab_size: int = 40) -> ModelSpec:
    """A spec for the locally built policy (`TinyModelConfig` in libra_core.config)."""
    return ModelSpec(
        name="tiny-local",
        hf_id="local/tiny_qwen2",
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        vocab_size=vocab_size,
        tie_embeddings=False,
        dtype=cfg.dtype,
        source="libra_core.config TinyModelConfig",
    )


_CLUSTER = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\S.*?)\s*$")  # the GPU: a name or a spec file


MAX_CLUSTER_GPUS = 65_536


def parse_cluster(text: str) -> ClusterSpec:
    """`"48xA800"` -> 48 A800-80G devices; `"1xcpu"` -> this machine as one device;
    `"16x./b200.yaml"` -> 16 devices of a hardware spec file."""
    match = _CLUSTER.match(text)
    if not match:
        raise ValueError(f"cluster {text!r} must look like COUNTxGPU, e.g. 48xA800 or 1xcpu")
    count = int(match.group(1))
    if count < 1:
        raise ValueError(f"cluster {text!r}: the device count must be at least 1")
    if count > MAX_CLUSTER_GPUS:
        # The search's cost grows with the device count (it enumerates splits and instance
        # counts): `libra plan` on 65,536 A800s takes about a minute on a 2-core CPU, and a count
        # of 1e20 overflowed a C integer (plan) or never finished (simulate).
        raise ValueError(f"cluster {text!r}: at most {MAX_CLUSTER_GPUS:,} devices are supported")
    return ClusterSpec(hardware=get_hardware(match.group(2)), num_gpus=count)
