"""Rollout cost: how long a vLLM instance of TP degree t takes to serve a set of agentic trajectories.

Per-GPU view, TP counted once: a TP-t instance holds `1/t` of the weights and `ceil(kv/t)/kv` of
the KV heads on each GPU, does `1/t` of the FLOPs on each GPU, and pays two all-reduces of the
hidden state per layer. A forward pass over T new tokens of S sequences is the sum of its
operators (ops.py roofline); decode steps are memory-bound (weights + KV read), prefill chunks
compute-bound. Continuous batching keeps B sequences in flight, limited by `max_num_seqs` and by
the KV cache left after the weights.

Agentic terms: each tool return appends payload tokens that must be prefilled, and a share
`reprefill_fraction` of the context so far is prefilled again (the KV was evicted while the tool
ran, or the request moved instance); tool latency is on the trajectory's critical path but hidden
from the instance's throughput by the other sequences in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from libra_core.planner.assignment import SegmentTable
from libra_core.planner.ops import all_reduce_s, gemm_time_s, memory_bound_s, roofline_s
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.workload import Workload

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory it may take
RESERVED_BYTES = 2e9  # CUDA context, CUDA graphs and activation workspace (vLLM profiles ~1-3 GB)
PREFILL_CHUNK_TOKENS = 2048  # vLLM v1 chunked-prefill budget per step (max_num_batched_tokens)
_ACTIVE_ROUNDS = 4  # fixed-point rounds for the active batch (tool waits leave the batch)


@dataclass(frozen=True)
class RolloutCostModel:
    """Time and memory of one rollout instance; every method is per instance of TP degree `tp`."""

    model: ModelSpec
    hw: HardwareSpec
    max_num_seqs: int = 256

    def weight_bytes_per_gpu(self, tp: int) -> float:
        return self.model.weight_bytes / tp

    def kv_capacity_tokens(self, tp: int) -> float:
        """Tokens of KV cache one instance holds (0 when the weights do not fit)."""
        free = self.hw.mem_bytes * GPU_MEMORY_UTILIZATION - self.weight_bytes_per_gpu(tp) - RESERVED_BYTES
        return max(0.0, free) / self.model.kv_bytes_per_token(tp)

    def forward_s(self, tp: int, tokens: ArrayLike, seqs: ArrayLike, ctx: ArrayLike) -> np.ndarray:
        """One forward pass over `tokens` new tokens of `seqs` sequences attending `ctx` tokens each.

        Arrays broadcast, so one call prices many (batch, context) points at once.
        """
        m, hw = self.model, self.hw
        b, dt = m.bytes_per_param, m.dtype
        T = np.asarray(tokens, dtype=float)
        S = np.asarray(seqs, dtype=float)
        c = np.asarray(ctx, dtype=float)
        h, q, F = m.hidden_size, m.q_dim / tp, m.intermediate_size / tp
        kv = m.kv_heads_per_gpu(tp) * m.head_dim
        t_qkv = gemm_time_s(hw, T, h, q + 2 * kv, b, dt)
        t_o = gemm_time_s(hw, T, q, h, b, dt)
        kv_read = S * c * 2 * kv * b
        t_attn = roofline_s(hw, 4.0 * T * c * q, kv_read + 2 * T * q * b, dt)
        if m.is_moe:
            # Experts touched by T tokens routed top-k among E (uniform routing): E(1-(1-k/E)^T).
            e, k = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** T)
            w_bytes = touched * m.expert_params / tp * b
            t_mlp = roofline_s(hw, 2.0 * T * k * m.expert_params / tp, w_bytes + T * h * b * 2 * k, dt)
            t_mlp = t_mlp + 2 * hw.op_overhead_us * 1e-6 + gemm_time_s(hw, T, h, e, b, dt)
            act_elems = T * k * 3 * m.moe_intermediate_size / tp
        else:
            t_mlp = gemm_time_s(hw, T, h, 2 * F, b, dt) + gemm_time_s(hw, T, F, h, b, dt)
            act_elems = T * 3 * F
        # Elementwise: 2 norms (read+write h), rope on q and k, SiLU*mul (read 2F write F), 2 adds:
        # 6 kernels, priced as one bandwidth pass with its overhead plus 5 more launches.
        elem = T * b * (2 * 2 * h + 2 * (q + kv) + 2 * 3 * h) + act_elems * b
        t_elem = memory_bound_s(hw, elem) + 5 * hw.op_overhead_us * 1e-6
        t_ar = 2 * all_reduce_s(hw, T * h * b, tp)
        layer = t_qkv + t_o + t_attn + t_mlp + t_elem + t_ar
        head = gemm_time_s(hw, S, h, m.vocab_size / tp, b, dt)
        return np.asarray(m.num_layers * layer + head)

    def decode_step_s(self, tp: int, batch: ArrayLike, ctx: ArrayLike) -> np.ndarray:
        """Inter-token latency of a decode step with `batch` sequences of mean context `ctx`: the
        forward pass plus the serving engine's CPU time per step (0 unless the hardware sets it)."""
        hw = self.hw
        cpu_s = (
            hw.serving_step_overhead_us + hw.serving_seq_overhead_us * np.asarray(batch, dtype=float)
        ) * 1e-6
        return self.forward_s(tp, batch, batch, ctx) + cpu_s

    def prefill_s_per_token(self, tp: int, ctx: ArrayLike) -> np.ndarray:
        """Seconds per prefilled token in full chunks whose tokens attend `ctx` tokens on average."""
        chunk = PREFILL_CHUNK_TOKENS
        return self.forward_s(tp, np.full_like(np.asarray(ctx, float), chunk), 1.0, ctx) / chunk

    def concurrency(self, tp: int, mean_ctx: ArrayLike, num_seqs: ArrayLike) -> np.ndarray:
        """Sequences in flight: max_num_seqs, the KV cache at the mean context, and the work at hand."""
        kv_limit = np.floor(self.kv_capacity_tokens(tp) / np.maximum(np.asarray(mean_ctx, float), 1.0))
        return np.maximum(1.0, np.minimum(np.minimum(kv_limit, self.max_num_seqs), num_seqs))

    def active_batch(
        self,
        tp: int,
        in_flight: ArrayLike,
        gen_each: ArrayLike,
        prefill_each: ArrayLike,
        tool_each: ArrayLike,
        ctx: ArrayLike,
        mean_ctx: ArrayLike,
    ) -> np.ndarray:
        """Sequences decoding at once when `in_flight` trajectories share an instance: those not
        waiting on a tool, `clip(q x busy / (busy + tool), 1, cap)` with busy = a trajectory's decode
        (`gen_each` tokens at the step of that batch, context `ctx`) plus prefill time, cap = the
        KV cache at `mean_ctx` and max_num_seqs; a fixed point, `_ACTIVE_ROUNDS` rounds from the
        capped in-flight count. Arrays broadcast."""
        q = np.asarray(in_flight, dtype=float)
        cap = self.concurrency(tp, mean_ctx, np.inf)
        pre = np.asarray(prefill_each, dtype=float) * self.prefill_s_per_token(tp, ctx)
        tool = np.asarray(tool_each, dtype=float)
        batch = np.minimum(q, cap)
        gen = np.asarray(gen_each, dtype=float)
        for _ in range(_ACTIVE_ROUNDS):
            batch = np.clip(decode_demand(q, gen, self.decode_step_s(tp, batch, ctx), pre, tool), 1.0, cap)
        return batch


def decode_demand(
    in_flight: ArrayLike, gen_each: ArrayLike, step_s: ArrayLike, prefill_s: ArrayLike, tool_s: ArrayLike
) -> np.ndarray:
    """Sequences of `in_flight` trajectories that want to decode at once, uncapped: those not
    waiting on a tool, `q x busy / (busy + tool)` with busy = `gen_each` tokens at `step_s` plus
    `prefill_s` (a trajectory's decode and prefill seconds, `tool_s` its tool seconds)."""
    busy = np.asarray(gen_each, dtype=float) * np.asarray(step_s, dtype=float) + np.asarray(
        prefill_s, dtype=float
    )
    return (
        np.asarray(in_flight, dtype=float) * busy / np.maximum(busy + np.asarray(tool_s, dtype=float), 1e-12)
    )


def instance_tp_degrees(model: ModelSpec, hw: HardwareSpec) -> tuple[int, ...]:
    """TP degrees an instance may use: powers of two within a node that shard the heads evenly."""
    out = []
    t = 1
    while t <= hw.gpus_per_node:
        if model.supports_tp(t):
            out.append(t)
        t *= 2
    return tuple(out)


def build_segment_table(
    cost: RolloutCostModel,
    w: Workload,
    tps: tuple[int, ...],
    num_bins: int,
    max_gpus: int,
    promote: bool = False,
    queue_wait: bool = False,
    two_phase: bool = False,
) -> SegmentTable:
    """Price every contiguous range of length-sorted bins on n TP-t instances (assignment.py).

    Per range [i, j): R trajectories (scaled to one iteration), D decode tokens, P prefill tokens,
    L tool seconds. Spread over n instances (n = 1 .. max_gpus // min TP), each instance holds
    q = R / n trajectories, of which only those not waiting on a tool decode: the active batch is
    `B = clip(q x busy / (busy + tool), 1, cap)` with busy = the mean trajectory's decode plus
    prefill time at the step ITL(t, B, decode-weighted mean context) (a fixed point, a few
    rounds) and cap = min(max_num_seqs, KV cache / mean context). Work (instance-seconds)
    `W = D s / B + P x prefill s/token`; critical path `C = max over the range's trajectories of
    (s g + prefill x P + tool latency)`, evaluated on each bin's slowest trajectories at one
    sequence's and at a full batch's step (`_slowest_per_group`; until 2026-12 the gen, prefill and
    tool maxima of a bin were combined, which could belong to three different trajectories);
    C = inf when TP t cannot shard the model or hold the range's longest context.

    `promote`: price the routing that promotes (mlfq, and C-MLFQ when its tree is unsure) instead of
    admitting each trajectory to the range of its final length. Every trajectory starts in the
    first range and moves up as its context grows, so the range of bins [i, j) serves the band of
    context (T_{i-1}, T_{j-1}] (T_b: the longest trajectory of bin b) of every trajectory that
    reaches T_{i-1}, and each of them prefills its T_{i-1} tokens again when it arrives (i > 0).
    A request moves only at a tool return, so a trajectory climbs only up to its context at its
    last tool return (`ceiling`: `Workload.last_call_ctx_tokens`; when the workload lacks it, the
    calls spread evenly over its growth, prompt + growth x calls / (calls + 1), which underprices a
    long answer after an early call, docs/simulator-notebook.md, sixteenth session; a trajectory
    without tool calls never leaves the first range) and ends in that band. Its generated, prefill
    and tool work is spread over its growth in proportion (`_band_shares`), so per-bin sums stay
    prefix-summable and the DP is unchanged. The critical path of a range is the slowest
    trajectory's path from its prompt to the range's top (its whole path if it ends there) at this
    range's step, plus the re-prefill: a lower bound on its time through the earlier (never
    larger-TP) ranges too. With one range over every bin it prices exactly as without `promote`.

    `queue_wait` (a what-if, off by default): when a range's trajectories per instance q exceed
    what the KV cache holds at its mean context (H), the critical path also pays the wait of a
    slowest trajectory queued behind the others: `0.5 x (1 - H / q) x work per instance` (with
    `promote` only in ranges that start at the first bin, where every trajectory starts). Without
    it the path is priced at the capped batch whatever the instance count, so under load the price
    of a split stops falling with more rollout GPUs (docs/simulator-notebook.md, "Pricing the queue").

    `two_phase` (`SearchSettings.two_phase_path`, on in the planner and the simulator since
    2026-12-04): the critical path in two phases. While
    an instance works through its share of the range (W / n seconds), the slowest trajectory
    advances at the loaded pace: the step at the active batch, stretched by the prefills of the
    other trajectories' turns that join it (1 + prefill time / decode time of the range, times the
    others' share 1 - 1/q), and, when more of the range's
    trajectories want to decode than the KV cache holds (demand `q x busy / (busy + tool)` above
    the cap H), holding a slot only a share rho = H / demand of the time. After that it runs the
    rest of its path at one sequence's step: `C = W/n + (1 - f) x C_1`, f = min(1, (W/n) x rho /
    C_loaded); if it would finish within the first phase, `C = C_loaded / rho`. Without it the
    path is priced at the capped batch for its whole life, flat in n under load and pessimistic
    when the batch empties before the slowest trajectory ends (docs/simulator-notebook.md,
    fourteenth session).
    """
    order = np.argsort(w.total_tokens, kind="stable")
    prompts = w.prompt_tokens[order].astype(float)
    g = w.gen_tokens[order]
    pre = w.prefill_tokens[order]
    lat = w.tool_latency_s[order]
    final = w.total_tokens[order]
    life_ctx = w.prompt_tokens[order] + (g + w.payload_tokens[order]) / 2  # mean context over a life
    k = max(1, min(num_bins, len(order)))
    edges = np.linspace(0, len(order), k + 1).round().astype(int)
    bin_of = np.repeat(np.arange(k), np.diff(edges))  # each sorted trajectory's bin
    wt = w.weight

    def prefix(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(np.add.reduceat(x, edges[:-1]))])

    def bin_max(x: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(x, edges[:-1])

    fmax = bin_max(final)
    i_idx, j_idx = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
    valid = j_idx > i_idx

    def rng(c: np.ndarray) -> np.ndarray:
        return np.where(valid, c[j_idx] - c[i_idx], np.nan)

    cum_r = prefix(np.full(len(g), wt))
    if promote:
        # Band floors: a range starting at bin i serves contexts above T_{i-1} (0 for bin 0).
        floor = np.concatenate([[0.0], fmax[:-1]])
        if w.last_call_ctx_tokens is not None:  # measured: the context at the last tool return
            ceiling = np.clip(w.last_call_ctx_tokens[order].astype(float), prompts, final)
        else:  # the calls spread evenly over the growth
            calls = w.tool_calls[order].astype(float)
            ceiling = prompts + (final - prompts) * calls / (calls + 1.0)
        share, mid = _band_shares(prompts, final.astype(float), floor, fmax, ceiling)
        stop_band = np.searchsorted(fmax, ceiling, side="left").clip(0, k - 1)  # where each stops climbing

        def bands(x: np.ndarray, by: np.ndarray = share) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(by.T @ (x * wt))])  # (K+1,) prefix over bins

        ones = np.ones(len(g))
        cum_s, cum_sctx = bands(ones), bands(ones, share * mid)
        cum_d, cum_p, cum_l, cum_gctx = bands(g), bands(pre), bands(lat), bands(g, share * mid)
        # Everyone longer than the floor passes through; each arrival prefills its floor again.
        passing = wt * (ceiling[None, :] > floor[:, None]).sum(axis=1)  # (K,) by start bin
        passing[0] = wt * len(g)
        r = np.where(valid, np.concatenate([passing, [0.0]])[i_idx], np.nan)
        d, lat_sum = rng(cum_d), rng(cum_l)
        p = rng(cum_p) + np.where(i_idx > 0, r * floor[np.minimum(i_idx, k - 1)], 0.0)
        r_safe = np.where(np.nan_to_num(r) > 0, r, 1.0)  # no trajectory may reach a range
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_ctx = np.nan_to_num(rng(cum_sctx) / rng(cum_s), nan=1.0)
    else:
        cum_d, cum_p = prefix(g * wt), prefix(pre * wt)
        cum_ctx, cum_gctx, cum_l = prefix(life_ctx * wt), prefix(g * life_ctx * wt), prefix(lat * wt)
        r, d, p, lat_sum = rng(cum_r), rng(cum_d), rng(cum_p), rng(cum_l)
        r_safe = np.nan_to_num(r, nan=1.0)
        mean_ctx = np.nan_to_num(rng(cum_ctx) / r, nan=1.0)
    dec_ctx = np.where(d > 0, rng(cum_gctx) / np.where(d > 0, d, 1.0), mean_ctx)
    safe_ctx = np.nan_to_num(dec_ctx, nan=1.0)
    gen_each, pre_each = np.nan_to_num(d) / r_safe, np.nan_to_num(p) / r_safe
    tool_each = np.nan_to_num(lat_sum) / r_safe
    # in_range[i, j, b]: bin b lies in [i, j)
    b_idx = np.arange(k)
    in_range = (b_idx[None, None, :] >= i_idx[:, :, None]) & (b_idx[None, None, :] < j_idx[:, :, None])
    bin_longest = fmax
    if promote:
        # A trajectory stays in the band of its last tool return and grows past it there: its
        # final context must fit that range's instances too (until 2026-12-07 only the bins' own
        # longest were checked, so a range could be priced finite while one it serves overflowed).
        stays = np.zeros(k)
        np.maximum.at(stays, stop_band, final.astype(float))
        bin_longest = np.maximum(fmax, stays)
    longest = np.where(in_range, bin_longest[None, None, :], 0.0).max(axis=2)
    supported = [tp for tp in tps if cost.model.supports_tp(tp)]
    # Counts beyond the iteration's trajectories price like it (batch 1), so N stops there.
    nn = max(1, min(max_gpus // min(supported) if supported else 1, math.ceil(float(cum_r[-1]))))
    q = r_safe[None] / np.arange(1, nn + 1, dtype=float)[:, None, None]  # (N, K+1, K+1)
    work = np.full((len(tps), nn, k + 1, k + 1), np.inf)
    crit = np.full((len(tps), nn, k + 1, k + 1), np.inf)
    iu, ju = np.nonzero(valid)  # the ranges [i, j), i < j
    members = in_range[iu, ju]  # (ranges, K): bin b lies in the range
    for ti, tp in enumerate(tps):
        if not cost.model.supports_tp(tp):
            continue
        per_tok = cost.prefill_s_per_token(tp, safe_ctx)
        batch = cost.active_batch(tp, q, gen_each, pre_each, tool_each, safe_ctx, mean_ctx)
        step = cost.decode_step_s(tp, batch, safe_ctx)
        ok = valid & (longest <= cost.kv_capacity_tokens(tp))
        work[ti] = np.where(ok, np.nan_to_num(d) * step / batch + np.nan_to_num(p) * per_tok, np.inf)
        # Each bin's slowest trajectory at the two ends of the decode step's range (one sequence,
        # a full batch), at the workload's decode-weighted context: the path is linear in the
        # step, so these are the bin's slowest at either end and close in between.
        ctx_all = float(safe_ctx[0, k])
        full = float(cost.concurrency(tp, float(mean_ctx[0, k]), np.inf))
        ends = [float(cost.decode_step_s(tp, b, ctx_all)) for b in (1.0, full)]
        c_ref = float(cost.prefill_s_per_token(tp, ctx_all))
        idx = _slowest_per_group(bin_of, k, g, pre, lat, [(a, c_ref) for a in ends])  # (K, 2)
        cg, cp, cl = g[idx], pre[idx], lat[idx]
        pt = per_tok[iu, ju][:, None]
        if promote:
            # A candidate of bin b >= i crosses the range; its path up to the range's top, scaled by
            # the share of its growth below that top, plus its re-prefill on arrival.
            start, top, high = prompts[idx], final[idx].astype(float), ceiling[idx]  # (K, 2)
            range_top = fmax[ju - 1][:, None, None]
            # Ends in this range (its ceiling is below the range's top): its whole path.
            up_to = np.where(high[None] <= range_top, top[None], np.clip(range_top, start[None], top[None]))
            frac = (up_to - start[None]) / np.maximum(top - start, 1.0)[None]  # (ranges, K, 2)
            arrive = np.where(iu > 0, per_tok[iu, ju] * floor[np.minimum(iu, k - 1)], 0.0)[:, None]
            reaches = (iu[:, None, None] == 0) | (high[None] > floor[iu][:, None, None])  # (ranges, K, 2)
            gen = [frac[:, :, c] * cg[None, :, c] for c in (0, 1)]
            fixed = [
                np.where(
                    reaches[:, :, c], frac[:, :, c] * (pt * cp[None, :, c] + cl[None, :, c]) + arrive, -np.inf
                )
                for c in (0, 1)
            ]
            # The bin's slowest may climb out while a slower-to-leave one stays: per band of
            # ceilings, the slowest trajectory that stops climbing there runs its whole path in
            # every range that holds that band (`members`; a range [i, j) with i > 0 is reached
            # only from bands >= i, and one starting at 0 by every band below j).
            sidx = _slowest_per_group(stop_band, k, g, pre, lat, [(a, c_ref) for a in ends])  # (K, 2)
            for c in (0, 1):
                some = sidx[:, c] >= 0
                sg, sp, sl = (np.where(some, x[sidx[:, c]], 0.0) for x in (g, pre, lat))
                gen[c] = np.concatenate([gen[c], np.broadcast_to(sg[None, :], members.shape)], axis=1)
                whole = np.where(members & some[None, :], pt * sp[None, :] + sl[None, :] + arrive, -np.inf)
                fixed[c] = np.concatenate([fixed[c], whole], axis=1)
        else:
            gen = [np.broadcast_to(cg[None, :, c], members.shape) for c in (0, 1)]
            fixed = [np.where(members, pt * cp[None, :, c] + cl[None, :, c], -np.inf) for c in (0, 1)]
        usable = min(nn, max(1, max_gpus // tp))  # more instances than this never fit in max_gpus

        loaded = step
        if two_phase:
            dec_time = np.nan_to_num(d) * step / batch
            stall = np.where(dec_time > 0, np.nan_to_num(p) * per_tok / np.maximum(dec_time, 1e-12), 0.0)
            others = np.maximum(0.0, 1.0 - 1.0 / np.maximum(q, 1.0))  # its own prefill is in its path
            loaded = step * (1.0 + stall * others)
        path = np.empty((usable, len(iu)))
        for m in range(usable):
            path[m] = _slowest_path(loaded[m, iu, ju], gen, fixed)
        if two_phase:
            demand = np.maximum(1.0, decode_demand(q, gen_each, step, pre_each * per_tok, tool_each))
            rho = np.minimum(1.0, cost.concurrency(tp, mean_ctx, np.inf)[None] / demand)[:usable, iu, ju]
            alone = _slowest_path(cost.decode_step_s(tp, 1.0, safe_ctx[iu, ju]), gen, fixed)[None]
            first = work[ti][:usable, iu, ju] / np.arange(1, usable + 1)[:, None]  # W / n
            with np.errstate(invalid="ignore"):
                done = np.minimum(1.0, first * rho / np.maximum(path, 1e-12))
                path = np.where(done < 1.0, first + (1.0 - done) * alone, path / rho)
        crit[ti, :usable, iu, ju] = path.T
        if queue_wait:
            # Trajectories beyond what the KV cache holds at once wait for room: the slowest one
            # starts, on average, halfway through the share of the work queued ahead of it.
            held = cost.concurrency(tp, mean_ctx, np.inf)  # (K+1, K+1)
            per_inst = np.nan_to_num(work[ti, :usable]) / np.arange(1, usable + 1)[:, None, None]
            queued = np.clip(1.0 - held[None] / np.maximum(q[:usable], 1e-12), 0.0, 1.0)
            wait = 0.5 * queued * per_inst
            if promote:  # later ranges receive trajectories as they climb, not all at the start
                wait[:, 1:, :] = 0.0
            crit[ti, :usable] = np.where(np.isfinite(crit[ti, :usable]), crit[ti, :usable] + wait, np.inf)
        crit[ti, usable:] = crit[ti, usable - 1]  # counts no plan can use price like the last usable
        work[ti, usable:] = work[ti, usable - 1]
        crit[ti] = np.where(ok, crit[ti], np.inf)
    return SegmentTable(tuple(tps), work, crit, edges, fmax)


def _slowest_path(step: np.ndarray, gen: list[np.ndarray], fixed: list[np.ndarray]) -> np.ndarray:
    """(ranges,) the slowest candidate's path at each range's decode step: `step x gen + fixed`
    over both candidate sets; 0 for a range no trajectory reaches (promotion)."""
    s = step[:, None]
    return np.maximum(np.maximum(s * gen[0] + fixed[0], s * gen[1] + fixed[1]).max(axis=1), 0.0)


def _slowest_per_group(
    band: np.ndarray,
    k: int,
    g: np.ndarray,
    pre: np.ndarray,
    lat: np.ndarray,
    weights: list[tuple[float, float]],
) -> np.ndarray:
    """(K, len(weights)) index of the slowest trajectory of each group (`band`: one of 0..K-1 per
    trajectory: its length bin, or the band it stops climbing in) when a trajectory takes
    `a x gen + c x prefill + tool` seconds, per (a, c); -1 for an empty group."""
    idx = np.full((k, len(weights)), -1, dtype=int)
    order = np.argsort(band, kind="stable")
    starts = np.searchsorted(band[order], np.arange(k + 1), side="left")
    for col, (a, c) in enumerate(weights):
        score = (a * g + c * pre + lat)[order]
        for b in range(k):
            lo, hi = starts[b], starts[b + 1]
            if hi > lo:
                idx[b, col] = order[lo + int(np.argmax(score[lo:hi]))]
    return idx


def _band_shares(
    prompt: np.ndarray,
    final: np.ndarray,
    floor: np.ndarray,
    top: np.ndarray,
    ceiling: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) share of each trajectory's growth (prompt -> final tokens) served in each bin's band
    (floor_b, top_b], and the mean context it is served at. A trajectory climbs the bands up to
    `ceiling` (default: its final length) and serves the rest of its growth in the band it stopped
    in. Shares sum to 1 over the bands; the share-weighted contexts average to `(prompt + final)
    / 2`, the trajectory's mean context over its life (what `build_segment_table` uses without
    promotion)."""
    high = final if ceiling is None else np.clip(ceiling, prompt, final)
    lo = np.clip(floor[None, :], prompt[:, None], high[:, None])
    hi = np.clip(top[None, :], prompt[:, None], high[:, None])
    grown = np.maximum(final - prompt, 1e-12)
    share = (hi - lo) / grown[:, None]
    weighted = share * (lo + hi) / 2
    # The growth past the ceiling (and all of a trajectory that never grew) stays in its band.
    rest = (final - high) / grown
    rest = np.where(final > prompt, rest, 1.0)
    band = np.searchsorted(top, high, side="left").clip(0, len(top) - 1)
    rows = np.arange(len(final))
    share[rows, band] += rest
    weighted[rows, band] += rest * (high + final) / 2
    mid = np.divide(weighted, share, out=np.zeros_like(share), where=share > 0)
    return share, mid
