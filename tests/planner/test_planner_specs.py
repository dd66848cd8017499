"""Specs: YAML parsing, look-ups with helpful errors, and known answers from public configs."""

from __future__ import annotations

import pytest

from libra_core.planner.specs import get_hardware, get_model, hardware_specs, model_specs, parse_cluster


def test_all_specs_parse() -> None:
    assert {"A100-80G", "A800-80G", "H100", "H200", "cpu"} <= set(hardware_specs())
    assert {
        "qwen2.5-3b",
        "qwen2.5-7b",
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "tiny",
    } <= set(model_specs())


@pytest.mark.parametrize(
    "tp,expected",
    [
        (1, 2 * 40 * 8 * 128 * 2),
        (2, 2 * 40 * 4 * 128 * 2),
        (4, 2 * 40 * 2 * 128 * 2),
        (8, 2 * 40 * 1 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_qwen3_14b(tp: int, expected: int) -> None:
    assert get_model("qwen3-14b").kv_bytes_per_token(tp) == expected


def test_kv_heads_replicate_beyond_their_count() -> None:
    # Qwen2.5-3B has 2 KV heads: at TP 4 each GPU still holds one head (ceil), not half of one.
    assert get_model("qwen2.5-3b").kv_bytes_per_token(4) == 2 * 36 * 1 * 128 * 2


@pytest.mark.parametrize(
    "name",
    [
        "qwen2.5-3b",
        "qwen2.5-7b",
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "mistral-7b-v0.3",
    ],
)
def test_param_counts_match_model_cards(name: str) -> None:
    m = get_model(name)
    assert m.reported_params_b is not None
    assert m.num_params / 1e9 == pytest.approx(m.reported_params_b, rel=0.03)
    if m.reported_active_params_b:
        assert m.num_active_params / 1e9 == pytest.approx(m.reported_active_params_b, rel=0.05)


def test_tiny_model_matches_the_project_policy() -> None:
    m = get_model("tiny")
    assert (m.hidden_size, m.num_layers, m.num_heads, m.head_dim, m.intermediate_size) == (128, 4, 4, 32, 384)
    assert m.num_params == pytest.approx(0.86e6, rel=0.02)


def test_parse_cluster_and_aliases() -> None:
    c = parse_cluster("48xA800")
    assert c.num_gpus == 48 and c.hardware.name == "A800-80G"
    assert parse_cluster("16xh100").hardware.name == "H100"
    assert parse_cluster("1xcpu").hardware.gpus_per_node == 1
    assert get_hardware("A800").nvlink_gbps_per_dir < get_hardware("A100").nvlink_gbps_per_dir


@pytest.mark.parametrize("bad", ["48", "xA800", "0xA800", "48 A800"])
def test_parse_cluster_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="COUNTxGPU|at least 1"):
        parse_cluster(bad)


@pytest.mark.parametrize("count", ["65537", "99999999999999999999"])
def test_parse_cluster_refuses_more_devices_than_the_search_can_take(count: str) -> None:
    # 1e20 overflowed a C integer in `libra plan` and never finished in `libra simulate`
    assert parse_cluster("65536xA800").num_gpus == 65536
    with pytest.raises(ValueError, match=f"{count}xA800': at most 65,536 devices are supported"):
        parse_cluster(f"{count}xA800")


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown hardware 'B200'; valid: \[.*A800.*\]"):
        get_hardware("B200")
    with pytest.raises(ValueError, match=r"unknown model 'llama-7b'; valid: \[.*qwen3-14b.*\]"):
        get_model("llama-7b")
