"""Checks across sections of a parsed config: settings each valid alone that cannot run together.

Called once per validation by `LibraConfig`'s after-validator, which reports every problem, one per
line; the loader shows each line on its own and marks the ones naming a key an override set. Each
check returns its problems as text that starts with the key path it is about. Pure: no files, no
imports of torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from libra_core.config.base import Frozen

# models.py imports this module inside its validator, after it is loaded: no import cycle
from libra_core.config.models import DEFAULT_POOLS, ArithmeticEnvConfig, LibraConfig
from libra_core.config.pools import ElasticConfig, RayPoolConfig
from libra_core.config.pretrained import SmolLM2ModelConfig


def _update_backend_is_wired(cfg: LibraConfig) -> list[str]:
    # The backends exist (libra_core/training/backends, used by the elastic pool), but the GRPO
    # update stage runs one process; refusing here beats silently training single-process.
    if cfg.training.backend == "torch":
        return []
    return [
        f"training.backend {cfg.training.backend!r}: the GRPO update stage runs a single process "
        "and does not launch data-parallel ranks yet; use training.backend=torch in an experiment "
        "(ddp and deepspeed are available to rank code via libra_core.training.backends)"
    ]


def _no_oracle_in_a_run(cfg: LibraConfig) -> list[str]:
    # `oracle` reads realised lengths, so only `libra trace-eval` can run it (SchedulerConfig
    # takes it for that); a run passed every check, made its folder, warmed up, started vLLM and
    # failed at its first rollout (until 2026-12-07).
    if cfg.scheduler.type != "oracle":
        return []
    return [
        "scheduler.type 'oracle' reads realised lengths and is for `libra trace-eval` only; "
        "choose another scheduler for a run"
    ]


def _planner_prices_the_pipeline_that_runs(cfg: LibraConfig) -> list[str]:
    # The planner's objective (planner/iteration.py) is serial at staleness 0 and overlapped at
    # >= 1; priced the other way, an async run was planned as if its stages took turns.
    if cfg.planner.type != "libra":
        return []
    overlapped = cfg.pipeline.mode == "async"
    if overlapped == (cfg.planner.staleness >= 1):
        return []
    want = "at least 1" if overlapped else "0"
    return [
        f"planner.staleness {cfg.planner.staleness} with pipeline.mode {cfg.pipeline.mode}: "
        f"the planner must price the pipeline that runs; set planner.staleness to {want}"
    ]


def _changed_from_default(section: str, value: Frozen, default: Frozen) -> list[str]:
    """`section.key=value` for each key of `value` that differs from `default`."""
    defaults = default.model_dump()
    return [
        f"{section}.{key}={setting!r}"
        for key, setting in value.model_dump().items()
        if setting != defaults[key]
    ]


def _pools_are_wired(cfg: LibraConfig) -> list[str]:
    # The experiment flow runs the update in one local trainer process and the other stages on
    # their default pools; these settings validated and then did nothing.
    problems = []
    if cfg.pools.type != "local":
        problems.append(
            f"pools.type {cfg.pools.type!r}: the experiment flow runs its trainer in a local "
            "worker pool (Ray pools are available to code via libra_core.pools.registry.build_pool); "
            "use pools.type=local"
        )
    if cfg.stages.update.size != 1:
        problems.append(
            f"stages.update.size {cfg.stages.update.size}: the update stage runs one trainer process "
            "(data-parallel ranks are not launched yet); use 1"
        )
    # Plan and reward run once in the flow's process and sync reaches every rollout instance: only
    # the rollout and update sizes are read (plan_stage.make_plan), and these validated and did nothing
    # (until 2026-12-07).
    unread = [
        f"stages.{name}.size={getattr(cfg.stages, name).size}"
        for name in ("plan", "reward", "sync")
        if getattr(cfg.stages, name).size != 1
    ]
    if unread:
        problems.append(
            f"{', '.join(unread)}: only stages.rollout.size and stages.update.size are read (plan and "
            "reward run once in the flow's process, sync reaches every rollout instance); use 1"
        )
    moved = [
        f"stages.{name}.pool={getattr(cfg.stages, name).pool}"
        for name, default in DEFAULT_POOLS.items()
        if getattr(cfg.stages, name).pool != default
    ]
    if moved:
        problems.append(
            f"{', '.join(moved)}: stages run on their default pools ({DEFAULT_POOLS}); "
            "moving one is not wired"
        )
    # No flow builds a Ray pool from config (pools.type=ray is refused above): these validated and
    # changed nothing (until 2026-12-07).
    changed = _changed_from_default("pools.ray", cfg.pools.ray, RayPoolConfig())
    if changed:
        problems.append(
            f"{', '.join(changed)}: Ray pools are not wired into the experiment flow yet (a run refuses "
            "pools.type=ray; code builds one with libra_core.pools.registry.build_pool); "
            "keep the pools.ray defaults"
        )
    # No flow builds the gateway from config: these validated and changed nothing (until 2026-12-07
    # the gateway's own errors even told users to change them).
    changed = _changed_from_default("pools.elastic", cfg.pools.elastic, ElasticConfig())
    if changed:
        problems.append(
            f"{', '.join(changed)}: the elastic hybrid pool is not wired into the experiment flow yet "
            "(code builds its Gateway with constructor arguments; see docs/elastic.md); "
            "keep the pools.elastic defaults"
        )
    return problems


def _async_overlap_fits(cfg: LibraConfig) -> list[str]:
    steps = cfg.training.grpo.minibatches
    if cfg.pipeline.mode != "async" or cfg.pipeline.max_staleness >= steps:
        return []
    return [
        f"pipeline.max_staleness {cfg.pipeline.max_staleness} with pipeline.mode async: one update "
        f"({steps} optimizer steps = training.grpo.minibatches) overlaps the next rollout, so "
        f"pipeline.max_staleness must be >= {steps}"
    ]


def _tokenizer_speaks_the_prompt_format(cfg: LibraConfig) -> list[str]:
    # SmolLM2's vocabulary has the chatml tokens but none of the markers (<|/call|>, <|eos|>):
    # its turns would never end on a stop token. `hf_local` is not checked: its tokenizer is read
    # only at run time (a Libra-trained policy folder speaks markers), and the agent loop refuses a
    # stop token missing from it.
    if not isinstance(cfg.model, SmolLM2ModelConfig):
        return []
    env = cfg.environment
    if isinstance(env, ArithmeticEnvConfig):
        return [
            "model.type smollm2 with environment.type arithmetic: the arithmetic task speaks "
            "only the `markers` format, whose special tokens SmolLM2's tokenizer lacks; use "
            "a data-backed environment with prompt_format chatml (e.g. environment={type: "
            "math_tools, prompt_format: chatml}) or model.type tiny_qwen2"
        ]
    if env.prompt_format != "chatml":
        return [
            f"model.type smollm2 with environment.prompt_format {env.prompt_format}: "
            "SmolLM2's tokenizer lacks the markers' special tokens, so its turns would never "
            "stop; set environment.prompt_format=chatml"
        ]
    return []


def _ports_fit(cfg: LibraConfig) -> list[str]:
    base, size = cfg.rollout.engine.base_port, cfg.stages.rollout.size
    if not base or base + size - 1 <= 65535:  # bind() raised a raw OverflowError at pool start
        return []
    return [
        f"rollout.engine.base_port {base} leaves no port for {size} instances "
        f"(stages.rollout.size) below 65536; lower it, or use 0 for free ports"
    ]


def _context_fits(cfg: LibraConfig) -> list[str]:
    limit = getattr(cfg.model, "max_position_embeddings", None)
    if limit is None or cfg.rollout.max_total_tokens <= limit:
        return []
    return [
        f"rollout.max_total_tokens ({cfg.rollout.max_total_tokens}) exceeds "
        f"model.max_position_embeddings ({limit})"
    ]


CHECKS: tuple[Callable[[LibraConfig], list[str]], ...] = (
    _update_backend_is_wired,
    _no_oracle_in_a_run,
    _planner_prices_the_pipeline_that_runs,
    _pools_are_wired,
    _async_overlap_fits,
    _tokenizer_speaks_the_prompt_format,
    _ports_fit,
    _context_fits,
)


def cross_field_problems(cfg: LibraConfig) -> list[str]:
    """Every cross-section problem of `cfg`, one line each (empty: none)."""
    return [problem for check in CHECKS for problem in check(cfg)]
