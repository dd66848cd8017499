"""Trace evaluator: replay a trace against a scheduler and score its routing.

Protocol (what a scheduler may know when):
- iterations run in ascending order; `on_policy_version(v)` is called before each, with `v` the
  least `policy_version` of the iteration's rows (the version a live run's scheduler is at when
  the iteration starts: one per optimizer step, several per iteration), or the iteration itself
  for a trace that records no versions (synthetic ones, and traces written before 2026-12-07,
  which replayed every trace on the iteration clock: C-MLFQ's statistics aged up to
  `minibatches` times slower than in the run);
- the trajectories of one iteration run concurrently: all admissions first, then the first tool
  return of every trajectory, then the second, ... (so `least_load` sees the whole iteration in
  flight); `on_finish` for the iteration's trajectories comes only after all its decisions, so a
  scheduler learns only from earlier iterations;
- decision points are the admission and every tool return that a generating turn follows (as in
  the agent loop: a return that ends the trajectory, e.g. at max_turns, asks nothing).

Buckets: N ascending upper bounds `(B1, ..., BN)` give N + 1 buckets, bucket i holds token counts
`<= B(i+1)` and the last is open (libra_core.scheduling.base.bucket_of); `--buckets 2000,8000`
means three buckets: <=2000, <=8000, >8000.

Metrics (tokens: a trajectory's `size` is prompt + all generated + all payload tokens; `remaining`
after turn i is the sum over later turns of generated + payload tokens, and at admission all of them):
- `routing_accuracy`: share of decisions whose bucket (after the decision) equals the bucket of the
  realised remaining tokens at that point (the reference implementation's notion);
- `class_accuracy`: share of generated tokens decoded in the bucket of their trajectory's size (turn
  i's generation runs in the bucket chosen at the decision before it);
- `migration_token_ratio`: tokens re-prefilled because of moves (the context before the tool
  payload, `reprefill_tokens`, at each move) divided by all tokens processed (the sum of sizes);
- `score` = `class_accuracy` - `migration_token_ratio`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import (
    FinishedTrajectory,
    SchedRequest,
    Scheduler,
    ToolReturn,
    bucket_of,
    reprefill_tokens,
)
from libra_core.scheduling.registry import build_scheduler, scheduler_names
from libra_core.traces.schema import TraceTrajectory, as_trajectories, policy_clock, read_trace

METRICS = ("routing_accuracy", "class_accuracy", "migration_token_ratio", "score")


class SchedulerContractError(AssertionError):
    """A scheduler returned a bucket that does not exist, moved to its own bucket, or lost a request."""


@dataclass(frozen=True, slots=True)
class TraceMetrics:
    scheduler: str
    routing_accuracy: float
    class_accuracy: float
    migration_token_ratio: float
    score: float
    decisions: int  # admissions + tool returns
    moves: int
    trajectories: int

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def parse_buckets(text: str) -> tuple[int, ...]:
    """`"2000,8000"` -> (2000, 8000): N ascending upper bounds in tokens, N + 1 buckets."""
    try:
        bounds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(
            f"--buckets {text!r}: expected comma-separated token counts, e.g. 2000,8000"
        ) from None
    if not bounds or bounds[0] < 1 or any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"--buckets {text!r}: need one or more positive, strictly ascending bounds")
    return bounds


def quantile_buckets(
    trace: pa.Table | Sequence[TraceTrajectory], quantiles: Sequence[float]
) -> tuple[int, ...]:
    """Bucket bounds at the given quantiles of trajectory size (deduplicated, ascending)."""
    sizes = sorted(t.size for t in as_trajectories(trace))
    assert sizes, "empty trace"
    bad = [q for q in quantiles if not 0.0 <= q <= 1.0]
    if bad:
        raise ValueError(f"quantiles must lie in [0, 1], got {bad}")
    picks = {sizes[min(len(sizes) - 1, max(0, math.ceil(q * len(sizes)) - 1))] for q in quantiles}
    return tuple(sorted(picks))


def replay(
    trace: pa.Table | Sequence[TraceTrajectory],
    scheduler: Scheduler,
    bounds: Sequence[int],
    *,
    name: str = "",
) -> TraceMetrics:
    """Replay `trace` through `scheduler` under the protocol above and compute the metrics."""
    trajectories = as_trajectories(trace)
    num_buckets = len(bounds) + 1
    by_iteration: dict[int, list[TraceTrajectory]] = defaultdict(list)
    for t in trajectories:
        by_iteration[t.iteration].append(t)

    decisions = correct_decisions = moves = 0
    gen_total = gen_right = migrated = processed = 0

    def check(bucket: int, what: str) -> int:
        if not (isinstance(bucket, int) and 0 <= bucket < num_buckets):
            raise SchedulerContractError(f"{name}: {what} chose bucket {bucket!r}, not in [0, {num_buckets})")
        return bucket

    clock = policy_clock(trajectories)
    for iteration in sorted(by_iteration):
        batch = by_iteration[iteration]
        version = clock[iteration]
        scheduler.on_policy_version(version)
        requests = [
            SchedRequest(t.trajectory_id, t.prompt_id, t.prompt_tokens, iteration, realised=t.turns)
            for t in batch
        ]
        current, context, remaining, size_bucket = [], [], [], []
        # index of each trajectory's last turn that generates tokens
        last_gen = [max((i for i, u in enumerate(t.turns) if u.gen_tokens > 0), default=-1) for t in batch]
        for t, req in zip(batch, requests, strict=True):
            bucket = check(scheduler.admit(req), f"admit({t.trajectory_id})")
            rest = t.size - t.prompt_tokens
            current.append(bucket)
            context.append(t.prompt_tokens)
            remaining.append(rest)
            size_bucket.append(bucket_of(t.size, bounds))
            decisions += 1
            correct_decisions += bucket == bucket_of(rest, bounds)
            processed += t.size
        for turn_index in range(max(len(t.turns) for t in batch)):
            for k, (t, req) in enumerate(zip(batch, requests, strict=True)):
                if turn_index >= len(t.turns):
                    continue
                turn = t.turns[turn_index]
                gen_total += turn.gen_tokens
                gen_right += turn.gen_tokens if current[k] == size_bucket[k] else 0
                if turn.tool is None or turn.status is None:
                    continue  # last turn: the trajectory ends, no decision
                step = turn.gen_tokens + turn.payload_tokens
                context[k] += step
                remaining[k] -= step
                if turn_index >= last_gen[k]:
                    # Nothing is generated after this return (it ended the trajectory at max_turns;
                    # the export's 0-token closing turn): as in the agent loop, no one is asked.
                    continue
                ret = ToolReturn(
                    turn_index, turn.gen_tokens, turn.tool, turn.payload_tokens, turn.status, context[k]
                )
                move = scheduler.on_tool_return(req, ret)
                if move is not None:
                    target = check(move.bucket, f"on_tool_return({t.trajectory_id}, turn {turn_index})")
                    if target == current[k]:
                        raise SchedulerContractError(
                            f"{name}: moved {t.trajectory_id} to its own bucket {target}"
                        )
                    current[k] = target
                    moves += 1
                    migrated += reprefill_tokens(ret)
                decisions += 1
                correct_decisions += current[k] == bucket_of(remaining[k], bounds)
        for t in batch:
            scheduler.on_finish(
                FinishedTrajectory(
                    t.trajectory_id,
                    t.prompt_id,
                    t.prompt_tokens,
                    iteration,
                    version if t.policy_version is None else t.policy_version,
                    t.turns,
                )
            )
        in_flight = getattr(scheduler, "in_flight", None)
        if callable(in_flight) and in_flight() != 0:
            raise SchedulerContractError(
                f"{name}: {in_flight()} requests still in flight after iteration {iteration}"
            )

    class_accuracy = gen_right / gen_total if gen_total else 1.0
    migration_ratio = migrated / processed if processed else 0.0
    return TraceMetrics(
        scheduler=name,
        routing_accuracy=correct_decisions / decisions if decisions else 1.0,
        class_accuracy=class_accuracy,
        migration_token_ratio=migration_ratio,
        score=class_accuracy - migration_ratio,
        decisions=decisions,
        moves=moves,
        trajectories=len(trajectories),
    )


def evaluate_schedulers(
    trace: pa.Table | Sequence[TraceTrajectory], names: Sequence[str], cfg: SchedulerConfig
) -> list[TraceMetrics]:
    """A fresh scheduler per name (cfg with `type` replaced), each replayed over the trace."""
    trajectories = as_trajectories(trace)
    results = []
    for name in names:
        sched_cfg = SchedulerConfig.model_validate({**cfg.model_dump(), "type": name})
        scheduler = build_scheduler(sched_cfg, allow_oracle=True)
        results.append(replay(trajectories, scheduler, sched_cfg.buckets, name=name))
    return results


def run_trace_eval(
    trace_path: str | Path,
    scheduler: str,
    buckets: Sequence[int],
    base: SchedulerConfig | None = None,
) -> list[dict[str, Any]]:
    """What `libra trace-eval` does: one record per scheduler (`scheduler` may be `all`), with keys
    `scheduler`, the four METRICS, `decisions`, `moves`, `trajectories`. `base` supplies the other
    scheduler settings (default: the SchedulerConfig defaults); `buckets` replaces its bounds."""
    names = scheduler_names() if scheduler == "all" else [scheduler]
    if scheduler != "all" and scheduler not in scheduler_names():
        raise ValueError(f"unknown scheduler {scheduler!r}; valid: {scheduler_names()} or 'all'")
    cfg = SchedulerConfig.model_validate(
        {**(base or SchedulerConfig()).model_dump(), "buckets": tuple(buckets)}
    )
    trajectories = read_trace(trace_path)
    if not trajectories:
        raise ValueError(f"trace {trace_path} holds no trajectories; nothing to evaluate")
    return [m.as_record() for m in evaluate_schedulers(trajectories, names, cfg)]
