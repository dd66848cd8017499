"""Plan reports: the core of `libra plan`, a typed result with plain, rich and JSON renderings.

`plan_cluster("48xA800", "qwen3-14b", "swe-longtail")` parses the cluster, looks up the model,
loads the workload (a preset name or a trace Parquet file) and searches; the CLI only parses
arguments and prints `format_plain(report)` / `render_rich(report)` / `report.to_dict()`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra_core.planner.presets import PRESETS, workload_preset
from libra_core.planner.search import DEFAULT_MIXED_MARGIN, Plan, SearchSettings, plan_rank, search_plans
from libra_core.planner.specs import ClusterSpec, ModelSpec, get_model, parse_cluster
from libra_core.planner.workload import Workload, read_trace


@dataclass(frozen=True)
class PlanReport:
    cluster: ClusterSpec
    model: ModelSpec
    workload: Workload
    plans: tuple[Plan, ...]  # best first; empty when nothing fits
    search_s: float
    mixed_margin: float = 0.0  # the ranking's SearchSettings.mixed_margin
    two_phase_path: bool = True  # the rollout price's SearchSettings.two_phase_path

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    @property
    def margin_note(self) -> str | None:
        """Why a runner-up priced faster than the plan ranks behind it (None when none is). Ranks,
        not T_iter alone, are compared: a plan within the tie-break of a faster one ranks ahead of
        it by less busy time, which is not the margin's doing."""
        if not self.plans or all(plan_rank(p) >= plan_rank(self.plans[0]) for p in self.plans[1:]):
            return None
        return (
            f"mixed-TP layouts rank behind one degree unless priced more than {self.mixed_margin:.0%} "
            "faster (--mixed-margin; planner.mixed_margin)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster.label,
            "model": self.model.name,
            "workload": {"name": self.workload.name, **self.workload.stats()},
            "search_s": round(self.search_s, 3),
            "mixed_margin": self.mixed_margin,
            "two_phase_path": self.two_phase_path,
            "feasible": bool(self.plans),
            "plan": plan_to_dict(self.plans[0]) if self.plans else None,
            "runners_up": [plan_to_dict(p) for p in self.plans[1:]],
        }


def plan_to_dict(p: Plan) -> dict[str, Any]:
    est = p.train
    return {
        "train_gpus": p.train_gpus,
        "rollout_gpus": p.rollout_gpus,
        "idle_rollout_gpus": p.idle_rollout_gpus,
        "colocated": p.colocated,
        "staleness": p.staleness,
        "train_layout": {**est.layout.__dict__, "label": est.layout.label()},
        "train_memory_gb": round(est.memory.total_bytes / 1e9, 2),
        "pipeline_bubble": round(est.bubble_fraction, 4),
        "instance_tps": {str(k): v for k, v in p.instance_tps.items()},
        "rollout_groups": [
            {
                "tp": g.tp,
                "instances": g.instances,
                "max_len_tokens": p.bin_max_len[g.end_bin - 1] if p.bin_max_len else None,
                "predicted_s": round(g.time_s, 3),
            }
            for g in p.rollout.groups
        ],
        "t_train_s": round(p.t_train_s, 3),
        "t_rollout_s": round(p.t_rollout_s, 3),
        "t_sync_s": round(p.t_sync_s, 3),
        "t_iter_s": round(p.t_iter_s, 3),
        "tokens_per_iteration": round(p.tokens_per_iteration),
        "tokens_per_s": round(p.tokens_per_s, 1),
    }


def load_workload(spec: str, seed: int = 0, tool_latency_s: float = 1.0) -> Workload:
    """A preset name, or a path to a trace Parquet file (one row per trajectory)."""
    if spec in PRESETS:
        return workload_preset(spec, seed)
    path = Path(spec)
    if path.suffix == ".parquet" or path.exists():
        if not path.exists():
            raise ValueError(f"trace file {spec!r} not found")
        return read_trace(path, tool_latency_s=tool_latency_s)
    raise ValueError(f"workload {spec!r} is neither a preset ({sorted(PRESETS)}) nor a .parquet trace")


def plan_cluster(
    hardware: str,
    model: str,
    workload: str | Workload,
    staleness: int = 0,
    gpu_budget: int | None = None,
    seed: int = 0,
    top_k: int = 4,
    mixed_margin: float = DEFAULT_MIXED_MARGIN,
    two_phase_path: bool = True,
) -> PlanReport:
    """Plan `model` on `hardware` ("48xA800") for `workload` (preset, trace path or Workload).
    `mixed_margin`: as `planner.mixed_margin` (SearchSettings.mixed_margin); 0 ranks by price alone.
    `two_phase_path`: as `planner.two_phase_path`; False prices the path at the KV-capped batch."""
    cluster = parse_cluster(hardware)
    spec = get_model(model)
    w = workload if isinstance(workload, Workload) else load_workload(workload, seed)
    gpus = cluster.num_gpus if gpu_budget is None else min(gpu_budget, cluster.num_gpus)
    t0 = time.perf_counter()
    # The search re-solves its `top_k` best-looking splits exactly, so a smaller pool could miss the
    # best plan: at least the default pool is searched whatever `top_k` lists (before 2026-12-06,
    # `--top 1` could print another best plan than `--top 4`). A larger `top_k` searches more.
    settings = SearchSettings(
        staleness=staleness,
        top_k=max(top_k, SearchSettings().top_k),
        mixed_margin=mixed_margin,
        two_phase_path=two_phase_path,
    )
    # With a margin the search also returns the one-degree layouts' best (up to 2 x top_k plans).
    plans = search_plans(spec, cluster.hardware, gpus, w, settings)[:top_k]
    elapsed_s = time.perf_counter() - t0
    return PlanReport(cluster, spec, w, tuple(plans), elapsed_s, mixed_margin, two_phase_path)


def format_plain(r: PlanReport) -> str:
    st = r.workload.stats()
    lines = [
        f"cluster {r.cluster.label}  model {r.model.name} ({r.model.num_params / 1e9:.1f}B"
        f"{f', {r.model.num_active_params / 1e9:.1f}B active' if r.model.is_moe else ''})  "
        f"workload {r.workload.name}: {st['trajectories']:.0f} traj/iter, mean {st['mean_len']:.0f} "
        f"p90 {st['p90_len']:.0f} max {st['max_len']:.0f} tokens  (search {r.search_s:.2f}s)",
    ]
    if not r.plans:
        lines.append("no feasible plan: the model does not fit, or the longest context exceeds the KV cache")
        return "\n".join(lines)
    for rank, p in enumerate(r.plans):
        head = "plan" if rank == 0 else f"runner-up {rank}"
        tps = " ".join(f"{n}xTP{t}" for t, n in p.instance_tps.items())
        idle = f", {p.idle_rollout_gpus} idle" if p.idle_rollout_gpus else ""
        lines.append(
            f"{head}: train {p.train_gpus} GPUs [{p.train.layout.label()}, "
            f"{p.train.memory.total_bytes / 1e9:.1f} GB/GPU, bubble {p.train.bubble_fraction:.0%}] | "
            f"rollout {p.rollout_gpus} GPUs [{tps}{idle}] | T_train {p.t_train_s:.1f}s "
            f"T_rollout {p.t_rollout_s:.1f}s T_sync {p.t_sync_s:.2f}s T_iter {p.t_iter_s:.1f}s "
            f"{p.tokens_per_s:,.0f} tok/s"
        )
    if r.margin_note:
        lines.append(r.margin_note)
    return "\n".join(lines)


def render_rich(r: PlanReport) -> Any:
    """A rich Table of the plans (import deferred: rich is only needed by the CLI)."""
    from rich.table import Table

    st = r.workload.stats()
    table = Table(
        title=f"{r.cluster.label} · {r.model.name} · {r.workload.name} "
        f"(mean {st['mean_len']:.0f}, p90 {st['p90_len']:.0f} tokens)",
        caption=r.margin_note,
    )
    for col in (
        "",
        "train GPUs",
        "layout",
        "rollout GPUs",
        "instances",
        "T_train s",
        "T_rollout s",
        "T_iter s",
        "tok/s",
    ):
        table.add_column(col)
    for rank, p in enumerate(r.plans):
        tps = " ".join(f"{n}xTP{t}" for t, n in p.instance_tps.items())
        table.add_row(
            "plan" if rank == 0 else f"#{rank + 1}",
            str(p.train_gpus),
            p.train.layout.label(),
            str(p.rollout_gpus),
            tps,
            f"{p.t_train_s:.1f}",
            f"{p.t_rollout_s:.1f}",
            f"{p.t_iter_s:.1f}",
            f"{p.tokens_per_s:,.0f}",
        )
    return table
