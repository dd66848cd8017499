"""Rollout stage: sample P problems x G samples on the rollout pool and write an Arrow IPC file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from libra_core.data.io import write_ipc
from libra_core.data.schema import table_from_rows
from libra_core.envs.base import Environment, Problem
from libra_core.envs.registry import build_environment
from libra_core.observability.progress import report
from libra_core.pipeline.run_dir import RunLayout, load_run_config
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest, make_requests
from libra_core.rollout.client import EngineClient
from libra_core.scheduling.routers import build_router

EVAL_SEED_OFFSET = 1_000_000_007


@dataclass(frozen=True)
class RolloutResult:
    path: str
    num_trajectories: int
    tokens_generated: int
    mean_response_tokens: float
    tool_failure_share: float
    tokens_per_s: float
    wall_s: float


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
    version: int,
    iteration: int,
    greedy: bool,
    stage: str,
) -> list[dict[str, Any]]:
    cfg = load_run_config(run_dir)
    rollout_cfg = cfg.rollout.model_copy(update={"temperature": 0.0}) if greedy else cfg.rollout
    tok = load_tokenizer(str(RunLayout(Path(run_dir)).policy))
    engines = [EngineClient(u, timeout_s=cfg.rollout.engine.request_timeout_s) for u in urls]
    loop = AgentLoop(
        env, tok, engines, rollout_cfg, policy_version=version, iteration=iteration, instance_ids=instance_ids
    )
    router = build_router(cfg.scheduler.type, len(engines))
    total = len(requests)
    report(stage, 0, total)
    return loop.run(requests, router.route, on_done=lambda n: report(stage, n, total))


def run_rollout(
    run_dir: str, urls: tuple[str, ...], instance_ids: tuple[str, ...], *, iteration: int, version: int
) -> RolloutResult:
    start = time.perf_counter()
    cfg = load_run_config(run_dir)
    env = build_environment(cfg.environment)
    seed = cfg.experiment.seed * 100_003 + iteration
    problems = env.sample_problems(
        cfg.rollout.prompts_per_iteration, seed, min_difficulty=cfg.rollout.min_difficulty
    )
    requests = make_requests(problems, cfg.training.grpo.group_size, iteration)
    rows = _run_loop(
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
    path = write_ipc(table, RunLayout(Path(run_dir)).stage_dir(iteration) / "rollout.arrow")
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
    )


def eval_problems(env: Environment, seed: int, n: int) -> list[Problem]:
    return env.sample_problems(n, seed + EVAL_SEED_OFFSET)


def run_greedy_eval(
    run_dir: str, urls: tuple[str, ...], instance_ids: tuple[str, ...], *, iteration: int, version: int
) -> float:
    """Exact-answer accuracy of greedy decoding on a fixed held-out problem set."""
    cfg = load_run_config(run_dir)
    env = build_environment(cfg.environment)
    problems = eval_problems(env, cfg.experiment.seed, cfg.eval.num_prompts)
    requests = make_requests(problems, 1, iteration)
    rows = _run_loop(
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
    best = cfg.environment.reward.correct
    correct = [env.reward(r["reference_answer"], r["final_answer"]) >= best for r in rows]
    return sum(correct) / max(len(correct), 1)
