"""Replanning: hysteresis, amortised move cost, decision records, online correction, service."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pyarrow as pa
import pytest

from libra_core.config import LibraConfig
from libra_core.planner.calibration import StageCorrection
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanPolicy, TrajectoryWindow
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import SearchSettings, search_plans
from libra_core.planner.service import LibraPlanner
from libra_core.planner.specs import get_hardware, get_model, parse_cluster

M, HW = get_model("qwen3-8b"), get_hardware("A800")
SET = SearchSettings(staleness=1)
# On-policy: rollout and training add up, so a length drift moves the best split. (With staleness 1
# both math-short plans are bound by the longest trajectory's decode, which no split shortens.)
ON_POLICY = SearchSettings(staleness=0)


def plans_for_drift() -> tuple:
    short = workload_preset("math-short")
    long = short.scaled(4.0)
    current = search_plans(M, HW, 48, short, ON_POLICY)[0]
    current_now = evaluate_plan(current, M, HW, long, ON_POLICY)
    proposed = search_plans(M, HW, 48, long, ON_POLICY)[0]
    return current, current_now, proposed, long


def test_apply_only_when_amortised_gain_beats_move_cost() -> None:
    current, now, proposed, window = plans_for_drift()
    saving = now.t_iter_s - proposed.t_iter_s
    assert saving > 0.05 * now.t_iter_s  # the drift makes the old plan clearly worse
    cheap = ReplanPolicy(0.05, 50, move_cost_s=saving * 10).decide(7, current, now, proposed, window)
    dear = ReplanPolicy(0.05, 50, move_cost_s=saving * 100).decide(7, current, now, proposed, window)
    assert cheap.action == "apply" and dear.action == "keep"
    assert cheap.amortised_gain_s == pytest.approx(saving * 50)
    assert "move cost" in dear.reason
    record = cheap.as_record()
    assert record["iteration"] == 7 and record["proposed_t_iter_s"] == proposed.t_iter_s


def test_a_move_near_the_end_amortises_over_the_iterations_left() -> None:
    # A move 10 iterations before the end earns 10 iterations' saving, not expected_iterations'.
    current, now, proposed, window = plans_for_drift()
    saving = now.t_iter_s - proposed.t_iter_s
    policy = ReplanPolicy(0.05, 50, move_cost_s=saving * 20)
    early = policy.decide(7, current, now, proposed, window, iterations_left=93)
    late = policy.decide(90, current, now, proposed, window, iterations_left=10)
    assert early.action == "apply" and early.expected_iterations == 50
    assert late.action == "keep" and late.expected_iterations == 10
    assert late.amortised_gain_s == pytest.approx(saving * 10)


def test_hysteresis_keeps_plan_for_small_gains() -> None:
    current, now, proposed, window = plans_for_drift()
    saving = now.t_iter_s - proposed.t_iter_s
    strict = ReplanPolicy(min_gain_fraction=min(0.99, saving / now.t_iter_s + 0.01), move_cost_s=0.0)
    decision = strict.decide(3, current, now, proposed, window)
    assert decision.action == "keep" and "hysteresis" in decision.reason


def test_no_flap_on_unchanged_workload() -> None:
    w = workload_preset("math-short")
    current = search_plans(M, HW, 48, w, SET)[0]
    now = evaluate_plan(current, M, HW, w, SET)
    proposed = search_plans(M, HW, 48, w, SET)[0]
    decision = ReplanPolicy().decide(1, current, now, proposed, w)
    assert decision.action in ("keep", "apply")
    assert decision.saving_per_iter_s <= 0.05 * now.t_iter_s  # nothing to gain from replanning
    if decision.action == "apply":
        assert decision.move_cost_s == 0.0  # only free re-assignments may apply


def test_stage_correction_is_bounded_ewma() -> None:
    c = StageCorrection(alpha=0.5, min_factor=0.5, max_factor=2.0)
    assert c.factor("rollout") == 1.0
    assert c.observe("rollout", 1.0, 1.5) == pytest.approx(1.5)
    assert c.observe("rollout", 1.0, 1.5) == pytest.approx(1.5)
    assert c.observe("update", 1.0, 100.0) == pytest.approx(2.0)  # clamped
    f = c.observe("rollout", 1.0, 1.0)
    assert f == pytest.approx(math.exp(0.5 * math.log(1.5)))
    assert c.observations("rollout") == 3
    with pytest.raises(ValueError):
        c.observe("rollout", 0.0, 1.0)


def test_window_keeps_recent_iterations() -> None:
    win = TrajectoryWindow(2)
    for scale in (1.0, 2.0, 3.0):
        win.add(workload_preset("arith-tiny").scaled(scale))
    pooled = win.pooled()
    assert len(win) == 2 and pooled.num_samples == 2 * workload_preset("arith-tiny").num_samples


def test_service_plans_and_replans_on_schedule() -> None:
    cfg = LibraConfig.model_validate(
        {
            "planner": {
                "type": "libra",
                "replan_every": 2,
                "hardware": "8xH100",
                "model_spec": "qwen3-4b",
                "initial_workload": "math-short",
            }
        }
    )
    planner = LibraPlanner.from_config(cfg)
    plan, decision = planner.step(0)
    assert decision is not None and decision.action == "initial"
    assert plan.train_gpus + plan.rollout_gpus == 8
    ran = workload_preset("math-short").scaled(3.0)
    # the model's own price of what ran, without factors: a 1.2x slower rollout is a 1.2 factor
    truth = evaluate_plan(plan, planner.model, planner.cluster.hardware, ran, planner.settings())
    planner.observe(
        ran, group_size=8, measured_s={"rollout": truth.t_rollout_s * 1.2, "update": truth.t_train_s}
    )
    assert planner.corrections.factor("rollout") == pytest.approx(1.2)
    assert planner.corrections.factor("update") == pytest.approx(1.0)
    assert planner.step(1)[1] is None  # not a replan iteration
    plan2, decision2 = planner.step(2)
    assert decision2 is not None and decision2.action in ("keep", "apply")
    assert decision2.window_mean_len > workload_preset("math-short").stats()["mean_len"]


def test_a_steady_model_error_is_learned_once_between_replans() -> None:
    """The plan's times include the factors it was priced with; an observation is compared with
    the prediction without them. Dividing by today's factor instead compounded the correction
    between replans: 2.0, 2.46, 3.03, ... towards the clamp for a steady 2x error."""
    w = workload_preset("math-short", 0, num_samples=128)
    planner = LibraPlanner(parse_cluster("8xH100"), get_model("qwen3-4b"), w, ReplanPolicy(), 4, 0, 0)
    plan, _ = planner.step(1)  # replan_every=0: the first plan runs throughout
    for it in range(1, 7):
        planner.observe(w, 8, {"rollout": 2.0 * plan.t_rollout_s, "update": 3.0 * plan.t_train_s})
        assert planner.step(it + 1)[0] is plan
        assert planner.corrections.factor("rollout") == pytest.approx(2.0)
        assert planner.corrections.factor("update") == pytest.approx(3.0)


def test_drift_is_not_learned_as_model_error() -> None:
    """The measured stage times were compared with the plan's price on the workload it was planned
    for, so 2x longer trajectories priced exactly by the model set factors of 2.1 (rollout) and 2.7
    (update), and the next replan applied the drift twice (until 2026-12-06)."""
    cluster, model = parse_cluster("48xA800"), get_model("qwen3-14b")
    prior = workload_preset("search-medium", 0)
    planner = LibraPlanner(cluster, model, prior, ReplanPolicy(), 1, 0, 1)
    plan, _ = planner.step(1)
    ran = prior.scaled(2.0)
    truth = evaluate_plan(plan, model, cluster.hardware, ran, planner.settings())
    assert truth.t_rollout_s > 1.5 * plan.t_rollout_s  # the drift is large
    for it in range(1, 4):
        planner.observe(ran, 8, {"rollout": truth.t_rollout_s, "update": truth.t_train_s}, iteration=it)
    assert planner.corrections.factor("rollout") == pytest.approx(1.0)
    assert planner.corrections.factor("update") == pytest.approx(1.0)


def test_measured_workloads_keep_the_configured_minibatches() -> None:
    """A workload built from a run's trajectories took Workload's default of 4 optimizer steps, so
    every replan priced training for 4 whatever training.grpo.minibatches said."""
    cfg = LibraConfig.model_validate(
        {
            "planner": {"type": "libra", "hardware": "8xH100", "model_spec": "qwen3-4b"},
            "training": {"grpo": {"minibatches": 1}},
            "rollout": {"engine": {"max_num_seqs": 32}},
        }
    )
    planner = LibraPlanner.from_config(cfg)
    planner.step(1)
    rows = [
        {
            "iteration": 1,
            "prompt_id": f"p{g}",
            "group_id": f"g{g}",
            "prompt_ids": [1] * 40,
            "loss_mask": [1] * 50 + [0] * 20 + [1] * 30,
            "tool_events": [{"turn": 0, "payload_tokens": 20}],
            "tool_latency_s": 0.5,
        }
        for g in range(4)
        for _ in range(8)
    ]
    planner.observe(pa.Table.from_pylist(rows), 8, {})
    assert planner.window.pooled().minibatches == 1
    assert planner.settings().max_num_seqs == 32  # the engines' cap, not the search's default 256


def test_a_kl_penalty_prices_the_reference_forward() -> None:
    """kl_coef > 0 runs a reference model's forward in every update; the planner never priced it."""
    base = {"type": "libra", "hardware": "8xH100", "model_spec": "qwen3-4b"}
    plain = LibraPlanner.from_config(LibraConfig.model_validate({"planner": base}))
    with_kl = LibraPlanner.from_config(
        LibraConfig.model_validate({"planner": base, "training": {"grpo": {"kl_coef": 0.01}}})
    )
    plan, _ = plain.step(1)
    w = workload_preset("math-short", 0)
    t_plain = evaluate_plan(plan, plain.model, plain.cluster.hardware, w, plain.settings()).t_train_s
    t_kl = evaluate_plan(plan, plain.model, plain.cluster.hardware, w, with_kl.settings()).t_train_s
    assert with_kl.settings().ref_forward and not plain.settings().ref_forward
    assert t_kl > 1.1 * t_plain


def test_a_decision_record_is_strict_json() -> None:
    """A running plan that no longer fits the window prices at inf; the decisions log got
    `Infinity`, which jq and browsers refuse."""
    cluster, model = parse_cluster("8xH100"), get_model("qwen3-4b")
    w = workload_preset("math-short", 0)
    plan = search_plans(model, cluster.hardware, 8, w)[0]
    unfit = replace(plan, t_iter_s=math.inf)
    decision = ReplanPolicy().decide(1, unfit, unfit, plan, w)
    record = decision.as_record()
    assert record["current_t_iter_s"] is None and record["saving_per_iter_s"] is None
    json.loads(json.dumps(record, allow_nan=False))


def test_a_keep_keeps_the_running_instances() -> None:
    """Re-pricing keeps the degrees but may re-choose the count of each; after a keep the running
    plan (what the pool deploys) must still be the instances that run."""
    w = workload_preset("swe-longtail", 0)
    never = ReplanPolicy(min_gain_fraction=0.9, expected_iterations=50, move_cost_s=1e9)
    planner = LibraPlanner(
        parse_cluster("48xA800"), get_model("qwen3-14b"), w, never, 1, 1, 0, mixed_margin=0.05
    )
    plan, _ = planner.step(1)
    assert len(plan.instance_tps) > 1  # a mixed layout, whose counts the re-pricing can re-choose
    planner.observe(w.scaled(2.0), 16, {})
    plan2, decision = planner.step(2)
    assert decision is not None and decision.action == "keep"
    assert plan2.instance_tps == plan.instance_tps


def test_service_for_the_local_tiny_model() -> None:
    planner = LibraPlanner.from_config(LibraConfig.model_validate({"planner": {"type": "libra"}}))
    plan, _ = planner.step(0)
    assert plan.colocated and plan.t_iter_s > 0


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_the_configured_reprefill_fraction_prices_the_prior_and_the_measured_trajectories(
    fraction: float,
) -> None:
    import pyarrow as pa

    from tests.planner.test_planner_workload import ONE_CALL_ROW  # 10 prompt, 3 payload tokens

    cfg = LibraConfig.model_validate(
        {
            "planner": {
                "type": "libra",
                "hardware": "8xH100",
                "model_spec": "qwen3-4b",
                "initial_workload": "math-short",
                "reprefill_fraction": fraction,
            }
        }
    )
    planner = LibraPlanner.from_config(cfg)
    assert planner._prior.reprefill_fraction == fraction
    planner.observe(pa.Table.from_pylist([ONE_CALL_ROW]), group_size=1, measured_s={})
    pooled = planner.window.pooled()
    # prompt + payload + fraction x the 14-token context at the call
    assert pooled.prefill_tokens.tolist() == [10 + 3 + fraction * 14]


def test_the_running_plan_takes_the_memory_settings_its_groups_need() -> None:
    """Trajectories grow 4% an iteration. Re-priced on the window, the running plan's GPU groups may
    need another ZeRO stage, recompute or micro-batch to fit: switching moves no worker, so the
    service adopts them (before 2026-12-06 it kept the layout it was chosen with, which here stopped
    fitting in memory, and its frozen price fed the online correction)."""
    from libra_core.planner.train_cost import TrainShape, estimate_train

    cluster, base = parse_cluster("16xH100"), workload_preset("math-short")
    planner = LibraPlanner(
        cluster, M, base, ReplanPolicy(), window_iterations=8, replan_every=1, staleness=1,
        audit_window=0, mixed_margin=0.05, total_iterations=100,
    )  # fmt: skip
    settings = SearchSettings(staleness=1, mixed_margin=0.05)
    layouts = []
    for it in range(1, 6):
        plan, _ = planner.step(it)
        layouts.append(plan.train.layout)
        actual = base.scaled(1.04**it)
        priced = evaluate_plan(plan, M, cluster.hardware, actual, settings)
        planner.observe(actual, 8, {"rollout": priced.t_rollout_s, "update": priced.t_train_s})
    assert len({(x.tp, x.pp, x.dp) for x in layouts}) == 1  # the GPU groups stayed
    assert len(set(layouts)) > 1  # their memory settings followed the workload
    shape = TrainShape.from_workload(planner.window.pooled())
    fits = estimate_train(M, cluster.hardware, planner.plan.train.layout, shape)
    assert fits.feasible, planner.plan.train.layout.label()


def test_a_proposal_with_the_same_gpu_groups_applies_on_any_saving() -> None:
    """Only recompute differs: no worker moves, so no move cost and no hysteresis (before
    2026-12-06 the full training layout was compared and such a proposal was priced as a move)."""
    from dataclasses import replace

    current = search_plans(M, HW, 16, workload_preset("math-short"), SET)[0]
    layout = current.train.layout
    proposed = replace(
        current,
        train=replace(current.train, layout=replace(layout, recompute=not layout.recompute)),
        t_iter_s=current.t_iter_s * 0.99,  # a 1% saving, below the 5% hysteresis
    )
    assert proposed.same_gpu_groups(current) and not proposed.same_resources(current)
    decision = ReplanPolicy().decide(10, current, current, proposed, workload_preset("math-short"))
    assert decision.action == "apply" and decision.move_cost_s == 0.0, decision


def test_scaling_a_workload_keeps_the_prompt_in_each_calls_context() -> None:
    """`scaled` multiplied the whole context at each tool return, prompt included: at x0.25 a
    call's context came out smaller than the prompt before it."""
    from libra_core.planner.workload import Turns, workload_from_turns

    # prompt 100, 30 generated, a call returning 8 tokens, then 500 generated
    def one(gen: tuple[int, int], payload: int) -> float:
        w = workload_from_turns("t", Turns([100], [list(gen)], [[payload, 0]], [1.5]), 1, 1)
        return float(w.reprefill_ctx_tokens[0])

    base = workload_from_turns("t", Turns([100], [[30, 500]], [[8, 0]], [1.5]), 1, 1)
    for x in (0.25, 2.0):
        assert base.scaled(x).reprefill_ctx_tokens[0] == pytest.approx(
            one((round(30 * x), round(500 * x)), round(8 * x)), abs=1.0
        )


def test_a_window_the_running_plan_cannot_hold_is_replanned_before_it_is_due() -> None:
    """Until 2026-12-07 the planner replanned only every `replan_every` iterations: a workload that
    outgrew the training layout in between ran on a plan priced at inf (memory) until then."""
    prior = workload_preset("swe-longtail")
    cluster = parse_cluster("48xA800")
    planner = LibraPlanner(cluster, M, prior, ReplanPolicy(), 1, 100, 1)
    plan, _ = planner.step(0)
    planner.observe(prior, group_size=16, measured_s={})
    assert planner.step(1) == (plan, None)  # it fits, and no replan is due
    grown = prior.scaled(4.0)
    assert not math.isfinite(evaluate_plan(plan, M, HW, grown, planner.settings()).t_iter_s)
    planner.audit.moved(1, plan, plan, 0.1)  # a move awaiting its audit does not hold this one back
    planner.observe(grown, group_size=16, measured_s={})
    plan2, decision = planner.step(2)
    assert decision is not None and decision.action == "apply"
    assert decision.reason.startswith("replanned before it was due: the current plan cannot run")
    assert plan2.train_gpus > plan.train_gpus
    assert math.isfinite(evaluate_plan(plan2, M, HW, grown, planner.settings()).t_iter_s)
    assert not planner.audit.pending  # dropped unjudged; the forced move itself is not audited
    planner.observe(grown, group_size=16, measured_s={})
    assert planner.step(3) == (plan2, None)  # the new plan holds it: no replan until one is due


@pytest.mark.parametrize("due", [False, True])
def test_a_window_no_plan_holds_keeps_the_run_going(due: bool, caplog: pytest.LogCaptureFixture) -> None:
    # Due or not, with a move awaiting its audit: the plan stays, the audit too (nothing moved).
    prior = workload_preset("swe-longtail")
    planner = LibraPlanner(parse_cluster("8xA800"), M, prior, ReplanPolicy(), 1, 2, 1, audit_window=3)
    plan, _ = planner.step(0)
    huge = prior.scaled(16.0)
    assert not math.isfinite(evaluate_plan(plan, M, HW, huge, planner.settings()).t_iter_s)
    planner.audit.moved(0, plan, plan, 0.1)
    planner.observe(huge, group_size=16, measured_s={})
    iteration = 2 if due else 1
    with caplog.at_level("WARNING", logger="libra_core.planner.service"):
        assert planner.step(iteration) == (plan, None)  # the plan stage goes on with the plan it has
    assert f"iteration {iteration}: no replan, the running plan stays: no feasible plan" in caplog.text
    assert planner.audit.pending


def test_replan_every_zero_never_replans_even_a_plan_that_cannot_run() -> None:
    prior = workload_preset("swe-longtail")
    planner = LibraPlanner(parse_cluster("48xA800"), M, prior, ReplanPolicy(), 1, 0, 1)
    plan, _ = planner.step(0)
    planner.observe(prior.scaled(4.0), group_size=16, measured_s={})
    assert planner.step(1) == (plan, None)  # `planner.replan_every: 0` means never


def test_a_revert_to_a_plan_that_cannot_run_the_window_keeps_the_move() -> None:
    # A move A -> B, measured slower after it: the audit says revert, but A no longer holds the
    # window. Until 2026-12-07 the planner went back to A (priced at inf) until the next replan.
    prior = workload_preset("swe-longtail")
    grown = prior.scaled(4.0)
    planner = LibraPlanner(parse_cluster("48xA800"), M, prior, ReplanPolicy(), 1, 100, 1, audit_window=1)
    a, _ = planner.step(0)
    b = search_plans(M, HW, 48, grown, planner.settings())[0]
    assert not math.isfinite(evaluate_plan(a, M, HW, grown, planner.settings()).t_iter_s)
    assert math.isfinite(evaluate_plan(b, M, HW, grown, planner.settings()).t_iter_s)
    planner._plan = b
    planner.audit.moved(2, a, b, 0.1)  # applied before iteration 2
    planner.observe(prior, 16, {}, iteration=0, period_s=100.0)  # before the move: fast
    planner.observe(grown, 16, {}, iteration=3, period_s=10000.0)  # after it: much slower
    plan, decision = planner.step(4)
    assert plan is b and decision is not None and decision.action == "confirm"
    assert decision.reason.endswith("; kept: the plan before the move cannot run the window (memory)")
    assert not planner.audit.refuses(b, 5) and planner.audit.extra_margin(5) == 0.0
