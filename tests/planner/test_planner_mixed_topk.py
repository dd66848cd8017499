"""The heterogeneous search refines the best splits whose layout is mixed.

It returns mixed layouts only (the one-degree ones come from the one-bucket search), so refining the
`top_k` best splits by the DP's price and then dropping their one-degree layouts left it with no
mixed plan whenever the DP's best splits were all one degree: the plan depended on `top_k`.
"""

from __future__ import annotations

from libra_core.planner import get_model, parse_cluster, workload_preset
from libra_core.planner.search import SearchSettings, bucket_count, plan_rank, search_plans


def _plans(top_k: int) -> list:
    cluster = parse_cluster("24xH100")
    settings = SearchSettings(top_k=top_k, mixed_margin=0.05)
    workload = workload_preset("swe-longtail")
    return search_plans(get_model("qwen3-4b"), cluster.hardware, 24, workload, settings)


def test_the_best_plan_does_not_depend_on_how_many_splits_are_refined() -> None:
    small, large = _plans(4), _plans(48)
    assert small[0].same_resources(large[0])
    assert plan_rank(small[0]) == plan_rank(large[0])
    # Here the DP's eight best splits are one degree; the best mixed split's layout (11xTP1 1xTP8
    # at 5 training GPUs) is priced faster than every one-degree plan, margin included.
    assert bucket_count(small[0].rollout) > 1
    assert small[0].train_gpus == 5


def test_the_heterogeneous_search_prices_top_k_mixed_splits() -> None:
    mixed = [p for p in _plans(4) if bucket_count(p.rollout) > 1]
    assert len(mixed) == 4
    assert len({p.train_gpus for p in mixed}) == 4
