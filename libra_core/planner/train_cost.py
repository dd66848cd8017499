"""Training cost of one RL iteration for a parallel layout (TP x PP x DP, EP for MoE, ZeRO stage).

FLOPs scale with the model: per optimizer step, `6 N_active T + 6 L q sum(s^2)` (forward + backward,
2 FLOPs per active parameter per token, causal attention over each packed sequence of length s), x
4/3 with full activation recomputation, + `2 N T + 2 L q sum(s^2)` for a reference-model forward.
Compute runs at `train_mfu` of peak. A DP rank trains whole sequences: its share of a step is the
step's FLOPs / DP but at least the longest sequence's in that step, so DP past the sequences per
step idles ranks instead of shortening the step; each step's longest is drawn from the workload's
lengths (`step_longest.StepLongest`: only one step holds the iteration's longest), and so do the
tokens its micro-batches carry and communicate. The micro-batch budget and memory still use the
iteration's longest. Each of the `minibatches` optimizer steps is a 1F1B
pipeline of m micro-batches over p stages: `(m + p - 1)` slots of one micro-batch's stage time, so
the bubble is `(p - 1) / (m + p - 1)`. Per micro-batch and stage: TP all-reduces of the activations
(4 per layer, 6 with recompute) inside the node, MoE all-to-all (dispatch + combine, forward +
backward) over the EP group, PP send/recv of activations and gradients. After the last backward, DP
gradient sync (all-reduce; 1.5x the volume under ZeRO-3) of which only the part longer than one
micro-batch backward is exposed, then the optimizer step (memory-bound over the local fp32 states).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from libra_core.planner.memory import TrainMemory, params_per_gpu, train_memory
from libra_core.planner.ops import all_reduce_s, all_to_all_s, send_recv_s
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.step_longest import StepLongest
from libra_core.planner.workload import Workload


@dataclass(frozen=True)
class TrainLayout:
    tp: int
    pp: int
    dp: int
    ep: int = 1
    zero_stage: int = 1
    recompute: bool = False
    micro_batch_seqs: int = 1  # micro-batch token budget = micro_batch_seqs x longest sequence

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        rc = " recompute" if self.recompute else ""
        return f"TP{self.tp} PP{self.pp} DP{self.dp}{ep} ZeRO-{self.zero_stage} mb{self.micro_batch_seqs}{rc}"


@dataclass(frozen=True)
class TrainShape:
    """What training sees of a workload: token counts and sequence lengths per iteration.
    `step_longest` is the distribution of one optimizer step's longest sequence; without it every
    step is floored at `max_seq_len` (an upper bound)."""

    tokens: float
    sum_sq_len: float
    max_seq_len: float
    minibatches: int = 4
    ref_forward: bool = False
    step_longest: StepLongest | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_workload(cls, w: Workload, ref_forward: bool = False) -> TrainShape:
        """The update's share of the workload (`Workload.train_share`: the dropped groups' tokens
        are not trained), its longest sequence the sample's longest (it may be among the kept)."""
        tot = w.total_tokens
        sampled = len(tot) * w.weight  # the iteration's trajectories; the update trains a random share
        steps = update_steps(w)
        return cls(
            float(tot.sum() * w.weight * w.train_share),
            float((tot**2).sum() * w.weight * w.train_share),
            float(tot.max()),
            steps,
            ref_forward,
            StepLongest.of(tot, sampled, sampled * w.train_share / steps),
        )


def update_steps(w: Workload) -> int:
    """The optimizer steps the update takes: `minibatches`, but no more than the prompt groups it
    trains (the trainer deals whole groups with signal into at most that many parts,
    `training/update._deal_minibatches`; the trained groups are taken as the token share of the
    prompts). Until 2026-12-07 every update was priced at `minibatches` steps, each with its DP sync
    and optimizer step: with 1 of 16 groups trained, 2.5x the one step that ran, and the live
    planner's update correction learned that pricing error as the model's."""
    trained_groups = math.ceil(w.prompts_per_iteration * w.train_share - 1e-9)
    return max(1, min(w.minibatches, trained_groups))


@dataclass(frozen=True)
class TrainEstimate:
    layout: TrainLayout
    time_s: float
    compute_s: float
    bubble_fraction: float
    tp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    dp_exposed_s: float
    optimizer_s: float
    memory: TrainMemory
    feasible: bool


def iteration_flops(model: ModelSpec, shape: TrainShape, recompute: bool) -> float:
    dense = 6.0 * model.flops_params * shape.tokens
    attn = 6.0 * model.num_layers * model.q_dim * shape.sum_sq_len
    total = (dense + attn) * (4.0 / 3.0 if recompute else 1.0)
    if shape.ref_forward:
        total += (dense + attn) / 3.0
    return total


def longest_sequence_flops(model: ModelSpec, shape: TrainShape, recompute: bool) -> float:
    """One optimizer step's FLOPs on the shape's longest sequence alone: the least work of the rank
    that holds it."""
    seq = shape.max_seq_len
    return iteration_flops(model, TrainShape(seq, seq * seq, seq, 1, shape.ref_forward), recompute)


def rank_step_flops(model: ModelSpec, shape: TrainShape, layout: TrainLayout) -> float:
    """A DP rank's FLOPs in one optimizer step: an even share of the step, but at least the work of
    the step's longest sequence (in expectation over how sequences fall into steps)."""
    step_flops = iteration_flops(model, shape, layout.recompute) / shape.minibatches
    share = step_flops / layout.dp
    if shape.step_longest is None:
        return max(share, longest_sequence_flops(model, shape, layout.recompute))
    # one sequence of length s costs a s + b s^2 FLOPs
    per_token = iteration_flops(model, TrainShape(1.0, 0.0, 1.0, 1, shape.ref_forward), layout.recompute)
    per_sq = iteration_flops(model, TrainShape(0.0, 1.0, 1.0, 1, shape.ref_forward), layout.recompute)
    return shape.step_longest.expected_floored(share, per_token, per_sq)


def train_lower_bound_s(model: ModelSpec, hw: HardwareSpec, num_gpus: int, shape: TrainShape) -> float:
    """No layout on `num_gpus` trains faster: all FLOPs at train_mfu, no bubble, no communication."""
    return iteration_flops(model, shape, False) / (num_gpus * hw.peak_flops_per_s(model.dtype) * hw.train_mfu)


def estimate_train(
    model: ModelSpec, hw: HardwareSpec, layout: TrainLayout, shape: TrainShape
) -> TrainEstimate:
    tp, pp, dp, ep = layout.tp, layout.pp, layout.dp, layout.ep
    b = 2  # bf16 activations and gradients on the wire
    mb_budget = layout.micro_batch_seqs * shape.max_seq_len
    # A rank trains whole sequences, so the one holding the longest does at least its work: past
    # as many ranks as sequences per step, more DP no longer shortens the step (its other ranks
    # idle). Packing spreads the rest of the step's tokens evenly. The tokens a rank's micro-batches
    # carry (and communicate) follow the step's own longest, as its FLOPs do (`rank_step_flops`);
    # until 2026-12-07 they were floored at the iteration's longest in every step.
    share_tokens = shape.tokens / shape.minibatches / dp
    if shape.step_longest is None:
        rank_tokens = max(share_tokens, shape.max_seq_len)
    else:
        rank_tokens = shape.step_longest.expected_floored(share_tokens, 1.0, 0.0)
    rank_flops = rank_step_flops(model, shape, layout)
    m = max(1, math.ceil(rank_tokens / mb_budget))
    mb_tokens = rank_tokens / m
    peak = hw.peak_flops_per_s(model.dtype) * hw.train_mfu
    stage_compute = rank_flops / m / (tp * pp) / peak
    layers = model.num_layers / pp
    act_bytes = mb_tokens * model.hidden_size * b
    tp_comm = layers * (6 if layout.recompute else 4) * all_reduce_s(hw, act_bytes, tp)
    ep_comm = 0.0
    per_node_dp = max(1, hw.gpus_per_node // (tp * pp))  # DP/EP ranks sharing a node
    if model.is_moe and ep > 1:
        dispatched = act_bytes * model.experts_per_token / tp
        ep_comm = layers * 4 * all_to_all_s(hw, dispatched, ep, per_node_dp)
    p2p = 2 * send_recv_s(hw, act_bytes / tp, cross_node=tp * pp > hw.gpus_per_node) if pp > 1 else 0.0
    slot = stage_compute + tp_comm + ep_comm + p2p
    step = (m + pp - 1) * slot
    dense, expert = params_per_gpu(model, tp, pp, ep)
    volume = 1.5 if layout.zero_stage == 3 else 1.0
    dp_sync = volume * (
        all_reduce_s(hw, dense * b, dp, per_node_dp)
        + all_reduce_s(hw, expert * b, max(1, dp // ep), per_node_dp)
    )
    dp_exposed = max(0.0, dp_sync - (2.0 / 3.0) * stage_compute)  # overlaps the last backward
    local = dense / (dp if layout.zero_stage >= 1 else 1) + expert / (
        max(1, dp // ep) if layout.zero_stage >= 1 else 1
    )
    optimizer = local * 2 * (12 + 2) / (hw.mem_bw_bytes_per_s * hw.mem_bw_eff)  # read+write states, read grad
    total = shape.minibatches * (step + dp_exposed + optimizer)
    mem = train_memory(
        model, tp, pp, dp, ep, layout.zero_stage, layout.recompute, mb_budget, m, shape.ref_forward
    )
    return TrainEstimate(
        layout=layout,
        time_s=total,
        compute_s=shape.minibatches * m * stage_compute,
        bubble_fraction=(pp - 1) / (m + pp - 1),
        tp_comm_s=shape.minibatches * (m + pp - 1) * tp_comm,
        ep_comm_s=shape.minibatches * (m + pp - 1) * ep_comm,
        pp_comm_s=shape.minibatches * (m + pp - 1) * p2p,
        dp_exposed_s=shape.minibatches * dp_exposed,
        optimizer_s=shape.minibatches * optimizer,
        memory=mem,
        feasible=mem.total_bytes <= hw.mem_bytes,
    )


def pipeline_bubble_fraction(micro_batches: int, stages: int) -> float:
    """Idle share of a 1F1B pipeline: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def _pow2_upto(limit: int) -> Iterator[int]:
    v = 1
    while v <= limit:
        yield v
        v *= 2


def enumerate_layouts(model: ModelSpec, hw: HardwareSpec, num_gpus: int) -> Iterator[TrainLayout]:
    """Layouts on exactly `num_gpus`: power-of-two TP within a node, power-of-two PP dividing the
    layers, DP the rest; EP (MoE) a power of two dividing DP and the expert count; ZeRO 0-3 (only
    0-1 with PP, as in DeepSpeed/Megatron); recompute on/off; 1, 2 or 4 sequences per micro-batch."""
    for tp in _pow2_upto(hw.gpus_per_node):
        if not model.supports_tp(tp):
            continue
        for pp in _pow2_upto(model.num_layers):
            if model.num_layers % pp or num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            eps = (
                [e for e in _pow2_upto(dp) if dp % e == 0 and model.num_experts % e == 0]
                if model.is_moe
                else [1]
            )
            for ep in eps:
                for zero in (0, 1) if pp > 1 else (0, 1, 2, 3):
                    if dp == 1 and zero > 0:
                        continue  # nothing to shard over
                    for recompute in (False, True):
                        for mbs in (1, 2, 4):
                            yield TrainLayout(tp, pp, dp, ep, zero, recompute, mbs)
