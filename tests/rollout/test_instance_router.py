"""The rollout router: bucket -> instance mapping, least-loaded choice, migration accounting."""

from __future__ import annotations

import pytest

from libra_core.rollout.router import InstanceRouter, bucket_instances
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn


@pytest.mark.parametrize(
    ("buckets", "instances", "expected"),
    [
        (3, 1, [[0], [0], [0]]),
        (3, 2, [[0], [0], [1]]),
        (2, 2, [[0], [1]]),
        (2, 3, [[0], [1, 2]]),
        (3, 7, [[0, 1], [2, 3], [4, 5, 6]]),
    ],
)
def test_bucket_instances(buckets: int, instances: int, expected: list[list[int]]) -> None:
    groups = bucket_instances(buckets, instances)
    assert groups == expected
    assert sorted({i for g in groups for i in g}) == list(range(instances))


class ScriptedScheduler:
    """Admits to bucket 0 and moves to the bucket named by the tool payload size (test double)."""

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.versions: list[int] = []

    def admit(self, request: SchedRequest) -> int:
        return 0

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        return Move(ret.payload_tokens) if ret.payload_tokens else None

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.finished.append(trajectory.request_id)

    def on_policy_version(self, version: int) -> None:
        self.versions.append(version)


def _ret(bucket: int, context: int, gen: int = 5) -> ToolReturn:
    return ToolReturn(0, gen, "calculator", bucket, "success", context)


def test_router_least_loaded_and_migrations() -> None:
    sched = ScriptedScheduler()
    router = InstanceRouter(sched, num_buckets=3, num_instances=4)  # groups [[0], [1], [2, 3]]
    reqs = [SchedRequest(f"r{i}", "p", 10, 1) for i in range(3)]
    assert [router.admit(r) for r in reqs] == [0, 0, 0]
    # r0 moves to bucket 2: least-loaded of instances 2 and 3 is 2 (tie -> first)
    assert router.after_tool(reqs[0], _ret(2, context=40), 0) == 2
    # r1 moves to bucket 2 too: instance 2 now has one in flight, so 3
    assert router.after_tool(reqs[1], _ret(2, context=30), 0) == 3
    # r2 stays (payload 0 -> no move)
    assert router.after_tool(reqs[2], _ret(0, context=25), 0) == 0
    # r0 asks for bucket 2 again while already there: a move, but not a migration
    assert router.after_tool(reqs[0], _ret(2, context=60), 2) == 2
    assert router.in_flight == [1, 0, 1, 1]
    router.finish(FinishedTrajectory("r0", "p", 10, 1, 0, (Turn(5, None, 0, None),)), 2, last_gen_tokens=7)
    stats = router.stats()
    assert stats.decisions == 3 + 4
    assert stats.moves == 3
    assert stats.migrations == 2
    assert stats.migrated_tokens == (40 - 2) + (30 - 2)  # the contexts before each 2-token payload
    # generated tokens are charged to the instance that decoded them
    assert stats.tokens_by_instance == (5 + 5 + 5, 0, 5 + 7, 0)
    assert router.in_flight == [1, 0, 0, 1]
    assert sched.finished == ["r0"]


def test_router_rejects_unknown_bucket() -> None:
    router = InstanceRouter(ScriptedScheduler(), num_buckets=2, num_instances=2)
    req = SchedRequest("r", "p", 10, 1)
    router.admit(req)
    with pytest.raises(AssertionError, match="bucket 5 of 2"):
        router.after_tool(req, _ret(5, context=20), 0)


def test_router_class_accuracy_counts_tokens_decoded_in_the_right_bucket() -> None:
    # bounds (20, 100): sizes <= 20 belong in bucket 0, <= 100 in bucket 1, above in bucket 2
    router = InstanceRouter(ScriptedScheduler(), num_buckets=3, num_instances=3, bounds=(20, 100))
    short, long = SchedRequest("s", "p", 10, 1), SchedRequest("l", "p", 10, 1)
    router.admit(short)
    router.admit(long)
    # short: 5 tokens in bucket 0, no move, 3 more; size 10 + 5 + 2 + 3 = 20 -> bucket 0: all right
    router.after_tool(short, ToolReturn(0, 5, "calculator", 0, "success", 17), 0)
    router.finish(
        FinishedTrajectory("s", "p", 10, 1, 0, (Turn(5, "calculator", 2, "success"), Turn(3, None, 0, None))),
        0,
        last_gen_tokens=3,
    )
    assert router.stats().class_accuracy == 1.0
    # long: 6 tokens in bucket 0, then moved to bucket 2 and 50 more; size 10 + 6 + 60 + 50 = 126 ->
    # bucket 2, so only its last 50 tokens were decoded in the right bucket
    router.after_tool(long, ToolReturn(0, 6, "calculator", 2, "success", 76), 0)
    router.finish(
        FinishedTrajectory(
            "l", "p", 10, 1, 0, (Turn(6, "calculator", 60, "success"), Turn(50, None, 0, None))
        ),
        2,
        last_gen_tokens=50,
    )
    assert router.stats().class_accuracy == pytest.approx((5 + 3 + 50) / (5 + 3 + 6 + 50))
    # the move re-prefilled long's context before the returned payload (76 - 2, as its ToolReturn
    # says); the finished trajectories processed 20 + 126 tokens (the trace evaluator's ratio)
    assert router.stats().migration_token_ratio == pytest.approx((76 - 2) / (20 + 126))


def test_router_without_bounds_reports_no_class_accuracy() -> None:
    router = InstanceRouter(ScriptedScheduler(), num_buckets=2, num_instances=1)
    req = SchedRequest("r", "p", 10, 1)
    router.admit(req)
    assert router.stats().migration_token_ratio is None  # nothing finished yet
    router.finish(FinishedTrajectory("r", "p", 10, 1, 0, (Turn(4, None, 0, None),)), 0, last_gen_tokens=4)
    assert router.stats().class_accuracy is None
    assert router.stats().migration_token_ratio == 0.0  # measured without bounds too
