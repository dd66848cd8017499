"""The GPU timing scripts compute what they claim to (checked on the CPU, small shapes).

Their timings are compared with the cost model in docs/planner.md, so a wrong step (attention over
the wrong cache rows, a prefill chunk that ignores its past, a FLOP count off by a factor) would
make that comparison wrong.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SHAPE = dict(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    vocab_size=50,
)


def _load(name: str):
    if str(BENCHMARKS) not in sys.path:  # as when the script runs: its folder holds its helpers
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mod():
    return _load("gpu_decode_step")


def _reference_decode(m, x: torch.Tensor, ctx: int) -> torch.Tensor:
    """The same step in float32 with SDPA's own GQA, reading the cache the step wrote."""
    s = m.s
    B, hd, kvh, nh = x.shape[0], s["head_dim"], s["num_kv_heads"], s["num_heads"]
    qd, kvd = nh * hd, kvh * hd
    x = x.float()
    for i, ly in enumerate(m.layers):
        ly = {k: v.float() for k, v in ly.items()}
        q = (F.rms_norm(x, (x.shape[-1],), ly["n1"], 1e-6) @ ly["qkv"])[:, :qd] * 1.0001
        kc = m.k[i, : B * ctx * kvd].view(B, kvh, ctx, hd).float()
        vc = m.v[i, : B * ctx * kvd].view(B, kvh, ctx, hd).float()
        att = F.scaled_dot_product_attention(q.view(B, nh, 1, hd), kc, vc, enable_gqa=True)
        x = x + att.reshape(B, qd) @ ly["o"]
        gate, up = (F.rms_norm(x, (x.shape[-1],), ly["n2"], 1e-6) @ ly["gu"]).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ ly["down"]
    return F.rms_norm(x, (x.shape[-1],), m.norm.float(), 1e-6) @ m.head.float()


def test_decode_step_matches_a_float32_reference_with_sdpa_gqa(mod) -> None:
    torch.manual_seed(1)
    m = mod.Model(SHAPE, cache_tokens=3 * 40, device="cpu")
    x = torch.randn(3, SHAPE["hidden_size"], dtype=torch.bfloat16)
    got = m.decode(x, 40, logits=True).float()
    ref = _reference_decode(m, x, 40)
    assert (got - ref).norm() / ref.norm() < 3e-2  # bf16 against float32
    # The reference is sensitive to the cache: other rows give another answer.
    m.k.normal_()
    assert (_reference_decode(m, x, 40) - ref).norm() / ref.norm() > 0.1


def test_prefill_in_chunks_equals_one_chunk_and_needs_its_past(mod) -> None:
    m = mod.Model(SHAPE, cache_tokens=64, device="cpu")
    x = torch.randn(12, SHAPE["hidden_size"], dtype=torch.bfloat16)
    whole = m.prefill(x, 0).float()
    m.prefill(x[:5], 0)
    chunked = m.prefill(x[5:], 5).float()
    assert (chunked - whole).norm() / whole.norm() < 2e-2
    alone = m.prefill(x[5:], 0).float()  # the same tokens without their past
    assert (alone - whole).norm() / whole.norm() > 0.1


def test_compare_prints_the_cost_model_next_to_each_point(mod, tmp_path, capsys) -> None:
    out = tmp_path / "step.json"
    out.write_text(
        json.dumps(
            {
                "device": "X",
                "torch": "t",
                "models": {
                    "qwen3-8b": {
                        "params": 8e9,
                        "decode": [{"batch": 8, "ctx": 1000, "eager_ms": 12.0, "graph_ms": 6.0}],
                        "prefill": [{"tokens": 2048, "past": 0, "eager_ms": 51.0}],
                    }
                },
            }
        )
    )
    mod.compare(out, "H200")
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("| 1,000 | 8 |"))
    model_ms = float(row.split("|")[3])
    assert 3.0 < model_ms < 12.0  # the H200 model of an 8B decode step at batch 8
    assert float(row.split("|")[5]) == pytest.approx(6.0 / model_ms, abs=0.01)


def test_train_step_compare_reports_the_mfu_of_the_planners_flop_count(tmp_path, capsys) -> None:
    from libra_core.planner.specs import get_hardware, get_model

    train = _load("gpu_train_step")
    out = tmp_path / "train.json"
    out.write_text(
        json.dumps(
            {
                "device": "X",
                "torch": "t",
                "models": {
                    "qwen3-4b": {
                        "params": 4e9,
                        "optimizer_ms": 30.0,
                        "fwd_bwd": [{"tokens": 8192, "recompute": False, "ms": 500.0, "peak_gb": 1.0}],
                    }
                },
            }
        )
    )
    train.compare(out, "H200")
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8,192 |"))
    m, hw = get_model("qwen3-4b"), get_hardware("H200")
    # By hand: 6 x params that cost FLOPs x tokens, plus causal attention 6 x layers x q_dim x s^2.
    flops = 6 * m.flops_params * 8192 + 6 * m.num_layers * m.q_dim * 8192**2
    assert float(row.split("|")[5]) == pytest.approx(flops / 0.5 / hw.peak_flops_per_s("bfloat16"), abs=0.006)


def test_train_step_runs_forward_and_backward_on_the_cpu(tmp_path) -> None:
    train = _load("gpu_train_step")
    out = tmp_path / "t.json"
    res = train.measure(["tiny"], out, "cpu", 1, ((32, False), (32, True)))
    rec = res["models"]["tiny"]
    assert [r["recompute"] for r in rec["fwd_bwd"]] == [False, True]
    assert all(r["ms"] > 0 for r in rec["fwd_bwd"]) and rec["optimizer_ms"] > 0
    assert json.loads(out.read_text()) == res


def test_tp_shards_hold_a_kth_of_the_heads_and_decode_k_times_the_sequences(mod, tmp_path) -> None:
    full = mod.model_shape("qwen3-14b")
    s8 = mod.shard(full, 8)
    assert (s8["num_heads"], s8["num_kv_heads"], s8["intermediate_size"]) == (5, 1, 2176)
    assert s8["hidden_size"] == full["hidden_size"]
    with pytest.raises(ValueError, match="does not divide"):
        mod.shard(full, 3)
    res = mod.measure_shards("tiny", tmp_path / "s.json", "cpu", 1, ((32, 2),), degrees=(1, 2, 4))
    rows = res["tp_shards"]
    assert [(r["tp"], r["per_gpu"]) for r in rows] == [(1, 2), (2, 2), (4, 2)]
    assert all(r["ms"] > 0 and r["cuda_graph"] is False for r in rows)
    assert json.loads((tmp_path / "s.json").read_text()) == res
