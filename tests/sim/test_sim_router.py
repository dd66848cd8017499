"""The simulated router: stickiness, work-conserving spill to longer buckets, queue draining."""

from __future__ import annotations

from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.specs import get_hardware, get_model
from libra_core.sim.instance import CostTables, Instance
from libra_core.sim.router import Router

COST = RolloutCostModel(get_model("qwen3-8b"), get_hardware("A800"), max_num_seqs=2)
TABLES = CostTables(COST, (1, 8))


def _instances() -> list[Instance]:
    return [
        Instance(0, 1, 0, TABLES, TABLES.kv_capacity[1]),
        Instance(1, 8, 1, TABLES, TABLES.kv_capacity[8]),
    ]


def test_full_bucket_spills_to_a_longer_bucket_with_room() -> None:
    short, long = _instances()
    router = Router([short, long], num_buckets=2, placement="least_load")
    assert router.choose(0, None, 1000) is short  # room in its own bucket: it stays there
    for k in range(2):  # max_num_seqs = 2: the short instance is now full
        short.join(0.0, f"t{k}", 100, 100, 50)
    assert router.choose(0, None, 1000) is long
    for k in range(2):
        long.join(0.0, f"u{k}", 100, 100, 50)
    assert router.choose(0, None, 1000) is None  # no room anywhere: the turn waits


def test_a_long_bucket_never_spills_down() -> None:
    short, long = _instances()
    router = Router([short, long], num_buckets=2, placement="least_load")
    for k in range(2):
        long.join(0.0, f"u{k}", 100, 100, 50)
    assert router.choose(1, None, 1000) is None  # the TP1 instance has room but serves shorter work


def test_freed_instances_drain_their_own_then_shorter_queues() -> None:
    short, long = _instances()
    router = Router([short, long], num_buckets=2, placement="least_load")
    router.queues[0].append("short-turn")
    router.queues[1].append("long-turn")
    assert [list(q) for q in router.drain_order(1)] == [["long-turn"], ["short-turn"]]
    assert [list(q) for q in router.drain_order(0)] == [["short-turn"]]


def test_a_turn_is_held_by_the_instance_that_served_it() -> None:
    short, long = _instances()
    router = Router([short, long], num_buckets=2, placement="least_load")
    assert router.holder(0, short) is short
    assert router.holder(0, long) is long  # a longer bucket serves short work too
    assert router.holder(1, short) is None  # promoted past it: the turn must move
    assert router.holder(0, None) is None  # a new trajectory has no holder
    long.active = False  # lent to training
    assert router.holder(0, long) is None
