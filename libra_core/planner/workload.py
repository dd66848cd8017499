"""Workload: the trajectory length statistics the planner plans for.

A `Workload` is a sample of trajectories (one array entry each) plus how many trajectories an
iteration holds (`prompts_per_iteration x group_size`); the sample is scaled to that count. It comes
from a documented preset (synthetic, seeded), a trace Parquet file with one row per trajectory
(`libra_core.traces.schema.TRACE_SCHEMA`, the one trace format), or the project's own trajectory
table (libra_core.data.schema) when replanning.

Per trajectory the planner needs: prompt tokens, generated tokens, tool-payload tokens, tool calls,
the context length at each tool return summed (`reprefill_ctx_tokens`: what is prefilled again if
the KV was dropped while the tool ran), the context length at the last tool return
(`last_call_ctx_tokens`: a router that moves requests only at tool returns cannot move one past
it) and the time spent in tools.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from libra_core.traces.schema import read_trace as read_validated_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    """A sample of trajectories (arrays of equal length) and the iteration it stands for."""

    name: str
    prompts_per_iteration: int
    group_size: int
    prompt_tokens: np.ndarray
    gen_tokens: np.ndarray
    payload_tokens: np.ndarray
    tool_calls: np.ndarray
    reprefill_ctx_tokens: np.ndarray
    tool_latency_s: np.ndarray
    reprefill_fraction: float = 1.0  # share of the context prefilled again after a tool return
    minibatches: int = 4  # optimizer steps per iteration (each ends with a pipeline flush)
    # Share of the iteration's sampled tokens that the update trains: below 1 when dynamic sampling
    # drops the groups without signal (and over-samples prompts to make up for them), or a
    # staleness bound drops trajectories. Rollout is priced on every sampled trajectory, training
    # on this share (TrainShape.from_workload).
    train_share: float = 1.0
    # GRPO group of each sampled trajectory (any ints; equal = same prompt of the same iteration),
    # from which spread.py estimates how much one iteration's times vary; None when unknown.
    group_index: np.ndarray | None = None
    # Context (prompt + generated + payload tokens) right after each trajectory's last tool return,
    # its prompt when it called no tool; None when unknown (the promoting routing's price then
    # spreads the calls evenly over the growth, rollout_cost.build_segment_table).
    last_call_ctx_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        assert n > 0, "a workload needs at least one trajectory"
        for f in ("gen_tokens", "payload_tokens", "tool_calls", "reprefill_ctx_tokens", "tool_latency_s"):
            assert len(getattr(self, f)) == n, f"{f} must have one entry per trajectory ({n})"
        for f in ("group_index", "last_call_ctx_tokens"):
            v = getattr(self, f)
            assert v is None or len(v) == n, f"{f} must have one entry per trajectory ({n})"
        # Values too (a ValueError, not an assert that `-O` removes): an all-zero workload divided by
        # zero deep in the training price, a negative or NaN one priced nonsense.
        for f in ("prompt_tokens", "gen_tokens", "payload_tokens", "tool_calls", "tool_latency_s"):
            values = np.asarray(getattr(self, f), dtype=float)
            if not (np.all(np.isfinite(values)) and np.all(values >= 0)):
                raise ValueError(f"workload {self.name!r}: {f} must be finite numbers >= 0")
        if not 0.0 <= self.train_share <= 1.0:  # NaN fails too
            raise ValueError(f"workload {self.name!r}: train_share must be in [0, 1], got {self.train_share}")
        if not float(np.sum(self.prompt_tokens) + np.sum(self.gen_tokens) + np.sum(self.payload_tokens)) > 0:
            raise ValueError(f"workload {self.name!r} has no tokens: nothing to plan for")

    @property
    def num_samples(self) -> int:
        return len(self.prompt_tokens)

    @property
    def trajectories_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size

    @property
    def weight(self) -> float:
        """Trajectories of one iteration that each sampled trajectory stands for."""
        return self.trajectories_per_iteration / self.num_samples

    @property
    def total_tokens(self) -> np.ndarray:
        """Final context length of each trajectory (what training runs forward/backward on)."""
        return self.prompt_tokens + self.gen_tokens + self.payload_tokens

    @property
    def prefill_tokens(self) -> np.ndarray:
        return self.prompt_tokens + self.payload_tokens + self.reprefill_fraction * self.reprefill_ctx_tokens

    def scaled(self, length_scale: float, name: str | None = None) -> Workload:
        """Same shape, generated and payload lengths multiplied (for drift studies)."""
        return replace(
            self,
            name=name or f"{self.name}x{length_scale:g}",
            gen_tokens=np.round(self.gen_tokens * length_scale),
            payload_tokens=np.round(self.payload_tokens * length_scale),
            # each call's context is the prompt (not scaled) plus the trajectory so far (scaled)
            reprefill_ctx_tokens=self.tool_calls * self.prompt_tokens
            + (self.reprefill_ctx_tokens - self.tool_calls * self.prompt_tokens) * length_scale,
            last_call_ctx_tokens=None
            if self.last_call_ctx_tokens is None
            else self.prompt_tokens + (self.last_call_ctx_tokens - self.prompt_tokens) * length_scale,
        )

    def stats(self) -> dict[str, float]:
        tot = self.total_tokens
        return {
            "trajectories": float(self.trajectories_per_iteration),
            "mean_len": float(tot.mean()),
            "p50_len": float(np.quantile(tot, 0.5)),
            "p90_len": float(np.quantile(tot, 0.9)),
            "max_len": float(tot.max()),
            "mean_tool_calls": float(self.tool_calls.mean()),
            "tokens_per_iteration": float(tot.sum() * self.weight),
        }


@dataclass(frozen=True)
class Turns:
    """Per-trajectory lists of turns, the common form of presets and traces."""

    prompt_tokens: list[int]
    gen: list[list[int]]
    payload: list[list[int]]
    tool_latency_s: list[float]
    # Whether each turn ends in a tool call; None: a turn with a payload does (the presets, whose
    # budget cut drops a call with its payload). A trace or a run's table says which turns called,
    # and a call whose observation is 0 tokens still counts (until 2026-12-07 it did not).
    calls: list[list[bool]] | None = None


def workload_from_turns(name: str, turns: Turns, prompts: int, group: int, **kw: Any) -> Workload:
    """Fold turn lists into per-trajectory arrays, summing the context at every tool return and
    keeping the one after the last."""
    reprefill, calls, last_call = [], [], []
    flags = turns.calls or [[y > 0 for y in pay] for pay in turns.payload]
    for p, gen, pay, called in zip(turns.prompt_tokens, turns.gen, turns.payload, flags, strict=True):
        ctx, acc, c, last = p, 0, 0, p
        for g, y, call in zip(gen, pay, called, strict=True):
            ctx += g
            if call:
                acc += ctx  # context the engine must hold (or rebuild) when the tool returns
                c += 1
                last = ctx + y
            ctx += y
        reprefill.append(acc)
        calls.append(c)
        last_call.append(last)
    return Workload(
        name=name,
        prompts_per_iteration=prompts,
        group_size=group,
        prompt_tokens=np.array(turns.prompt_tokens, dtype=float),
        gen_tokens=np.array([sum(g) for g in turns.gen], dtype=float),
        payload_tokens=np.array([sum(y) for y in turns.payload], dtype=float),
        tool_calls=np.array(calls, dtype=float),
        reprefill_ctx_tokens=np.array(reprefill, dtype=float),
        tool_latency_s=np.array(turns.tool_latency_s, dtype=float),
        last_call_ctx_tokens=np.array(last_call, dtype=float),
        **kw,
    )


def read_trace(
    path: Path | str,
    tool_latency_s: float = 1.0,
    iterations: Sequence[int] | None = None,
    group_size: int | None = None,
) -> Workload:
    """A trace Parquet file (`libra_core.traces.schema.TRACE_SCHEMA`, one row per trajectory, as
    `libra trace export` and `libra trace synth` write it) as a workload.

    The file is read and validated by `traces.schema.read_trace` (TraceSchemaError, a ValueError,
    naming the problem). A tool call costs the latency the trace recorded for it (`libra trace
    export` keeps the run's), or `tool_latency_s` where the trace did not time it (three times that
    on a timeout: `TraceTrajectory.priced_latencies_s`, the rule the simulator's replay uses). Prompts per
    iteration and group size are the trace's means over its iterations (or over `iterations`).
    """
    trajs = read_validated_trace(path)
    if iterations is not None:
        keep = set(iterations)
        trajs = [t for t in trajs if t.iteration in keep]
    if not trajs:
        raise ValueError(f"trace {path}: no trajectories (iterations filter {iterations})")
    per_iter: dict[int, set[str]] = {}
    for t in trajs:
        per_iter.setdefault(t.iteration, set()).add(t.prompt_id)
    prompts = max(1, round(np.mean([len(v) for v in per_iter.values()])))
    group = group_size or max(1, round(len(trajs) / len(per_iter) / prompts))
    turns = Turns(
        prompt_tokens=[t.prompt_tokens for t in trajs],
        gen=[[u.gen_tokens for u in t.turns] for t in trajs],
        payload=[[u.payload_tokens if u.tool else 0 for u in t.turns] for t in trajs],
        tool_latency_s=[sum(t.priced_latencies_s(tool_latency_s)) for t in trajs],
        calls=[[u.tool is not None for u in t.turns] for t in trajs],
    )
    log.info("trace %s: %d trajectories, %d iterations", path, len(trajs), len(per_iter))
    return workload_from_turns(Path(path).stem, turns, prompts, group)


def workload_from_trajectory_table(table: pa.Table, group_size: int, name: str = "measured") -> Workload:
    """The project's trajectory table (libra_core.data.schema) as a workload, for replanning."""
    cols = table.select(
        ["iteration", "prompt_id", "group_id", "prompt_ids", "loss_mask", "tool_events", "tool_latency_s"]
    ).to_pylist()
    if not cols:
        raise ValueError("no trajectories to build a workload from")
    gen, payload, prompt, lat = [], [], [], []
    for r in cols:
        events = sorted(r["tool_events"], key=lambda e: e["turn"])
        pay = [e["payload_tokens"] for e in events]
        gen.append(_turn_lengths(r["loss_mask"], len(events)))
        payload.append(pay + [0])
        prompt.append(len(r["prompt_ids"]))
        lat.append(r["tool_latency_s"])
    iters = {r["iteration"] for r in cols}
    keys = [(r["iteration"], r["group_id"]) for r in cols]
    # Groups, not prompt ids: an iteration may sample one problem twice (an environment with fewer
    # problems than prompts per iteration cycles them), and counted by prompt id it looked smaller.
    prompts = max(1, round(len(set(keys)) / len(iters)))
    group_of = {k: i for i, k in enumerate(dict.fromkeys(keys))}  # spread.py reads the GRPO groups
    groups = np.array([group_of[k] for k in keys])
    return workload_from_turns(
        name,
        Turns(prompt, gen, payload, lat, calls=[[True] * (len(p) - 1) + [False] for p in payload]),
        prompts,
        group_size,
        group_index=groups,
    )


def _turn_lengths(loss_mask: Sequence[int], calls: int) -> list[int]:
    """Generated tokens per turn (`calls + 1` turns): the runs of policy tokens (loss_mask 1)
    between the `calls` tool observations (runs of 0; a response that ends on an observation has
    an empty answer turn). When the runs do not match the calls (an empty observation, a masked
    span inside a turn) the generated tokens are split evenly, which puts every call in the middle
    of the growth."""
    policy_runs: list[int] = []
    observations = 0
    prev = -1
    for m in loss_mask:
        if m and prev != 1:
            policy_runs.append(0)
        if m:
            policy_runs[-1] += 1
        elif prev == 1:
            observations += 1
        prev = 1 if m else 0
    if prev == 0 and policy_runs:
        policy_runs.append(0)  # cut off after its last observation: no answer turn
    if observations == calls and len(policy_runs) == calls + 1:
        return policy_runs
    generated = sum(1 for m in loss_mask if m)
    per_turn = generated // (calls + 1)
    return [per_turn] * calls + [generated - per_turn * calls]


def concat(workloads: Sequence[Workload], name: str) -> Workload:
    """Pool several windows' samples into one workload (iteration shape of the last one)."""
    last = workloads[-1]
    cat = {
        f: np.concatenate([getattr(w, f) for w in workloads])
        for f in (
            "prompt_tokens",
            "gen_tokens",
            "payload_tokens",
            "tool_calls",
            "reprefill_ctx_tokens",
            "tool_latency_s",
        )
    }
    groups = None
    if all(w.group_index is not None for w in workloads):
        parts, offset = [], 0
        for w in workloads:
            _, idx = np.unique(np.asarray(w.group_index), return_inverse=True)
            parts.append(idx + offset)
            offset += int(idx.max()) + 1
        groups = np.concatenate(parts)
    ceilings = [w.last_call_ctx_tokens for w in workloads if w.last_call_ctx_tokens is not None]
    last_call = np.concatenate(ceilings) if len(ceilings) == len(workloads) else None
    # The trained share of the pooled tokens: each window's share weighed by its sampled tokens.
    tokens = [float(w.total_tokens.sum()) for w in workloads]
    share = sum(w.train_share * t for w, t in zip(workloads, tokens, strict=True)) / sum(tokens)
    return replace(
        last,
        name=name,
        group_index=groups,
        last_call_ctx_tokens=last_call,
        train_share=min(1.0, share),
        **cat,
    )
