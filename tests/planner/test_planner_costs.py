"""Cost model: known answers (ZeRO memory, bubble), TP counted once, monotonicity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from libra_core.planner.memory import model_state_bytes_per_param, train_memory, zero3_gathered_bytes
from libra_core.planner.presets import workload_preset
from libra_core.planner.rollout_cost import RolloutCostModel, build_segment_table
from libra_core.planner.specs import get_hardware, get_model
from libra_core.planner.train_cost import (
    TrainLayout,
    TrainShape,
    estimate_train,
    iteration_flops,
    pipeline_bubble_fraction,
)
from libra_core.planner.workload import Turns, workload_from_turns

A800 = get_hardware("A800")


@pytest.mark.parametrize("stage,expected_gb", [(0, 112.0), (1, 38.5), (2, 26.25), (3, 14.0)])
def test_model_state_memory_7b_zero_stages(stage: int, expected_gb: float) -> None:
    # 7e9 params, DP 8: weights 2 + grads 2 + fp32 master/m/v 12 bytes per param, sharded per stage.
    assert 7e9 * model_state_bytes_per_param(stage, dp=8) / 1e9 == pytest.approx(expected_gb)


def test_train_memory_qwen25_7b_orders_by_zero_stage() -> None:
    m = get_model("qwen2.5-7b")
    totals = [train_memory(m, 1, 1, 8, 1, z, True, 4096, 4) for z in (0, 1, 2, 3)]
    states = [t.weights_bytes + t.grads_bytes + t.optimizer_bytes for t in totals]
    assert states[0] == pytest.approx(16 * m.num_params)
    assert states[3] == pytest.approx(16 * m.num_params / 8)
    assert states == sorted(states, reverse=True)
    assert totals[0].optimizer_bytes == pytest.approx(12 * m.num_params)  # not 2 bytes/param


def test_recompute_cuts_activation_memory() -> None:
    m = get_model("qwen3-8b")
    full = train_memory(m, 2, 1, 4, 1, 1, False, 16384, 4)
    rec = train_memory(m, 2, 1, 4, 1, 1, True, 16384, 4)
    assert rec.activations_bytes < full.activations_bytes / 5


def test_zero3_holds_the_gathered_unit_beyond_its_shards() -> None:
    # Qwen3-14B at TP4: the largest unit is the 151,936 x 5,120 embedding shard (a layer's is 82.6M
    # parameters): two of its bf16 weights (computing, prefetched) and its bf16 gradients.
    m = get_model("qwen3-14b")
    unit = 151936 * 5120 / 4
    z3 = train_memory(m, 4, 1, 4, 1, 3, True, 8192, 4)
    z2 = train_memory(m, 4, 1, 4, 1, 2, True, 8192, 4)
    assert z3.gathered_bytes == pytest.approx(3 * unit * 2) and z2.gathered_bytes == 0.0
    shards = z3.weights_bytes + z3.grads_bytes + z3.optimizer_bytes
    rest = z3.activations_bytes + z3.logits_bytes + z3.reserved_bytes
    assert z3.total_bytes == pytest.approx(shards + rest + 3 * unit * 2)
    # Qwen3-8B at TP1: two embedding units (2 x 622M) pass DeepSpeed's 1e9 live parameters: capped
    z3_8b = train_memory(get_model("qwen3-8b"), 1, 1, 8, 1, 3, True, 8192, 4)
    assert z3_8b.gathered_bytes == pytest.approx(1e9 * 2 + 151936 * 4096 * 2)
    # a unit past the cap is still gathered whole (the cap drops the prefetch, not the unit)
    wide = get_model("qwen3-8b").model_copy(update={"vocab_size": 400_000})
    assert zero3_gathered_bytes(wide, 1, 1) == pytest.approx(400_000 * 4096 * (2 + 2))


def test_zero3_moe_unit_is_a_layers_experts_of_its_ep_rank() -> None:
    # Qwen3-30B-A3B at TP1: a layer holds 128 experts (623M parameters, more than the 311M
    # embedding); EP8 leaves 16 of them per rank, and the embedding becomes the largest unit.
    m = get_model("qwen3-30b-a3b")
    layer = m.attn_params_per_layer + m.hidden_size * m.num_experts + m.num_experts * m.expert_params
    emb = m.vocab_size * m.hidden_size
    assert layer > 6e8 > 3.5e8 > emb
    assert zero3_gathered_bytes(m, 1, 1) == pytest.approx(1e9 * 2 + layer * 2)
    layer8 = m.attn_params_per_layer + m.hidden_size * m.num_experts + m.num_experts * m.expert_params / 8
    assert layer8 < emb
    assert zero3_gathered_bytes(m, 1, 8) == pytest.approx(2 * emb * 2 + emb * 2)


@pytest.mark.parametrize("zero_stage,shards", [(1, 1), (2, 1), (3, 8)])
def test_reference_model_weights_counted(zero_stage: int, shards: int) -> None:
    # A KL reference keeps bf16 weights of the policy's shard: replicated over DP, sharded by ZeRO-3.
    m = get_model("qwen2.5-7b")
    base = train_memory(m, 1, 1, 8, 1, zero_stage, True, 4096, 4)
    ref = train_memory(m, 1, 1, 8, 1, zero_stage, True, 4096, 4, reference=True)
    assert base.reference_bytes == 0.0
    assert ref.reference_bytes == pytest.approx(2 * m.num_params / shards)
    assert ref.total_bytes - base.total_bytes == pytest.approx(ref.reference_bytes)


def test_reference_weights_can_make_a_layout_infeasible() -> None:
    m = get_model("qwen2.5-7b")
    shape = TrainShape(tokens=16 * 256 * 4096.0, sum_sq_len=16 * 256 * 4096.0**2, max_seq_len=4096.0)
    layout = TrainLayout(tp=1, pp=1, dp=8, zero_stage=1, recompute=True, micro_batch_seqs=8)
    without = estimate_train(m, A800, layout, shape)
    with_ref = estimate_train(m, A800, layout, dataclasses.replace(shape, ref_forward=True))
    assert without.feasible and not with_ref.feasible
    assert with_ref.memory.total_bytes > A800.mem_bytes >= without.memory.total_bytes


@pytest.mark.parametrize("m,p,expected", [(8, 1, 0.0), (8, 4, 3 / 11), (1, 4, 3 / 4), (32, 8, 7 / 39)])
def test_pipeline_bubble_fraction(m: int, p: int, expected: float) -> None:
    assert pipeline_bubble_fraction(m, p) == pytest.approx(expected)


def test_estimate_reports_the_1f1b_bubble() -> None:
    m = get_model("qwen3-8b")
    shape = TrainShape(tokens=2e6, sum_sq_len=2e6 * 4096, max_seq_len=4096, minibatches=1)
    est = estimate_train(m, A800, TrainLayout(1, 4, 2, zero_stage=1, micro_batch_seqs=1), shape)
    micro = int(np.ceil(2e6 / (2 * 4096)))
    assert est.bubble_fraction == pytest.approx(3 / (micro + 3))


def test_the_step_time_carries_the_bubble_and_every_slot_term() -> None:
    # bubble_fraction was checked, the time it prices was not: a step of m slots instead of
    # m + pp - 1 passed every planner test (only the simulator's golden trace noticed).
    m = get_model("qwen3-8b")
    shape = TrainShape(tokens=2e6, sum_sq_len=2e6 * 4096, max_seq_len=4096, minibatches=2)
    for layout in (TrainLayout(1, 4, 2, zero_stage=1), TrainLayout(2, 4, 1, zero_stage=1)):
        est = estimate_train(m, A800, layout, shape)
        assert est.bubble_fraction > 0.0 and est.pp_comm_s > 0.0
        parts = est.compute_s / (1.0 - est.bubble_fraction) + est.tp_comm_s + est.ep_comm_s + est.pp_comm_s
        assert est.time_s == pytest.approx(parts + est.dp_exposed_s + est.optimizer_s, rel=1e-9)


def test_moe_prices_the_experts_its_tokens_touch_and_the_ep_all_to_all() -> None:
    # Neither term had a planner test: every expert read at any batch, or no EP all-to-all, passed.
    moe = get_model("qwen3-30b-a3b")
    cost = RolloutCostModel(moe, A800)
    one, many = float(cost.forward_s(1, 1, 1, 512)), float(cost.forward_s(1, 64, 64, 512))
    # one token reads 8 of 128 experts (about 3.6 of 58 GB of expert weights), 64 tokens nearly all
    assert one < 0.4 * many
    shape = TrainShape(tokens=2e5, sum_sq_len=2e5 * 4096, max_seq_len=4096, minibatches=1)
    no_ep = estimate_train(moe, A800, TrainLayout(1, 1, 8, ep=1, zero_stage=1), shape)
    ep8 = estimate_train(moe, A800, TrainLayout(1, 1, 8, ep=8, zero_stage=1), shape)
    assert no_ep.ep_comm_s == 0.0 < ep8.ep_comm_s


def test_dp_past_the_sequences_per_step_does_not_shorten_the_step() -> None:
    # 8 sequences per step (one of 32K, seven of 2K): a rank trains whole sequences, so the rank
    # holding the 32K one does at least its work, however many ranks share the rest.
    m = get_model("qwen3-8b")
    lens = np.array([32768.0] + [2048.0] * 7)
    shape = TrainShape(float(lens.sum()), float((lens**2).sum()), 32768.0, minibatches=1)
    est = {
        dp: estimate_train(m, A800, TrainLayout(1, 1, dp, zero_stage=1), shape) for dp in (1, 2, 8, 16, 32)
    }
    longest = TrainShape(32768.0, 32768.0**2, 32768.0, minibatches=1)
    peak = A800.peak_flops_per_s(m.dtype) * A800.train_mfu
    floor_s = iteration_flops(m, longest, False) / peak
    assert est[1].compute_s == pytest.approx(iteration_flops(m, shape, False) / peak)
    assert est[1].compute_s > floor_s
    for dp in (2, 8, 16, 32):  # from DP 2 on, the 32K sequence outweighs the rest of a rank's share
        assert est[dp].compute_s == pytest.approx(floor_s)
    assert est[32].time_s >= est[8].time_s * 0.99  # only the DP all-reduce and optimizer move


def test_tp_is_counted_once_in_rollout() -> None:
    # Weight-bound decode: TP-2 reads half the weights per GPU, so a step takes a bit over half as
    # long (plus all-reduces), never the same or longer (TP counted twice would square the gain).
    cost = RolloutCostModel(get_model("qwen3-14b"), A800)
    t1, t2, t8 = (float(cost.decode_step_s(tp, 8, 2048)) for tp in (1, 2, 8))
    assert 0.5 < t2 / t1 < 0.8
    assert 0.125 < t8 / t1 < 0.5
    # Per-GPU FLOPs: prefill per token at TP 2 is close to half of TP 1.
    p1, p2 = float(cost.prefill_s_per_token(1, 2048)), float(cost.prefill_s_per_token(2, 2048))
    assert 0.5 < p2 / p1 < 0.65


def test_kv_capacity_leaves_room_for_weights() -> None:
    cost = RolloutCostModel(get_model("qwen3-32b"), A800)
    per_tok = get_model("qwen3-32b").kv_bytes_per_token(1)
    expected = (80e9 * 0.9 - get_model("qwen3-32b").weight_bytes - 2e9) / per_tok
    assert cost.kv_capacity_tokens(1) == pytest.approx(expected)
    assert cost.kv_capacity_tokens(2) > 2 * cost.kv_capacity_tokens(1)


def test_rollout_cost_monotone_in_tokens_and_model_size() -> None:
    batch, ctx = np.array([1, 8, 64, 256]), np.array([512, 2048, 8192, 32768])
    for tp in (1, 2, 4):
        steps = [
            RolloutCostModel(get_model(n), A800).decode_step_s(tp, 32, ctx)
            for n in ("qwen3-4b", "qwen3-8b", "qwen3-14b")
        ]
        assert np.all(np.diff(steps[0]) > 0)  # longer context, slower step
        assert np.all(steps[0] < steps[1]) and np.all(steps[1] < steps[2])  # bigger model, slower
        per_batch = RolloutCostModel(get_model("qwen3-8b"), A800).decode_step_s(tp, batch, 2048)
        assert np.all(np.diff(per_batch) > 0)


def test_segment_table_batches_each_instance_share_of_its_range() -> None:
    # 64 equal trajectories: prompt 500, turns of 600 and 400 tokens with a 100-token tool reply
    # taking 10 s between them, no re-prefill. n instances each hold 64 / n of them, and only the
    # share not waiting on the tool decodes: the active batch is a fixed point, solved here by hand.
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns([500] * 64, [[600, 400]] * 64, [[100, 0]] * 64, [10.0] * 64)
    w = workload_from_turns("flat", turns, 4, 16, reprefill_fraction=0.0)
    table = build_segment_table(cost, w, (1, 8), 1, 64)  # room for 8 TP8 instances
    ctx = 500 + (1000 + 100) / 2  # mean context over a life
    for ti, tp in enumerate((1, 8)):
        cap = min(256.0, float(np.floor(cost.kv_capacity_tokens(tp) / ctx)))
        pre = float(cost.prefill_s_per_token(tp, ctx))
        paths = []
        for n in (1, 2, 4, 8):
            q = 64 / n
            b = min(q, cap)
            for _ in range(100):
                busy = 1000 * float(cost.decode_step_s(tp, b, ctx)) + 600 * pre
                b = min(cap, max(1.0, q * busy / (busy + 10.0)))
            step = float(cost.decode_step_s(tp, b, ctx))
            crit, work = table.crit_s[ti, n - 1, 0, 1], table.work_s[ti, n - 1, 0, 1]
            assert crit == pytest.approx(1000 * step + 600 * pre + 10.0, rel=0.01)
            assert work == pytest.approx(64 * (1000 * step / b + 600 * pre), rel=0.01)
            paths.append(float(table.crit_s[ti, n - 1, 0, 1]))
        assert np.all(np.diff(paths) < 0)  # a smaller share per instance: shorter decode steps


def test_critical_path_is_one_trajectory_not_a_mix_of_maxima() -> None:
    # One bin, two trajectories: A decodes 4,000 tokens and calls no tool; B decodes 100 and waits
    # 100 s on a tool. The slowest trajectory is B (~101 s), not "A's decode + B's tool wait".
    cost = RolloutCostModel(get_model("qwen3-8b"), A800)
    turns = Turns([100, 100], [[4000], [50, 50]], [[0], [20, 0]], [0.0, 100.0])
    w = workload_from_turns("mixed", turns, 1, 2, reprefill_fraction=0.0)
    table = build_segment_table(cost, w, (1,), 1, 1)
    crit = float(table.crit_s[0, 0, 0, 1])
    ctx = float(np.average(w.prompt_tokens + (w.gen_tokens + w.payload_tokens) / 2, weights=w.gen_tokens))
    fast, slow = (float(cost.decode_step_s(1, b, ctx)) for b in (1, 2))
    pre = float(cost.prefill_s_per_token(1, ctx))
    paths = [step * w.gen_tokens + pre * w.prefill_tokens + w.tool_latency_s for step in (fast, slow)]
    assert max(paths[0]) <= crit <= max(paths[1])
    assert crit < fast * 4000 + 100.0  # what combining the bin's maxima would have said


def test_train_cost_monotone_in_tokens_and_model_size() -> None:
    layout = TrainLayout(4, 1, 2, zero_stage=3, recompute=True)
    shapes = [TrainShape(tokens=t, sum_sq_len=t * 4096, max_seq_len=8192) for t in (1e5, 1e6, 1e7)]
    for name in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        times = [estimate_train(get_model(name), A800, layout, s).time_s for s in shapes]
        assert times == sorted(times) and times[0] < times[-1]
    by_size = [
        estimate_train(get_model(n), A800, layout, shapes[1]).time_s
        for n in ("qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")
    ]
    assert by_size == sorted(by_size)


def test_moe_training_flops_use_active_params() -> None:
    moe = get_model("qwen3-30b-a3b")
    w = workload_preset("math-short")
    shape = TrainShape.from_workload(w)
    flops = iteration_flops(moe, shape, recompute=False)
    dense_equiv = 6 * moe.num_params * shape.tokens
    assert flops < dense_equiv / 5  # ~3.3B active of 30.5B
    assert flops > 6 * moe.flops_params * shape.tokens


def test_serving_overhead_adds_cpu_time_per_step_and_per_sequence() -> None:
    m = get_model("qwen3-14b")
    gpu_only = RolloutCostModel(m, A800)
    cpu = RolloutCostModel(
        m, A800.model_copy(update={"serving_step_overhead_us": 2000.0, "serving_seq_overhead_us": 300.0})
    )
    for tp, batch, ctx in ((1, 1, 1000), (2, 64, 8000), (8, 256, 30000)):
        extra = float(cpu.decode_step_s(tp, batch, ctx)) - float(gpu_only.decode_step_s(tp, batch, ctx))
        assert extra == pytest.approx(2e-3 + 300e-6 * batch, rel=1e-9)
    # Prefill is priced per chunk of the forward pass only.
    assert float(cpu.prefill_s_per_token(2, 8000)) == float(gpu_only.prefill_s_per_token(2, 8000))

    # The per-sequence term costs a high degree more per GPU at equal sequences per GPU: per-GPU
    # decode throughput at 32 sequences per GPU, 2K context, falls from TP1 to TP8 with it.
    def per_gpu(cost: RolloutCostModel, tp: int) -> float:
        return 32 / float(cost.decode_step_s(tp, 32 * tp, 2000))

    assert per_gpu(gpu_only, 4) > per_gpu(gpu_only, 1)  # GPU kernels alone: TP4 is not worse
    cpu_bound = RolloutCostModel(m, A800.model_copy(update={"serving_seq_overhead_us": 400.0}))
    assert per_gpu(cpu_bound, 1) > per_gpu(cpu_bound, 4) > per_gpu(cpu_bound, 8)


def test_negative_serving_overhead_is_rejected() -> None:
    with pytest.raises(ValueError, match="serving_seq_overhead_us"):
        type(A800).model_validate({**A800.model_dump(), "serving_seq_overhead_us": -1.0})
