"""Every config field says what it is (STYLE.md: a description on every field), and the descriptions
state the limits of where a setting applies (which model, which pipeline, which planner)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel

from libra_core.config.environments import EnvRewardWeights, SandboxConfig, SearchEnvConfig
from libra_core.config.models import (
    ArithmeticEnvConfig,
    EvalConfig,
    LibraConfig,
    TokenizerConfig,
    VllmEngineConfig,
)
from libra_core.config.planner import PlannerConfig
from libra_core.config.pools import LocalPoolConfig, PoolsConfig
from libra_core.config.training import TrainingConfig, WarmupConfig


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The config models an annotation holds: itself, a union's variants, Annotated/tuple items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _fields(model: type[BaseModel], path: str, seen: set[type[BaseModel]]) -> Iterator[tuple[str, str]]:
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        yield f"{path}{name} ({model.__name__})", (field.description or "").strip()
        for sub in _models_in(field.annotation):
            yield from _fields(sub, f"{path}{name}.", seen)


def test_every_field_of_every_config_model_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    fields = dict(_fields(LibraConfig, "", seen))
    assert len(seen) >= 30  # the walk reached every section and union variant (e.g. all environments)
    assert {"SmolLM2ModelConfig", "CodeEnvConfig", "SandboxConfig", "ElasticConfig"} <= {
        m.__name__ for m in seen
    }
    assert [key for key, text in fields.items() if not text] == []


def _doc(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].description or ""


def test_planner_fields_say_they_apply_with_the_libra_planner_only() -> None:
    names = [n for n in PlannerConfig.model_fields if n != "type"]
    assert [n for n in names if not _doc(PlannerConfig, n).startswith("libra planner: ")] == []


def test_warm_up_settings_say_tiny_qwen2_only() -> None:
    docs = [_doc(WarmupConfig, n) for n in WarmupConfig.model_fields]
    docs += [_doc(TokenizerConfig, "vocab_size"), _doc(ArithmeticEnvConfig, "warmup_early_answer_rate")]
    assert all(d.startswith("tiny_qwen2 only") for d in docs), docs
    assert "smollm2 keeps its conversion cache" in _doc(WarmupConfig, "cache")


def test_where_a_setting_applies_is_stated() -> None:
    # 0 threads: half the cores in the async pipeline (pipeline/cpu_split.py), not the library's choice
    assert "half of the cores in the async" in _doc(TrainingConfig, "threads")
    assert "not the SFT warm-up" in _doc(TrainingConfig, "threads")
    assert "half of the cores in the async" in _doc(VllmEngineConfig, "cpu_threads")
    assert "eval.num_prompts" in _doc(EvalConfig, "every") and "none during RL" in _doc(EvalConfig, "every")
    assert "min(token F1, 0.99) x correct" in _doc(EnvRewardWeights, "well_formed")
    assert "ignored with service_url" in _doc(SearchEnvConfig, "latency_ms")
    assert "rlimits mode when not root" in _doc(SandboxConfig, "max_processes")
    assert "async pipeline" in (LocalPoolConfig.__doc__ or "")
    assert "async pipeline" in _doc(PoolsConfig, "local")
