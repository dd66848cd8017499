"""Building the tiny policy and writing it as a reloadable Hugging Face folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from libra_core.config.models import TinyModelConfig
from libra_core.envs.arithmetic import SPECIAL_TOKENS, ArithmeticEnv
from libra_core.model.policy import build_tiny_policy, count_parameters, save_policy
from libra_core.model.tokenizer import train_tokenizer

TINY = TinyModelConfig(
    hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(ArithmeticEnv().corpus(200, seed=0), SPECIAL_TOKENS, vocab_size=64)


def test_config_is_what_vllm_expects(tok) -> None:
    model = build_tiny_policy(TINY, len(tok), seed=0)
    c = model.config
    assert c.architectures is None or c.architectures == ["Qwen2ForCausalLM"]
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (64, 2, 2, 1)
    assert (c.head_dim, c.vocab_size, c.tie_word_embeddings, c.use_sliding_window) == (
        32,
        len(tok),
        False,
        False,
    )
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert next(model.parameters()).dtype == torch.float32


def test_special_token_ids_come_from_the_tokenizer(tok) -> None:
    # an environment may list its specials in another order than <|pad|>, <|eos|>
    shuffled = train_tokenizer(
        ArithmeticEnv().corpus(50, seed=0), [SPECIAL_TOKENS[2], *SPECIAL_TOKENS[:2], *SPECIAL_TOKENS[3:]], 64
    )
    assert (shuffled.pad_token_id, shuffled.eos_token_id) != (0, 1)
    model = build_tiny_policy(
        TINY, len(shuffled), seed=0, pad_token_id=shuffled.pad_token_id, eos_token_id=shuffled.eos_token_id
    )
    for config in (model.config, model.generation_config):
        assert (config.pad_token_id, config.eos_token_id) == (shuffled.pad_token_id, shuffled.eos_token_id)


def test_seeded_build_is_deterministic(tok) -> None:
    a, b, c = (build_tiny_policy(TINY, len(tok), seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    # embed + lm_head + per layer (q,k,v with bias, o, 3 MLP mats, 2 norms) + final norm
    h, kv, ffn, v = 64, 32, 96, len(tok)
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * ffn + 2 * h
    assert count_parameters(a) == 2 * v * h + 2 * layer + h


def test_head_dim_must_match_hidden_over_heads(tok) -> None:
    bad = TinyModelConfig(hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=32)
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_policy(bad, len(tok), seed=0)


def test_saved_folder_reloads_with_equal_logits(tok, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = build_tiny_policy(TINY, len(tok), seed=0).eval()
    out = save_policy(model, tok, tmp_path / "policy")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is False
    assert (
        json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    reloaded_tok = AutoTokenizer.from_pretrained(out)
    text = "<|user|>((3+4)*5)<|assistant|><|call|>3+4<|/call|><|result|>7<|/result|>"
    ids = reloaded_tok.encode(text)
    assert ids == tok.encode(text)
    assert (reloaded_tok.eos_token, reloaded_tok.pad_token) == ("<|eos|>", "<|pad|>")
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.allclose(model(x).logits, reloaded(x).logits, atol=1e-6)


def test_save_replaces_atomically_and_casts_a_copy(tok, tmp_path: Path) -> None:
    from safetensors import safe_open

    model = build_tiny_policy(TINY, len(tok), seed=0)
    out = tmp_path / "policy"
    save_policy(model, tok, out)
    (out / "stale.txt").write_text("from an older version")
    save_policy(model, tok, out, dtype="bfloat16")
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no temp folders left behind
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32
