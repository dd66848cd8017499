"""Operator and collective time primitives: the roofline every cost in the planner is built from.

An operator takes `max(FLOPs / (peak x gemm_compute_eff), bytes / (HBM bw x mem_bw_eff))` plus a
fixed per-operator overhead. Collectives follow the alpha-beta model with NCCL's bus-bandwidth
factors: an all-reduce over n ranks moves `2(n-1)/n x bytes` per rank, an all-gather or
reduce-scatter `(n-1)/n x bytes`, an all-to-all `(n-1)/n x bytes`, a send/recv `bytes`. Rings that
stay inside a node run at NVLink speed, rings that cross nodes at the per-GPU NIC speed. All
efficiency factors come from `HardwareSpec` (fitted on the Vidur profiles, see calibration.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from libra_core.planner.specs import HardwareSpec

# Functions take floats or numpy arrays (broadcasting), so the search prices many points at once.
Num = Any


def gemm_time_s(hw: HardwareSpec, m: Num, k: Num, n: Num, dtype_bytes: int, dtype: str) -> Num:
    """Time of an (m x k) @ (k x n) matmul reading both operands and writing the result once."""
    flops = 2.0 * m * k * n
    bytes_moved = dtype_bytes * (m * k + k * n + m * n)
    return roofline_s(hw, flops, bytes_moved, dtype)


def roofline_s(hw: HardwareSpec, flops: Num, bytes_moved: Num, dtype: str) -> Num:
    compute_s = flops / (hw.peak_flops_per_s(dtype) * hw.gemm_compute_eff)
    memory_s = bytes_moved / (hw.mem_bw_bytes_per_s * hw.mem_bw_eff)
    return np.maximum(compute_s, memory_s) + hw.op_overhead_us * 1e-6


def memory_bound_s(hw: HardwareSpec, bytes_moved: Num) -> Num:
    """An elementwise operator (norm, activation, residual add): bandwidth plus overhead."""
    return bytes_moved / (hw.mem_bw_bytes_per_s * hw.elementwise_bw_eff) + hw.elementwise_overhead_us * 1e-6


def _link(hw: HardwareSpec, ranks: int, ranks_per_node: int) -> tuple[float, float]:
    """(bus bandwidth in bytes/s, latency in s) of a ring over `ranks` with `ranks_per_node` per node."""
    if ranks <= ranks_per_node:
        return hw.intra_bw_bytes_per_s * hw.intra_allreduce_eff, hw.intra_latency_us * 1e-6
    return hw.inter_bw_bytes_per_s * hw.inter_allreduce_eff, hw.inter_latency_us * 1e-6


def all_reduce_s(hw: HardwareSpec, bytes_per_rank: Num, ranks: int, ranks_per_node: int | None = None) -> Num:
    """Ring all-reduce of `bytes_per_rank` over `ranks` (0 for a single rank)."""
    if ranks <= 1:
        return 0.0
    bw, lat = _link(hw, ranks, hw.gpus_per_node if ranks_per_node is None else ranks_per_node)
    return lat + 2.0 * (ranks - 1) / ranks * bytes_per_rank / bw


def all_gather_s(
    hw: HardwareSpec, bytes_total: float, ranks: int, ranks_per_node: int | None = None
) -> float:
    """All-gather (or reduce-scatter) whose full result is `bytes_total` on every rank."""
    if ranks <= 1 or bytes_total <= 0:
        return 0.0
    bw, lat = _link(hw, ranks, hw.gpus_per_node if ranks_per_node is None else ranks_per_node)
    return lat + (ranks - 1) / ranks * bytes_total / bw


def all_to_all_s(
    hw: HardwareSpec, bytes_per_rank: float, ranks: int, ranks_per_node: int | None = None
) -> float:
    """All-to-all where each rank sends `bytes_per_rank` spread evenly over the others."""
    return all_gather_s(hw, bytes_per_rank, ranks, ranks_per_node)


def send_recv_s(hw: HardwareSpec, bytes_moved: float, cross_node: bool) -> float:
    """Point-to-point transfer (pipeline-parallel activations) between two ranks."""
    if bytes_moved <= 0:
        return 0.0
    if cross_node:
        return hw.inter_latency_us * 1e-6 + bytes_moved / (hw.inter_bw_bytes_per_s * hw.inter_allreduce_eff)
    return hw.intra_p2p_latency_us * 1e-6 + bytes_moved / (hw.intra_bw_bytes_per_s * hw.intra_p2p_eff)
