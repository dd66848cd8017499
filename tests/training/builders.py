"""Builders shared by the training tests: a tiny random Qwen2 and schema-complete trajectory rows.

A module of its own, imported as `tests.training.builders`: `from conftest import ...` picked up
whichever conftest pytest loaded last (`pytest tests/training tests/elastic` failed to collect)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 32


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).eval()


def make_row(
    *,
    prompt_ids: list[int],
    response_ids: list[int],
    loss_mask: list[int] | None = None,
    behavior_logprobs: list[float] | None = None,
    group_id: str = "g0",
    sample_index: int = 0,
    reward: float | None = 1.0,
    trajectory_id: str | None = None,
) -> dict[str, Any]:
    """A schema-complete trajectory row; defaults make every response token a version-0 policy token."""
    n = len(response_ids)
    mask = [1] * n if loss_mask is None else loss_mask
    behaviour = [-1.0 if m else 0.0 for m in mask] if behavior_logprobs is None else behavior_logprobs
    return {
        "trajectory_id": trajectory_id or f"{group_id}-{sample_index}",
        "iteration": 0,
        "prompt_id": group_id,
        "group_id": group_id,
        "sample_index": sample_index,
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "behavior_logprobs": behaviour,
        "loss_mask": mask,
        "version_spans": [{"start": 0, "end": n, "version": 0}] if n else [],
        "min_version": 0,
        "max_version": 0,
        "tool_events": [],
        "num_turns": 1,
        "finish_reason": "answer",
        "final_answer": "1",
        "reference_answer": "1",
        "reward": reward,
        "instance_id": "test",
        "rollout_latency_s": 0.0,
        "generation_latency_s": 0.0,
        "tool_latency_s": 0.0,
    }
