"""`evaluate_plan` re-prices a plan as the search priced it: on the workload the search saw, a
one-bucket layout costs what the search said, so the online correction learns nothing from a run
that measures exactly the prediction, and a replan compares the proposal with an honest current."""

from __future__ import annotations

import pytest

from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanPolicy
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import SearchSettings, search_plans
from libra_core.planner.service import LibraPlanner
from libra_core.planner.specs import get_hardware, get_model, parse_cluster

A800 = get_hardware("A800")


@pytest.mark.parametrize("preset", ["arith-tiny", "search-medium", "swe-longtail"])
def test_a_one_bucket_layout_is_re_priced_as_the_search_priced_it(preset: str) -> None:
    # With the default mixed_margin the search prices one-degree layouts as one range; evaluate_plan
    # re-priced them by the DP's several ranges, 12-17% cheaper (only `promote` had the special case)
    model = get_model("qwen3-14b")
    w = workload_preset(preset, 0, num_samples=256)
    s = SearchSettings(staleness=1, mixed_margin=0.05, top_k=16)
    plans = search_plans(model, A800, 48, w, s)
    single = [p for p in plans if len(p.instance_tps) == 1]
    assert single
    for p in single:
        again = evaluate_plan(p, model, A800, w, s)
        assert again.t_rollout_s == pytest.approx(p.t_rollout_s, rel=1e-9), p.instance_tps
        assert again.t_iter_s == pytest.approx(p.t_iter_s, rel=1e-9)


def test_a_run_measuring_the_prediction_teaches_the_correction_nothing() -> None:
    cluster, model = parse_cluster("48xA800"), get_model("qwen3-14b")
    w = workload_preset("arith-tiny", 0)
    planner = LibraPlanner(
        cluster, model, w, ReplanPolicy(), window_iterations=1, replan_every=1, staleness=0, mixed_margin=0.05
    )
    plan, _ = planner.step(0)
    assert len(plan.instance_tps) == 1  # the case: a one-degree layout (was a factor of 1.135)
    planner.observe(w, 16, {"rollout": plan.t_rollout_s, "update": plan.t_train_s}, iteration=0)
    assert planner.corrections.factor("rollout") == pytest.approx(1.0, abs=1e-9)
    assert planner.corrections.factor("update") == pytest.approx(1.0, abs=1e-9)


def test_an_update_measuring_the_running_layouts_price_teaches_the_correction_nothing() -> None:
    # Shorter sequences than planned for: on the same TP/PP/DP groups a larger micro-batch prices
    # faster (evaluate_plan's choice), but the update ran on the plan's own layout, and measured
    # exactly its price; compared with the other layout's, the correction learned 1.09.
    from libra_core.planner.train_cost import TrainShape, estimate_train

    cluster, model = parse_cluster("16xA800"), get_model("qwen3-8b")
    w = workload_preset("math-short")
    policy = ReplanPolicy()
    planner = LibraPlanner(cluster, model, w, policy, window_iterations=1, replan_every=10, staleness=0)
    plan, _ = planner.step(1)
    shorter = w.scaled(0.5)
    ran = estimate_train(model, cluster.hardware, plan.train.layout, TrainShape.from_workload(shorter))
    other = evaluate_plan(plan, model, cluster.hardware, shorter, SearchSettings())
    assert other.t_train_s < ran.time_s * 0.95  # the case: the re-priced layout is another one
    planner.observe(shorter, w.group_size, {"update": ran.time_s})
    assert planner.corrections.factor("update") == pytest.approx(1.0, abs=1e-9)
