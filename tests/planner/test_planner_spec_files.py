"""Your own model or GPU from a file: a Hugging Face config.json, or a spec YAML with `base:`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.planner import plan_cluster
from libra_core.planner.specs import get_hardware, get_model, parse_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "specs"

# Public config.json fields of three models (the architecture keys only).
LLAMA_31_70B = {
    "_name_or_path": "meta-llama/Llama-3.1-70B-Instruct",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "_name_or_path": "Qwen/Qwen3-30B-A3B",
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def write_json(path: Path, data: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


def test_a_dense_config_json_gives_the_model_cards_size(tmp_path: Path) -> None:
    m = get_model(write_json(tmp_path / "llama" / "config.json", LLAMA_31_70B))
    shipped = get_model(str(EXAMPLES / "llama-3.1-70b" / "config.json"))  # examples/specs
    assert shipped.model_copy(update={"source": m.source}) == m
    assert m.name == "llama-3.1-70b-instruct" and m.hf_id == "meta-llama/Llama-3.1-70B-Instruct"
    assert (m.head_dim, m.num_kv_heads, m.tie_embeddings, m.is_moe) == (128, 8, False, False)
    assert m.num_params / 1e9 == pytest.approx(70.6, rel=0.002)  # the model card's 70.6B


def test_a_mixtral_config_json_is_a_mixture_of_experts(tmp_path: Path) -> None:
    m = get_model(write_json(tmp_path / "mixtral-8x7b" / "config.json", MIXTRAL_8X7B))
    assert m.name == "mixtral-8x7b"  # no _name_or_path: the folder's name
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (8, 2, 14336)
    assert m.num_params / 1e9 == pytest.approx(46.7, rel=0.005)  # Mistral's 46.7B total
    assert m.num_active_params / 1e9 == pytest.approx(12.9, rel=0.005)  # and 12.9B per token


def test_a_config_json_prices_like_the_built_in_entry(tmp_path: Path) -> None:
    m = get_model(write_json(tmp_path / "config.json", QWEN3_30B_A3B))
    built_in = get_model("qwen3-30b-a3b")
    same = {"name", "hf_id", "source", "reported_params_b", "reported_active_params_b"}
    assert m.model_dump(exclude=same) == built_in.model_dump(exclude=same)
    assert get_model("Qwen/Qwen3-30B-A3B") is built_in  # a Hugging Face id names the built-in entry


def test_a_hardware_yaml_starts_from_a_built_in_gpu(tmp_path: Path) -> None:
    (tmp_path / "h800.yaml").write_text("base: H100\nnvlink_gbps_per_dir: 200\n")
    cluster = parse_cluster(f"32x{tmp_path / 'h800.yaml'}")
    h100 = get_hardware("H100")
    assert cluster.num_gpus == 32 and cluster.label == "32xh800"
    assert cluster.hardware.nvlink_gbps_per_dir == 200 and cluster.hardware.hbm_gbps == h100.hbm_gbps
    assert cluster.hardware.aliases == ()  # a file's GPU does not take the H100's names
    # The capped NVLink makes tensor-parallel training slower: the plan's iteration is longer.
    workload = "search-medium"
    capped = plan_cluster(f"32x{tmp_path / 'h800.yaml'}", "qwen3-32b", workload).best
    full = plan_cluster("32xH100", "qwen3-32b", workload).best
    assert capped is not None and full is not None
    assert capped.t_iter_s > full.t_iter_s


def test_a_model_yaml_changes_one_field_of_a_built_in_model(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("base: qwen3-8b\nname: qwen3-8b-deep\nnum_layers: 72\n")
    m, base = get_model(str(tmp_path / "deep.yaml")), get_model("qwen3-8b")
    assert m.name == "qwen3-8b-deep" and m.num_layers == 72 and m.hidden_size == base.hidden_size
    per_layer = (base.num_params - base.embedding_params) / base.num_layers
    assert m.num_params == pytest.approx(base.num_params + 36 * per_layer)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "gpu.yaml",
            "base: H100\nhbm_gbps: -1\n",
            r"gpu.yaml: hbm_gbps: Input should be greater than or equal to 0.001",
        ),
        ("gpu.yaml", "base: H100\nhbm_gbs: 4000\n", r"hbm_gbs: Extra inputs are not permitted"),
        ("gpu.yaml", "bf16_tflops: 900\n", r"gpu.yaml: fp32_tflops: Field required"),
        ("gpu.yaml", "base: B300\n", r"base 'B300' is not a built-in hardware; valid: \[.*H100"),
        ("gpu.yaml", "- H100\n", r"expected a mapping of fields, got list"),
        ("gpu.yaml", "base: [H100\n", r"gpu.yaml: invalid YAML at line 2"),
        ("gpu.yaml", "base: H100\nmemory_gb: .inf\n", r"memory_gb: Input should be a finite number"),
        (
            "gpu.yaml",
            "base: H100\nhbm_gbps: 1\nhbm_gbps: 2\n",
            r"duplicate key 'hbm_gbps' \(first defined on line 2\)",
        ),
        ("gpu.json", "{}", r"write a hardware spec as YAML"),
    ],
)
def test_a_bad_hardware_file_names_the_problem(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        parse_cluster(f"8x{tmp_path / name}")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, r"config.json has no 'num_hidden_layers'"),
        ({"kv_lora_rank": 512}, r"multi-head latent attention"),
        ({"decoder_sparse_step": 2}, r"dense layers between mixture-of-experts layers"),
        ({"shared_expert_intermediate_size": 5632}, r"shared experts \(shared_expert_intermediate_size\)"),
        ({"n_shared_experts": 2}, r"shared experts \(n_shared_experts\) are not modelled"),
        ({"quantization_config": {"quant_method": "fp8"}}, r"quantized weights \(quantization_config\)"),
        ({"num_key_value_heads": 5}, r"num_heads 32 not a multiple of 5"),
        ({"num_attention_heads": 0}, r"num_attention_heads must be a whole number from 1 to 2\^31-1, got 0"),
        ({"hidden_size": "2048"}, r"hidden_size must be a whole number .*, got '2048'"),
        ({"vocab_size": True}, r"vocab_size must be a whole number .*, got True"),
        ({"num_key_value_heads": 0}, r"num_key_value_heads must be a whole number .*, got 0"),
        ({"tie_word_embeddings": "false"}, r"tie_word_embeddings must be true or false, got 'false'"),
        ({"torch_dtype": "int8"}, r"torch_dtype must be bfloat16, float16 or float32, got 'int8'"),
    ],
)
def test_a_bad_config_json_names_the_problem(tmp_path: Path, change: dict, message: str) -> None:
    cfg = {k: v for k, v in {**QWEN3_30B_A3B, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        get_model(write_json(tmp_path / "config.json", cfg))


def test_a_missing_file_is_neither_a_name_nor_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"neither a built-in model name nor an existing file"):
        get_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(ValueError, match=r"unknown hardware 'B200'; valid: \[.*\], or a hardware spec YAML"):
        get_hardware("B200")
