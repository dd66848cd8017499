"""Bad input to the planner refused or ignored as documented, never turned into a silent number:
NaN/inf stage times (StageCorrection), zero-time or missing calibration samples (fit_compute,
fit_network), loosely typed or implausible spec files (specs, spec_files), and audit records whose
seconds fields were seconds per million tokens (replan.audit_decision)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from libra_core.planner.audit import AuditPolicy, MoveAudit
from libra_core.planner.calibration import (
    ELEMENTWISE_OPS,
    GEMM_OPS,
    OpSample,
    StageCorrection,
    fit_compute,
    fit_network,
    load_compute_samples,
    load_network_samples,
)
from libra_core.planner.memory import train_memory
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanPolicy, audit_decision
from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.search import SearchSettings, search_plans
from libra_core.planner.specs import (
    get_hardware,
    get_model,
    hardware_specs,
    model_specs,
    parse_cluster,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "specs"

# --- StageCorrection: non-finite times --------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted_s", "measured_s"),
    [(10.0, math.nan), (10.0, math.inf), (math.inf, 5.0), (math.nan, 5.0), (-math.inf, 5.0)],
)
def test_a_time_that_is_not_finite_leaves_the_factor_unchanged(predicted_s: float, measured_s: float) -> None:
    # NaN passed the `<= 0` check and became the 0.2 clamp; an infinite prediction raised
    # "math domain error".
    c = StageCorrection()
    assert c.observe("rollout", 10.0, 12.0) == pytest.approx(1.2)
    assert c.observe("rollout", predicted_s, measured_s) == pytest.approx(1.2)
    assert c.factor("rollout") == pytest.approx(1.2) and c.observations("rollout") == 1
    fresh = StageCorrection()
    assert fresh.observe("update", predicted_s, measured_s) == 1.0 and fresh.observations("update") == 0


def test_a_finite_time_keeps_its_ewma_and_the_first_observation_counts_whole() -> None:
    # The docstring's account: the first observation sets the factor (up to the clamp), each later
    # one moves the log factor by alpha. Pinned, as the simulator's numbers depend on it.
    c = StageCorrection()
    assert c.observe("rollout", 10.0, 30.0) == pytest.approx(3.0)
    pulled = [c.observe("rollout", 10.0, 10.0) for _ in range(4)]
    assert pulled == pytest.approx([3.0 ** (0.7**k) for k in (1, 2, 3, 4)])
    assert [round(f, 1) for f in pulled] == [2.2, 1.7, 1.5, 1.3]
    assert StageCorrection().observe("rollout", 1.0, 100.0) == pytest.approx(5.0)  # clamped
    with pytest.raises(ValueError, match="must be > 0"):
        StageCorrection().observe("rollout", 10.0, 0.0)


# --- calibration fits: zero times, empty groups, validation ----------------------------------

COMPUTE_ROW = {
    "n_embd": 4096,
    "n_head": 32,
    "n_kv_head": 32,
    "n_expanded_embd": 11008,
    "num_tokens": 128,
    "num_tensor_parallel_workers": 1,
}


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _compute_row(ms: float = 0.05, **times: float) -> dict[str, object]:
    row: dict[str, object] = dict(COMPUTE_ROW)
    for op in (*GEMM_OPS, *ELEMENTWISE_OPS):
        row[f"time_stats.{op}.median"] = times.get(op, ms)
    return row


def test_a_profile_row_timed_zero_is_refused_naming_file_line_and_column(tmp_path: Path) -> None:
    good = _write_csv(tmp_path / "good.csv", [_compute_row()])
    assert len(load_compute_samples(good)) == len(GEMM_OPS) + len(ELEMENTWISE_OPS)
    bad = _write_csv(tmp_path / "mlp.csv", [_compute_row(), _compute_row(add=0.0)])
    with pytest.raises(
        ValueError, match=r"mlp.csv, line 3: time_stats.add.median must be a time > 0 ms, got '0.0'"
    ):
        load_compute_samples(bad)
    net = {
        "collective": "all_reduce",
        "num_workers": 8,
        "devices_per_node": 8,
        "max_devices_per_node": 8,
        "size": 1048576,
        "time_stats.all_reduce.median": 0.1,
    }
    assert len(load_network_samples(_write_csv(tmp_path / "ok.csv", [net]))) == 1
    zero = _write_csv(tmp_path / "all_reduce.csv", [{**net, "time_stats.all_reduce.median": "nan"}])
    with pytest.raises(
        ValueError, match=r"all_reduce.csv, line 2: time_stats.all_reduce.median .* got 'nan'"
    ):
        load_network_samples(zero)


def _gemm_sample(measured_s: float = 1e-4) -> OpSample:
    t, k, n = 128, 4096, 4096
    return OpSample(
        "x", "mlp_up_proj", "gemm", measured_s, 2 * t * k * n, 2 * (t * k + k * n + t * n), t, k, n
    )


def test_a_fit_without_elementwise_samples_keeps_the_specs_factors() -> None:
    # It returned elementwise_bw_eff 0.0, and the next elementwise price divided by it.
    hw = get_hardware("A100")
    fitted = fit_compute(hw, [_gemm_sample()])
    assert (fitted.elementwise_bw_eff, fitted.elementwise_overhead_us) == (
        hw.elementwise_bw_eff,
        hw.elementwise_overhead_us,
    )
    assert fitted.gemm_compute_eff != hw.gemm_compute_eff or fitted.op_overhead_us != hw.op_overhead_us
    assert fit_compute(hw, []) == hw and fit_network(hw, []) == hw


@pytest.mark.parametrize(
    "sample",
    [
        OpSample("x", "add", "elementwise", 0.0, 0.0, 1e6),
        OpSample("x", "all_reduce", "all_reduce_intra", 0.0, bytes_moved=1e6, ranks=8, ranks_per_node=8),
        OpSample("x", "send_recv", "send_recv_intra", math.nan, bytes_moved=1e6, ranks=2, ranks_per_node=8),
    ],
)
def test_a_sample_timed_zero_is_refused_by_the_fits(sample: OpSample) -> None:
    # The compute fit returned an efficiency of 0; the network fit raised ZeroDivisionError.
    hw = get_hardware("A100")
    with pytest.raises(ValueError, match=rf"sample x/{sample.op} \({sample.kind}\): measured_s must be"):
        fit_network(fit_compute(hw, [_gemm_sample(), sample]), [sample])


def test_the_fitted_spec_is_validated() -> None:
    # model_copy skips validation: a spec out of bounds went through the fit unnoticed.
    broken = get_hardware("A100").model_copy(update={"memory_gb": -1.0})
    with pytest.raises(ValidationError, match="memory_gb"):
        fit_network(broken, [])
    with pytest.raises(ValidationError, match="memory_gb"):
        fit_compute(broken, [_gemm_sample()])


# --- spec files: strict types, plausibility caps, MoE fields ----------------------------------


def test_every_built_in_and_example_spec_loads_and_round_trips_through_a_file(tmp_path: Path) -> None:
    # Loading them validates every built-in entry under the strict types and caps.
    assert {"H100", "cpu"} <= set(hardware_specs()) and {"qwen3-30b-a3b", "tiny"} <= set(model_specs())
    for name, hw in hardware_specs().items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"base: {name}\n")
        copy = parse_cluster(f"8x{path}").hardware
        assert copy.model_dump(exclude={"name", "aliases", "source"}) == hw.model_dump(
            exclude={"name", "aliases", "source"}
        )
    for name, m in model_specs().items():
        path = tmp_path / f"m-{name}.yaml"
        path.write_text(f"base: {name}\n")
        same = {"name", "hf_id", "source"}
        assert get_model(str(path)).model_dump(exclude=same) == m.model_dump(exclude=same)
    assert get_model(str(EXAMPLES / "llama-3.1-70b" / "config.json")).num_layers == 80
    assert parse_cluster(f"32x{EXAMPLES / 'h800.yaml'}").hardware.nvlink_gbps_per_dir == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus_per_node: true\n", r"gpus_per_node: Input should be a valid integer"),
        ('memory_gb: "80"\n', r"memory_gb: Input should be a valid number"),
        ("gpus_per_node: 8.0\n", r"gpus_per_node: Input should be a valid integer"),
        ("memory_gb: 80000000000\n", r"memory_gb: Input should be less than or equal to 10000"),
        ("bf16_tflops: 1.0e+300\n", r"bf16_tflops: Input should be less than or equal to 100000"),
        ("hbm_gbps: 4.8e+6\n", r"hbm_gbps: Input should be less than or equal to 100000"),
        ("gpus_per_node: 1000000000\n", r"gpus_per_node: Input should be less than or equal to 1024"),
        ("op_overhead_us: 1.0e+9\n", r"op_overhead_us: Input should be less than or equal to 1000000"),
        # Positive but absurdly small values priced steps as inf/NaN (a "plan" of 0 tok/s)
        ("hbm_gbps: 1.0e-320\n", r"hbm_gbps: Input should be greater than or equal to 0.001"),
        ("bf16_tflops: 1.0e-300\n", r"bf16_tflops: Input should be greater than or equal to 0.001"),
        ("train_mfu: 1.0e-300\n", r"train_mfu: Input should be greater than or equal to 0.001"),
        ("mem_bw_eff: 1.0e-9\n", r"mem_bw_eff: Input should be greater than or equal to 0.001"),
        ("memory_gb: 1.0e-300\n", r"memory_gb: Input should be greater than or equal to 0.001"),
    ],
)
def test_a_loosely_typed_or_implausible_hardware_file_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text("base: H100\n" + text)
    with pytest.raises(ValueError, match=rf"hardware file {path}: {message}"):
        parse_cluster(f"8x{path}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('tie_embeddings: "yes"\n', r"tie_embeddings: Input should be a valid boolean"),
        ("tie_embeddings: 1\n", r"tie_embeddings: Input should be a valid boolean"),
        ('vocab_size: "151936"\n', r"vocab_size: Input should be a valid integer"),
        ("num_layers: true\n", r"num_layers: Input should be a valid integer"),
        (
            "hidden_size: " + "1" + "0" * 200 + "\n",
            r"hidden_size: Input should be less than or equal to 1000000",
        ),
        ("num_layers: 100000000000\n", r"num_layers: Input should be less than or equal to 10000"),
        ("head_dim: 100000\n", r"head_dim: Input should be less than or equal to 65536"),
        ("vocab_size: 99999999999\n", r"vocab_size: Input should be less than or equal to 10000000"),
        (
            "experts_per_token: 8\nmoe_intermediate_size: 768\n",
            r"experts_per_token \(8\) and moe_intermediate_size \(768\) are mixture-of-experts fields "
            r"but num_experts is 0",
        ),
    ],
)
def test_a_loosely_typed_or_implausible_model_file_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "model.yaml"
    path.write_text("base: qwen3-8b\n" + text)
    with pytest.raises(ValueError, match=rf"model file {path}: .*{message}"):
        get_model(str(path))


def test_a_moe_base_made_dense_must_drop_its_expert_fields(tmp_path: Path) -> None:
    half = tmp_path / "dense.yaml"
    half.write_text("base: qwen3-30b-a3b\nnum_experts: 0\n")
    with pytest.raises(ValueError, match=r"dense.yaml: .*num_experts is 0; set them to 0 for a dense model"):
        get_model(str(half))
    whole = tmp_path / "dense2.yaml"
    whole.write_text("base: qwen3-30b-a3b\nnum_experts: 0\nexperts_per_token: 0\nmoe_intermediate_size: 0\n")
    m = get_model(str(whole))
    assert not m.is_moe and m.intermediate_size == 6144
    ok = tmp_path / "int.yaml"
    ok.write_text("base: H100\nmemory_gb: 96\n")  # an integer is a number
    assert parse_cluster(f"8x{ok}").hardware.memory_gb == 96.0


LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_a_null_in_config_json_takes_the_default_or_says_null(tmp_path: Path) -> None:
    # `"num_key_value_heads": null` said "config.json has no 'num_key_value_heads'".
    path = tmp_path / "kv" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**LLAMA_8B, "num_key_value_heads": None}))
    assert get_model(str(path)).num_kv_heads == 32  # transformers: null is num_attention_heads
    path = tmp_path / "vocab" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**LLAMA_8B, "vocab_size": None}))
    with pytest.raises(ValueError, match=r"config.json sets 'vocab_size' to null; it needs a whole number"):
        get_model(str(path))


# --- training memory ignores the spec's dtype (documented in docs/planner.md, Training) --------


def test_a_float32_spec_gets_bf16_training_memory_and_fp32_rollout_bytes(tmp_path: Path) -> None:
    path = tmp_path / "fp32.yaml"
    path.write_text("base: qwen3-8b\ndtype: float32\n")
    bf16, fp32 = get_model("qwen3-8b"), get_model(str(path))
    assert train_memory(fp32, 1, 1, 8, 1, 1, False, 8192, 1) == train_memory(
        bf16, 1, 1, 8, 1, 1, False, 8192, 1
    )
    hw = get_hardware("H100")
    assert RolloutCostModel(fp32, hw).weight_bytes_per_gpu(1) == 2 * RolloutCostModel(
        bf16, hw
    ).weight_bytes_per_gpu(1)


# --- audit records: seconds, not seconds per million tokens -----------------------------------


def test_an_audit_record_holds_seconds_and_its_throughputs_in_the_reason() -> None:
    w = workload_preset("math-short")
    plans = search_plans(get_model("qwen3-8b"), get_hardware("H100"), 16, w, SearchSettings(staleness=1))
    old, new = plans[0], next(p for p in plans[1:] if not p.same_resources(plans[0]))
    tokens = w.stats()["tokens_per_iteration"]
    audit = MoveAudit(AuditPolicy(window=1))
    audit.record(3, tokens, 40.0)  # the iteration before the move: 40 s
    audit.moved(5, old, new, 0.1)
    audit.record(6, tokens, 50.0)  # after it: 50 s, 20% less throughput
    v = audit.verdict(7)
    assert v is not None and v.action == "revert"
    d = audit_decision(7, v, w, ReplanPolicy(), move_cost_s=60.0)
    # It stored 1e6 / tokens-per-second: 65.4 "s" for a 50 s iteration of 765K tokens.
    assert d.current_t_iter_s == pytest.approx(50.0)
    assert d.proposed_t_iter_s == pytest.approx(40.0)
    assert d.saving_per_iter_s == pytest.approx(10.0)
    assert f"{v.before_tokens_per_s:,.0f} -> {v.after_tokens_per_s:,.0f} tok/s" in d.reason
    assert "40.0 -> 50.0 s" in d.reason
    record = json.loads(json.dumps(d.as_record()))  # the decision log's line: same fields as before
    assert set(record) == {
        "iteration", "action", "reason", "current_t_iter_s", "proposed_t_iter_s", "saving_per_iter_s",
        "expected_iterations", "move_cost_s", "amortised_gain_s", "min_gain_fraction",
        "window_trajectories", "window_mean_len", "window_p90_len", "current_split", "proposed_split",
    }  # fmt: skip
