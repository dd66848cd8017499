"""Calibration of the cost model: offline against Vidur profiles, online against our own timings.

Offline: the Vidur operator profiles (MLP-block operators by tokens x TP for Llama-2-7B on A100 and
H100, Llama-3-8B on A100; all-reduce and send/recv by message size on A100/H100 DGX nodes) are
predicted with the same roofline and collective formulas the planner uses (ops.py). `fit_compute`
and `fit_network` grid-search the efficiency factors of a `HardwareSpec`; `error_rows` reports the
error per operator kind. benchmarks/cost_model_error.py prints the table; the fitted factors are
written into hardware.yaml by hand.

Online: `StageCorrection` keeps, per stage, a bounded EWMA of measured/predicted time; the plan
stage multiplies the model's predictions by it, so systematic model error stops steering plans.
"""

from __future__ import annotations

import csv
import itertools
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from libra_core.planner.ops import all_reduce_s, gemm_time_s, memory_bound_s, send_recv_s
from libra_core.planner.specs import HardwareSpec

log = logging.getLogger(__name__)

# Profile sub-paths of the Vidur dataset (folder layout of ../shared/data/profiles).
COMPUTE_PROFILES = {
    "A100": [
        "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
        "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
    ],
    "H100": ["compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv"],
}
NETWORK_PROFILES = {
    "A100": ["network/a100_dgx/all_reduce.csv", "network/a100_dgx/send_recv.csv"],
    "H100": ["network/h100_dgx/all_reduce.csv", "network/h100_dgx/send_recv.csv"],
}
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("mlp_act", "input_layernorm", "post_attention_layernorm", "add", "attn_rope")
PROFILE_DTYPE_BYTES = 2  # Vidur profiles fp16


@dataclass(frozen=True)
class OpSample:
    """One measured operator: what it is, its roofline inputs, and its measured median time."""

    source: str  # e.g. "Llama-2-7b-hf"
    op: str  # Vidur operator or collective name
    kind: str  # gemm | elementwise | all_reduce_intra | all_reduce_inter | send_recv_intra | ...
    measured_s: float
    flops: float = 0.0
    bytes_moved: float = 0.0
    m: float = 0.0
    k: float = 0.0
    n: float = 0.0
    ranks: int = 1
    ranks_per_node: int = 1


def _median_s(path: Path, line: int, row: dict[str, str], column: str) -> float:
    """The row's median time in seconds (the CSV has ms); refuses what no fit can use: a time of 0
    (the log error is infinite, the fit ended with an efficiency of 0), a negative or NaN one."""
    text = row.get(column)
    try:
        ms = float(text) if text is not None else math.nan
    except ValueError:
        ms = math.nan
    if not (math.isfinite(ms) and ms > 0):
        raise ValueError(f"{path}, line {line}: {column} must be a time > 0 ms, got {text!r}")
    return ms * 1e-3


def load_compute_samples(path: Path) -> list[OpSample]:
    """MLP-block operators of a Vidur `mlp.csv` as roofline problems (times in the CSV are ms).
    A time that is not > 0 raises a ValueError naming the file, line and column."""
    out: list[OpSample] = []
    source = path.parent.name
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            h, heads, kvh = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
            ffn, tokens, tp = (
                int(row["n_expanded_embd"]),
                int(row["num_tokens"]),
                int(row["num_tensor_parallel_workers"]),
            )
            hd = h // heads
            q, kv, f_tp = heads // tp * hd, math.ceil(kvh / tp) * hd, ffn / tp
            gemms = {
                "attn_pre_proj": (h, q + 2 * kv),
                "attn_post_proj": (q, h),
                "mlp_up_proj": (h, 2 * f_tp),
                "mlp_down_proj": (f_tp, h),
            }
            b = PROFILE_DTYPE_BYTES
            elem_bytes = {
                "mlp_act": tokens * 3 * f_tp * b,
                "input_layernorm": tokens * 2 * h * b,
                "post_attention_layernorm": tokens * 2 * h * b,
                "add": tokens * 3 * h * b,
                "attn_rope": tokens * 2 * (q + kv) * b,
            }
            for op, (k, n) in gemms.items():
                seconds = _median_s(path, reader.line_num, row, f"time_stats.{op}.median")
                out.append(
                    OpSample(
                        source,
                        op,
                        "gemm",
                        seconds,
                        2.0 * tokens * k * n,
                        b * (tokens * k + k * n + tokens * n),
                        tokens,
                        k,
                        n,
                    )
                )
            for op, nbytes in elem_bytes.items():
                seconds = _median_s(path, reader.line_num, row, f"time_stats.{op}.median")
                out.append(OpSample(source, op, "elementwise", seconds, 0.0, nbytes))
    return out


def load_network_samples(path: Path) -> list[OpSample]:
    """Collectives of a Vidur network CSV; `size` is bytes (Vidur records 2 x fp16 elements).
    A time that is not > 0 raises a ValueError naming the file, line and column."""
    out = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            coll = row["collective"]
            ranks, per_node = int(row["num_workers"]), int(row["devices_per_node"])
            # inter: a ring over full nodes (how the planner places groups); inter_partial: fewer
            # devices per node than the node has (Vidur's 2-node runs with 1, 2 or 4 per node).
            where = (
                "intra"
                if ranks <= per_node
                else "inter"
                if per_node == int(row["max_devices_per_node"])
                else "inter_partial"
            )
            seconds = _median_s(path, reader.line_num, row, f"time_stats.{coll}.median")
            out.append(
                OpSample(
                    path.parent.name,
                    coll,
                    f"{coll}_{where}",
                    seconds,
                    bytes_moved=float(row["size"]),
                    ranks=ranks,
                    ranks_per_node=per_node,
                )
            )
    return out


def predict(hw: HardwareSpec, s: OpSample) -> float:
    """The planner's prediction for one profiled operator, with `hw`'s efficiency factors."""
    if s.kind == "gemm":
        return float(gemm_time_s(hw, s.m, s.k, s.n, PROFILE_DTYPE_BYTES, "bfloat16"))
    if s.kind == "elementwise":
        return float(memory_bound_s(hw, s.bytes_moved))
    if s.op == "all_reduce":
        return float(all_reduce_s(hw, s.bytes_moved, s.ranks, s.ranks_per_node))
    if s.op == "send_recv":
        return send_recv_s(hw, s.bytes_moved, cross_node=s.ranks > s.ranks_per_node)
    raise ValueError(f"no prediction for operator kind {s.kind!r}")


@dataclass(frozen=True)
class ErrorRow:
    gpu: str
    kind: str
    samples: int
    mean_ape: float  # mean |pred - measured| / measured
    median_ape: float
    p90_ape: float
    bias: float  # median of pred / measured (1.0: unbiased)


def error_rows(gpu: str, hw: HardwareSpec, samples: Iterable[OpSample], by: str = "kind") -> list[ErrorRow]:
    groups: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        groups.setdefault(getattr(s, by), []).append((predict(hw, s), s.measured_s))
    rows = []
    for key, pairs in sorted(groups.items()):
        pred, meas = np.array(pairs).T
        ape = np.abs(pred - meas) / meas
        rows.append(
            ErrorRow(
                gpu,
                key,
                len(pairs),
                float(ape.mean()),
                float(np.median(ape)),
                float(np.quantile(ape, 0.9)),
                float(np.median(pred / meas)),
            )
        )
    return rows


def _log_error(hw: HardwareSpec, samples: list[OpSample]) -> float:
    return float(np.mean([abs(math.log(predict(hw, s) / s.measured_s)) for s in samples]))


def _check_times(samples: Iterable[OpSample]) -> None:
    """A fit's samples must be timed: a time of 0 makes every candidate's log error infinite, and
    the fit used to return an efficiency of 0 (a division by zero in the next prediction)."""
    for s in samples:
        if not (math.isfinite(s.measured_s) and s.measured_s > 0):
            raise ValueError(
                f"sample {s.source}/{s.op} ({s.kind}): measured_s must be a time > 0 s, got {s.measured_s!r}"
            )


def _fitted(hw: HardwareSpec, update: dict[str, float]) -> HardwareSpec:
    """`hw` with the fitted factors, validated (`model_copy` alone would skip the field bounds)."""
    return HardwareSpec.model_validate({**hw.model_dump(), **update})


def fit_compute(hw: HardwareSpec, samples: list[OpSample]) -> HardwareSpec:
    """Grid-search the compute factors minimising mean |log error|.

    GEMMs fix gemm_compute_eff, mem_bw_eff and op_overhead_us; elementwise operators then fix
    elementwise_bw_eff (they reach a much lower share of HBM bandwidth than weight streaming).
    A kind with no samples keeps `hw`'s factors; a sample timed 0 (or not finite) raises ValueError.
    """
    gemm = [s for s in samples if s.kind == "gemm"]
    elem = [s for s in samples if s.kind == "elementwise"]
    _check_times([*gemm, *elem])
    peak, bw = hw.peak_flops_per_s("bfloat16"), hw.mem_bw_bytes_per_s
    update: dict[str, float] = {}
    if gemm:
        flops = np.array([s.flops for s in gemm])
        gbytes = np.array([s.bytes_moved for s in gemm])
        meas_g = np.array([s.measured_s for s in gemm])
        best = (math.inf, hw.gemm_compute_eff, hw.mem_bw_eff, hw.op_overhead_us)
        for oh_us in np.arange(0.0, 16.01, 1.0):
            for ec, em in itertools.product(np.arange(0.3, 1.001, 0.02), np.arange(0.3, 1.001, 0.02)):
                pred = np.maximum(flops / (peak * ec), gbytes / (bw * em)) + oh_us * 1e-6
                err = float(np.abs(np.log(pred / meas_g)).mean())
                if err < best[0]:
                    best = (err, float(ec), float(em), float(oh_us))
        _, fit_ec, fit_em, oh = best
        update |= {"gemm_compute_eff": round(fit_ec, 2), "mem_bw_eff": round(fit_em, 2), "op_overhead_us": oh}
    else:
        log.info("fit_compute: no gemm samples; keeping %s's gemm factors", hw.name)
    if elem:
        ebytes = np.array([s.bytes_moved for s in elem])
        meas_e = np.array([s.measured_s for s in elem])
        best_e = (math.inf, hw.elementwise_bw_eff, hw.elementwise_overhead_us)
        for e_oh in np.arange(0.0, 10.01, 0.5):
            for ee in np.arange(0.1, 1.001, 0.02):
                err = float(np.abs(np.log((ebytes / (bw * ee) + e_oh * 1e-6) / meas_e)).mean())
                if err < best_e[0]:
                    best_e = (err, float(ee), float(e_oh))
        update |= {"elementwise_bw_eff": round(best_e[1], 2), "elementwise_overhead_us": best_e[2]}
    else:
        log.info("fit_compute: no elementwise samples; keeping %s's elementwise factors", hw.name)
    return _fitted(hw, update)


def fit_network(hw: HardwareSpec, samples: list[OpSample]) -> HardwareSpec:
    """Grid-search bus-bandwidth efficiency and latency, separately for intra- and inter-node.
    A group with no samples keeps `hw`'s factors; a sample timed 0 (or not finite) raises ValueError."""
    update: dict[str, float] = {}
    # Inter-node factors are fitted on rings over full nodes, the placement the planner uses.
    # Where no full-node inter-node all-reduce was profiled (H100), send/recv across nodes stands in.
    groups = {
        ("intra_allreduce_eff", "intra_latency_us"): ["all_reduce_intra"],
        ("intra_p2p_eff", "intra_p2p_latency_us"): ["send_recv_intra"],
        ("inter_allreduce_eff", "inter_latency_us"): ["all_reduce_inter"],
    }
    if not any(s.kind == "all_reduce_inter" for s in samples):
        groups[("inter_allreduce_eff", "inter_latency_us")] = ["send_recv_inter_partial"]
    for (eff_key, lat_key), kinds in groups.items():
        subset = [s for s in samples if s.kind in kinds]
        if not subset:
            log.info("fit_network: no %s samples; keeping %s's %s and %s", kinds, hw.name, eff_key, lat_key)
            continue
        _check_times(subset)
        best = (math.inf, getattr(hw, eff_key), getattr(hw, lat_key))
        lats = (2.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)
        for eff in np.arange(0.05, 1.001, 0.05):
            for lat in lats:
                err = _log_error(hw.model_copy(update={eff_key: float(eff), lat_key: lat}), subset)
                if err < best[0]:
                    best = (err, round(float(eff), 2), lat)
        update[eff_key], update[lat_key] = best[1], best[2]
    return _fitted(hw, update)


@dataclass
class StageCorrection:
    """Per-stage multiplicative correction of predicted times, learned from measured ones.

    Called by the plan stage once per iteration per stage (`rollout`, `update`, ...) with the time
    the model predicted for the plan that ran and the time measured; the simulator calls it at its
    replans. The factor is an EWMA of log(measured / predicted), each observation clamped to
    [min_factor, max_factor]. A stage's first observation is taken whole (there is nothing to
    average it with): one outlier then (a cold cache, a straggler in the first iteration) sets the
    factor to its ratio, up to the clamp, and later observations pull it back by a share `alpha`
    each (from 3x at alpha 0.3: 2.2x, 1.7x, 1.5x... once the model is right again). After the first,
    one outlier moves the log factor by at most alpha x log(max_factor). An observation with a time
    that is not finite or not > 0 (NaN, inf: a stage that was not timed) is ignored, the factor
    unchanged; a finite time <= 0 is the caller's error (ValueError). Mutates only its own state.
    """

    alpha: float = 0.3
    min_factor: float = 0.2
    max_factor: float = 5.0
    _log_factor: dict[str, float] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    def observe(self, stage: str, predicted_s: float, measured_s: float) -> float:
        """Fold one (predicted, measured) pair into `stage`'s factor; returns the factor now."""
        if not (math.isfinite(predicted_s) and math.isfinite(measured_s)):
            # NaN passed the `<= 0` check below and became the 0.2 clamp; inf raised a math error.
            log.debug(
                "stage %r: ignored predicted %r s, measured %r s (not finite)", stage, predicted_s, measured_s
            )
            return self.factor(stage)
        if predicted_s <= 0 or measured_s <= 0:
            raise ValueError(f"stage {stage!r}: predicted_s and measured_s must be > 0")
        lo, hi = math.log(self.min_factor), math.log(self.max_factor)
        x = min(hi, max(lo, math.log(measured_s / predicted_s)))
        prev = self._log_factor.get(stage)
        self._log_factor[stage] = x if prev is None else (1 - self.alpha) * prev + self.alpha * x
        self._count[stage] = self._count.get(stage, 0) + 1
        return self.factor(stage)

    def factor(self, stage: str) -> float:
        return math.exp(self._log_factor.get(stage, 0.0))

    def observations(self, stage: str) -> int:
        return self._count.get(stage, 0)
