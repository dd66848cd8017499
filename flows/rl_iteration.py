"""One RL iteration as a Prefect flow: plan -> rollout -> reward -> update -> sync (-> eval).

Returns the iteration's history row (stage wall times, tokens, rewards, update metrics) and, in the
async pipeline, the result of the next iteration's rollout. Each stage is a task, so the Prefect UI
shows the per-stage timeline of every iteration.

`pipeline.mode: async`: right after the reward stage, the rollout of iteration i+1 is submitted
and runs while iteration i updates; the weight sync pauses the engines with those requests in
flight, reloads and resumes them (interruptible rollout), so iteration i's flow run also shows the
rollout of i+1. The next iteration then starts from that finished rollout (`rollout` argument).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal

from libra_core.observability.timeline import Span, rollout_instance_spans
from libra_core.pipeline.iteration_row import StageSeconds, iteration_row
from libra_core.pipeline.rollout_stage import RolloutResult
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from tasks.artifacts import iteration_artifacts_task
from tasks.record import record_iteration_task
from tasks.setup import finish_run_task
from tasks.stages import (
    eval_task,
    plan_task,
    reward_task,
    rollout_pool_task,
    rollout_task,
    stop_pool_task,
    sync_task,
    update_task,
)

T = TypeVar("T")


class _Clock:
    """Times each stage call and keeps its wall-clock span for the run's timeline."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration
        self.spans: list[Span] = []

    def __call__(self, lane: str, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        start, wall = time.perf_counter(), time.time()
        out = fn(*args)
        seconds = time.perf_counter() - start
        self.spans.append(Span(self.iteration, lane, wall, wall + seconds))
        return out, seconds

    def add(self, lane: str, start: float, seconds: float) -> None:
        self.spans.append(Span(self.iteration, lane, start, start + seconds))


@flow(name="rl-iteration", flow_run_name="iteration-{iteration}", log_prints=False)
def rl_iteration(
    run_dir: str, iteration: int, version: int, rollout: RolloutResult | None = None
) -> dict[str, Any]:
    """Run iteration `iteration` from policy `version`; returns {"row": history row,
    "next_rollout": the next iteration's RolloutResult in async mode, else None, "flow_run_id":
    this flow run's id}. The row, the
    timeline spans and the iteration's artifacts are recorded before it returns."""
    start = time.perf_counter()
    cfg = load_run_config(run_dir)
    timed = _Clock(iteration)
    plan, plan_s = timed("plan", plan_task, run_dir, iteration)
    pool, pool_s = timed("pool", rollout_pool_task, run_dir, plan.rollout_instances, version)
    if rollout is None:
        ran, rollout_s = timed("rollout", rollout_task, run_dir, pool, iteration)
    else:
        ran, rollout_s = rollout, rollout.wall_s  # overlapped the previous iteration's update
        timed.add("rollout", rollout.started_at, rollout_s)
    timed.spans += rollout_instance_spans(iteration, ran.requests_path)
    reward, reward_s = timed("reward", reward_task, run_dir, ran.path, iteration)
    last = iteration == cfg.experiment.iterations
    next_future = None
    if cfg.pipeline.mode == "async" and not last:
        next_future = rollout_task.submit(run_dir, pool, iteration + 1)
    try:
        stage, update_s = timed("update", update_task, run_dir, reward.path, iteration, version)
        update = stage.update
        sync_s = 0.0
        if update.new_version != version:
            _, sync_s = timed("sync", sync_task, run_dir, pool, update.new_version)
        next_rollout = next_future.result() if next_future is not None else None
    except BaseException as err:
        if next_future is not None:
            # This flow cannot exit before its task runner's threads end, the overlapped rollout
            # among them, and the experiment's clean-up (run state, engines) comes after that:
            # stop the engines now, so the rollout fails at once instead of running to its end. A
            # cancel writes the state first, as the experiment's clean-up does: stopping engines
            # can outlast the runner's grace period (30 s, then SIGKILL) on a loaded machine.
            try:
                if isinstance(err, KeyboardInterrupt | TerminationSignal):
                    finish_run_task.fn(run_dir, "cancelled")
            finally:
                stop_pool_task.fn(run_dir)
        raise
    eval_acc = eval_s = None
    if cfg.eval.every and (iteration % cfg.eval.every == 0 or last):
        eval_acc, eval_s = timed("eval", eval_task, run_dir, pool, iteration, update.new_version)
        timed.spans += rollout_instance_spans(iteration, RunLayout(Path(run_dir)).eval_requests(iteration))
    seconds = StageSeconds(
        plan_s, pool_s, rollout_s, reward_s, update_s, sync_s, time.perf_counter() - start, eval_s
    )
    row = iteration_row(iteration, plan, ran, reward, stage, seconds, eval_acc)
    record_iteration_task(run_dir, row, timed.spans)
    every = cfg.experiment.artifacts_every
    if every and (iteration % every == 0 or last):
        iteration_artifacts_task(run_dir, iteration)
    ctx = FlowRunContext.get()  # the experiment reads this run's state (a Cancel on its page)
    run_id = str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None
    return {"row": row, "next_rollout": next_rollout, "flow_run_id": run_id}
