"""Rollout stage: sample P problems x G samples on the rollout pool and write an Arrow IPC file."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from libra_core.config import LibraConfig
from libra_core.data.history import read_history
from libra_core.data.io import write_ipc
from libra_core.data.schema import table_from_rows
from libra_core.envs.base import Environment
from libra_core.envs.registry import build_environment
from libra_core.envs.splits import eval_problems, sample_split
from libra_core.observability.progress import report
from libra_core.observability.request_spans import RequestSpan, write_request_spans
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest, make_requests
from libra_core.rollout.client import EngineClient
from libra_core.rollout.router import InstanceRouter, RoutingStats
from libra_core.scheduling.base import Scheduler
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.scheduling.registry import build_scheduler
from libra_core.scheduling.tree_io import load_tree, save_tree


@dataclass(frozen=True)
class RolloutResult:
    path: str
    num_trajectories: int
    tokens_generated: int
    mean_response_tokens: float
    tool_failure_share: float
    tokens_per_s: float
    wall_s: float
    routing: RoutingStats
    # Rollout instances it ran on: in the async pipeline the pool of the iteration before (the
    # rollout is submitted before its own iteration's plan), which the history records.
    instances: int
    started_at: float = 0.0  # Unix seconds, for the timeline
    # File of the (instance id, start, end) of every generation request, for the timeline
    # (observability/request_spans.py); a file because this result is a flow-run parameter of the
    # next iteration in async mode, which Prefect stores. None: none recorded.
    requests_path: str | None = None


def _load_scheduler(cfg: LibraConfig, layout: RunLayout) -> Scheduler:
    """The run's scheduler; C-MLFQ resumes the tree that earlier iterations built."""
    if cfg.scheduler.type == "cmlfq" and layout.scheduler_tree.exists():
        return CMLFQScheduler.from_saved(cfg.scheduler, load_tree(layout.scheduler_tree))
    return build_scheduler(cfg.scheduler)


def _save_scheduler(scheduler: Scheduler, layout: RunLayout, iteration: int | None = None) -> None:
    """Save C-MLFQ's tree as the run's live tree, and with `iteration` (async mode) also as that
    iteration's snapshot: its checkpoint is taken after the next, overlapped rollout has already
    changed the live tree, and must hold the statistics a resume at the next iteration starts
    from (save_checkpoint)."""
    if isinstance(scheduler, CMLFQScheduler):
        save_tree(scheduler.tree, layout.scheduler_tree)
        if iteration is not None:
            save_tree(scheduler.tree, layout.scheduler_tree_at(iteration))


@lru_cache(maxsize=4)
def load_tokenizer(policy_dir: str) -> Any:
    # Explicitly the fast tokenizer from tokenizer.json: AutoTokenizer maps a qwen2 config to
    # Qwen2Tokenizer, whose byte-level pre-processing drops spaces from our observations.
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(policy_dir)


def _run_loop(
    run_dir: str,
    urls: tuple[str, ...],
    instance_ids: tuple[str, ...],
    env: Environment,
    requests: list[RolloutRequest],
    *,
    version: int | Callable[[], int],
    iteration: int,
    greedy: bool,
    stage: str,
) -> tuple[list[dict[str, Any]], RoutingStats, list[RequestSpan], Scheduler]:
    """Run `requests` through the agent loop; returns the rows, the routing statistics, the
    requests each instance served and the scheduler (its statistics are saved by the caller, once
    the stage's output is written: a retried stage must not teach the tree one iteration twice)."""
    cfg = load_run_config(run_dir)
    layout = RunLayout(Path(run_dir))
    rollout_cfg = cfg.rollout.model_copy(update={"temperature": 0.0}) if greedy else cfg.rollout
    tok = load_tokenizer(str(layout.policy))
    ecfg = cfg.rollout.engine
    engines = [
        EngineClient(u, timeout_s=ecfg.request_timeout_s, coalesce_window_s=ecfg.coalesce_window_s)
        for u in urls
    ]
    loop = AgentLoop(
        env, tok, engines, rollout_cfg, policy_version=version, iteration=iteration, instance_ids=instance_ids
    )
    # Greedy evaluation uses the same scheduler type but must not teach it (its lengths are not the
    # sampled workload's), so it starts from and keeps no statistics.
    scheduler = build_scheduler(cfg.scheduler) if greedy else _load_scheduler(cfg, layout)
    scheduler.on_policy_version(version() if callable(version) else version)
    router = InstanceRouter(scheduler, cfg.scheduler.num_buckets, len(engines), cfg.scheduler.buckets)
    total = len(requests)
    report(stage, 0, total)
    rows = loop.run(requests, router, on_done=lambda n: report(stage, n, total))
    return rows, router.stats(), loop.requests_served, scheduler


def prompts_to_sample(cfg: LibraConfig, run_dir: str, iteration: int) -> int:
    """Prompts for `iteration`: P, or with dynamic sampling P times an over-sampling factor that
    follows the share of groups with signal in the latest iteration recorded before its rollout
    starts (capped; the cap when unknown): `iteration - 1`, or in async mode `iteration - 2`
    (rollout N+1 starts while iteration N is still updating), whether or not the run was resumed
    in between. Rows of later iterations (a resumed run's abandoned attempt) are not evidence."""
    wanted = cfg.rollout.prompts_per_iteration
    ds = cfg.pipeline.dynamic_sampling
    if not ds.enabled:
        return wanted
    known = iteration - (2 if cfg.pipeline.mode == "async" else 1)
    earlier = [row for row in read_history(run_dir) if row["iteration"] <= known]
    share = max(earlier, key=lambda row: row["iteration"])["mixed_group_share"] if earlier else 0.0
    factor = min(ds.max_oversample, 1.0 / share) if share > 0 else ds.max_oversample
    return math.ceil(wanted * factor)


def run_rollout(
    run_dir: str,
    urls: tuple[str, ...],
    instance_ids: tuple[str, ...],
    *,
    iteration: int,
    version: int | Callable[[], int],
) -> RolloutResult:
    """`version`: the served policy version, or a function that returns it now (async pipeline)."""
    start, started_at = time.perf_counter(), time.time()
    cfg = load_run_config(run_dir)
    env = build_environment(cfg.environment)
    seed = cfg.experiment.seed * 100_003 + iteration
    problems = sample_split(
        env,
        prompts_to_sample(cfg, run_dir, iteration),
        seed,
        "train",
        min_difficulty=cfg.rollout.min_difficulty,
    )
    requests = make_requests(problems, cfg.training.grpo.group_size, iteration)
    rows, routing, served, scheduler = _run_loop(
        run_dir,
        urls,
        instance_ids,
        env,
        requests,
        version=version,
        iteration=iteration,
        greedy=False,
        stage="rollout",
    )
    table = table_from_rows(rows)
    layout = RunLayout(Path(run_dir))
    path = write_ipc(table, layout.stage_dir(iteration) / "rollout.arrow")
    requests_path = write_request_spans(layout.rollout_requests(iteration), served)
    _save_scheduler(scheduler, layout, iteration if cfg.pipeline.mode == "async" else None)
    wall = time.perf_counter() - start
    generated = sum(sum(r["loss_mask"]) for r in rows)
    calls = [e for r in rows for e in r["tool_events"]]
    return RolloutResult(
        path=str(path),
        num_trajectories=len(rows),
        tokens_generated=generated,
        mean_response_tokens=sum(len(r["response_ids"]) for r in rows) / max(len(rows), 1),
        tool_failure_share=sum(e["status"] != "success" for e in calls) / max(len(calls), 1),
        tokens_per_s=generated / wall if wall > 0 else 0.0,
        wall_s=wall,
        routing=routing,
        instances=len(urls),
        started_at=started_at,
        requests_path=str(requests_path),
    )


def run_greedy_eval(
    run_dir: str, urls: tuple[str, ...], instance_ids: tuple[str, ...], *, iteration: int, version: int
) -> float:
    """Exact-answer accuracy of greedy decoding on a fixed held-out problem set. Its requests'
    spans go to `RunLayout.eval_requests` for the timeline's instance lanes (until 2026-12-07 they
    were dropped, and the engines looked idle during every evaluation)."""
    cfg = load_run_config(run_dir)
    env = build_environment(cfg.environment)
    problems = eval_problems(env, cfg.experiment.seed, cfg.eval.num_prompts)
    requests = make_requests(problems, 1, iteration)
    rows, _, served, _ = _run_loop(
        run_dir,
        urls,
        instance_ids,
        env,
        requests,
        version=version,
        iteration=iteration,
        greedy=True,
        stage="eval",
    )
    write_request_spans(RunLayout(Path(run_dir)).eval_requests(iteration), served)
    best = cfg.environment.reward.correct
    correct = [env.reward(r["reference_answer"], r["final_answer"]) >= best for r in rows]
    return sum(correct) / max(len(correct), 1)
