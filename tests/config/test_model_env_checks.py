"""Model settings checked at validation: pairings with the environment, and shapes the run cannot use."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from libra_core.config.loader import ConfigError, load_config
from libra_core.config.models import LibraConfig, TinyModelConfig


def test_smollm2_with_the_markers_format_is_refused_naming_the_remedy() -> None:
    # SmolLM2's vocabulary lacks <|/call|> and <|eos|>: its turns would never stop, reward ~0.
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model={type: smollm2}", "environment={type: math_tools}"])
    (problem,) = info.value.problems
    assert "environment.prompt_format markers" in problem and "environment.prompt_format=chatml" in problem
    for env in ("search", "code"):
        with pytest.raises(ValidationError, match="set environment.prompt_format=chatml"):
            LibraConfig.model_validate({"model": {"type": "smollm2"}, "environment": {"type": env}})


def test_smollm2_with_the_arithmetic_task_is_refused() -> None:
    # `libra config validate --set 'model={type: smollm2}'` printed ok: the default task is arithmetic.
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model={type: smollm2}"])
    (problem,) = info.value.problems
    assert "environment.type arithmetic" in problem and "prompt_format chatml" in problem


def test_what_can_work_still_validates() -> None:
    chatml = {"type": "math_tools", "prompt_format": "chatml"}
    assert LibraConfig.model_validate({"model": {"type": "smollm2"}, "environment": chatml}).model.type == (
        "smollm2"
    )
    # A Libra-trained policy folder has the markers as special tokens: hf_local with markers can work
    # (its tokenizer is read at run time, where the agent loop checks the stop tokens).
    for env in ({}, {"type": "math_tools"}, chatml):
        cfg = LibraConfig.model_validate({"model": {"type": "hf_local", "path": "/m"}, "environment": env})
        assert cfg.model.type == "hf_local"
    # The tiny tokenizer is trained on the environment's text, chatml markers included.
    assert LibraConfig.model_validate({"environment": chatml}).model.type == "tiny_qwen2"


def test_head_dim_times_heads_must_be_hidden_size() -> None:
    # Was refused only when the model was built, after the run folder existed.
    with pytest.raises(
        ValidationError, match=r"head_dim \(32\) \* num_heads \(4\) must equal hidden_size \(64\)"
    ):
        TinyModelConfig(hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=32)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.hidden_size=64"])  # default 4 heads of 32
    (problem,) = info.value.problems
    assert "set head_dim to 16 or hidden_size to 128" in problem
    assert TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=2, head_dim=32).hidden_size == 64


def test_head_dim_must_be_even_for_rotary_embeddings() -> None:
    with pytest.raises(ValidationError, match=r"head_dim \(9\) must be even"):
        TinyModelConfig(hidden_size=9, num_heads=1, num_kv_heads=1, head_dim=9)
