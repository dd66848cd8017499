"""Training memory per GPU: model states by ZeRO stage, activations with and without recompute.

Mixed-precision Adam keeps, per parameter, bf16 weights (2 B), bf16 gradients (2 B) and fp32
master weights + first + second moments (4 + 4 + 4 = 12 B): 16 B in all. ZeRO shards them over the
data-parallel group of size d (Rajbhandari et al. 2020):

    stage 0: 2 + 2 + 12           = 16
    stage 1: 2 + 2 + 12/d               (optimizer states sharded)
    stage 2: 2 + (2 + 12)/d             (+ gradients)
    stage 3: (2 + 2 + 12)/d             (+ weights)

Activations per token per layer (bf16, flash attention so no s x s score matrix, sequence
parallelism so everything divides by t), counted from the tensors a Llama/Qwen block saves for
backward: norm inputs and outputs (4h), q, k, v (q + 2kv), attention output (q), MLP gate/up
outputs and activation (3F): `2 x (4h + 2q + 2kv + 3F)` bytes. For Llama-2-7B this is ~32h bytes,
close to the 34h of Korthikanti et al. 2022 (who also keep dropout masks). Full recomputation keeps
only each layer's input (2h bytes) plus one layer's activations while it is recomputed. Under 1F1B
the first pipeline stage holds min(m, p) micro-batches in flight. The last stage also holds the
fp32 logits of a micro-batch (vocab-parallel, / t).

ZeRO-3 shards the weights, but computes on whole ones: each layer's (model-parallel shard of its)
parameters are all-gathered before its forward and backward, the next one's prefetched meanwhile,
and its full gradients exist until they are reduce-scattered. So a ZeRO-3 GPU also holds two units'
bf16 weights and one unit's bf16 gradients, a unit being the largest module gathered at once (a
transformer layer, or the vocab x hidden embedding / LM head). The prefetch stops at DeepSpeed's
`stage3_max_live_parameters` (1e9 live), but the unit computing is always whole.
Until 2026-12-07 this buffer was not counted: 1.17 GB for Qwen3-14B at TP4, 2.33 GB for Qwen3-32B
at TP2, 3.24 GB for Qwen3-8B at TP1 (its prefetch capped; the embedding is the largest unit of all
three); `benchmarks/zero3_memory.py` prints them for every built-in model.

A frozen reference model (GRPO with a KL penalty) adds its bf16 weights, the same model-parallel
shard as the policy's, replicated over data parallelism except under ZeRO-3, which shards it like
the policy's weights (FSDP-style, as verl places its reference worker).
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.planner.specs import ModelSpec

WEIGHT_BYTES, GRAD_BYTES, OPTIM_BYTES = 2, 2, 12  # bf16 weight, bf16 grad, fp32 master + m + v
LOGIT_BYTES = 4  # fp32 logits for the log-softmax of the loss
TRAIN_RESERVED_BYTES = 3e9  # CUDA context, NCCL buffers, allocator fragmentation
ZERO3_MAX_LIVE_PARAMS = 1e9  # DeepSpeed's stage3_max_live_parameters default


def model_state_bytes_per_param(zero_stage: int, dp: int) -> float:
    """Bytes each GPU holds per parameter of its model-parallel shard (see module docstring)."""
    if zero_stage == 0:
        return WEIGHT_BYTES + GRAD_BYTES + OPTIM_BYTES
    if zero_stage == 1:
        return WEIGHT_BYTES + GRAD_BYTES + OPTIM_BYTES / dp
    if zero_stage == 2:
        return WEIGHT_BYTES + (GRAD_BYTES + OPTIM_BYTES) / dp
    if zero_stage == 3:
        return (WEIGHT_BYTES + GRAD_BYTES + OPTIM_BYTES) / dp
    raise ValueError(f"unknown ZeRO stage {zero_stage}; valid: [0, 1, 2, 3]")


def params_per_gpu(model: ModelSpec, tp: int, pp: int, ep: int) -> tuple[float, float]:
    """(dense, expert) parameters on the most loaded GPU: layers/pp, plus the larger embedding end."""
    layers = model.num_layers / pp
    dense_layer = model.attn_params_per_layer + (0 if model.is_moe else model.mlp_params_per_layer)
    if model.is_moe:
        dense_layer += model.hidden_size * model.num_experts  # router, replicated
    emb = model.embedding_params if pp == 1 else model.vocab_size * model.hidden_size
    dense = (layers * dense_layer + emb) / tp
    expert = layers * model.num_experts * model.expert_params / (tp * ep) if model.is_moe else 0.0
    return dense, expert


def activation_bytes_per_token_layer(model: ModelSpec, tp: int) -> float:
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    per = 4 * h + 2 * q + 2 * kv
    if model.is_moe:
        k, f = model.experts_per_token, model.moe_intermediate_size
        per += model.num_experts + k * (2 * h + 3 * f)  # router logits, dispatched copies, expert MLPs
    else:
        per += 3 * model.intermediate_size
    return 2.0 * per / tp


@dataclass(frozen=True)
class TrainMemory:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    reserved_bytes: float
    reference_bytes: float = 0.0  # frozen reference weights (KL penalty), 0 without one
    gathered_bytes: float = 0.0  # ZeRO-3's all-gathered weights and unsharded gradients, 0 below ZeRO-3

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.reserved_bytes
            + self.reference_bytes
            + self.gathered_bytes
        )


def train_memory(
    model: ModelSpec,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    zero_stage: int,
    recompute: bool,
    micro_batch_tokens: float,
    micro_batches: int,
    reference: bool = False,
) -> TrainMemory:
    """Peak bytes on the most loaded GPU of a layout (first stage's activations, last stage's logits);
    `reference` adds a frozen reference model's weights (see the module docstring)."""
    dense, expert = params_per_gpu(model, tp, pp, ep)
    expert_dp = max(1, dp // ep)  # experts are replicated only over dp/ep ranks

    def states(n: float, d: int) -> tuple[float, float, float]:
        if zero_stage == 3:
            return n * WEIGHT_BYTES / d, n * GRAD_BYTES / d, n * OPTIM_BYTES / d
        if zero_stage == 2:
            return n * WEIGHT_BYTES, n * GRAD_BYTES / d, n * OPTIM_BYTES / d
        if zero_stage == 1:
            return n * WEIGHT_BYTES, n * GRAD_BYTES, n * OPTIM_BYTES / d
        if zero_stage == 0:
            return n * WEIGHT_BYTES, n * GRAD_BYTES, n * OPTIM_BYTES
        raise ValueError(f"unknown ZeRO stage {zero_stage}; valid: [0, 1, 2, 3]")

    wd, gd, od = states(dense, dp)
    we, ge, oe = states(expert, expert_dp)
    layers = model.num_layers / pp
    per_layer = activation_bytes_per_token_layer(model, tp) * micro_batch_tokens
    in_flight = min(micro_batches, pp)
    if recompute:
        act = in_flight * layers * 2.0 * model.hidden_size * micro_batch_tokens / tp + per_layer
    else:
        act = in_flight * layers * per_layer
    logits = micro_batch_tokens * model.vocab_size / tp * LOGIT_BYTES
    ref = 0.0
    if reference:
        shard = (dp, expert_dp) if zero_stage == 3 else (1, 1)
        ref = (dense / shard[0] + expert / shard[1]) * WEIGHT_BYTES
    gathered = zero3_gathered_bytes(model, tp, ep) if zero_stage == 3 else 0.0
    return TrainMemory(wd + we, gd + ge, od + oe, act, logits, TRAIN_RESERVED_BYTES, ref, gathered)


def zero3_gathered_bytes(model: ModelSpec, tp: int, ep: int) -> float:
    """ZeRO-3's working set beyond the shards: two units' bf16 weights (the one computing and the one
    prefetched; the prefetch is dropped past `ZERO3_MAX_LIVE_PARAMS`) and one unit's bf16 gradients, a unit
    being a layer's or the embedding's model-parallel shard (see the module docstring)."""
    layer = model.attn_params_per_layer / tp
    if model.is_moe:
        layer += (model.hidden_size * model.num_experts + model.num_experts * model.expert_params / ep) / tp
    else:
        layer += model.mlp_params_per_layer / tp
    unit = max(layer, model.vocab_size * model.hidden_size / tp)
    # The cap bounds the prefetch, never the unit computing: a module is gathered whole.
    live = max(unit, min(2.0 * unit, ZERO3_MAX_LIVE_PARAMS))
    return live * WEIGHT_BYTES + unit * GRAD_BYTES
