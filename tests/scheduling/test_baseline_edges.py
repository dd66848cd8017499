"""Edge cases of the baseline schedulers and `Estimate.tail_bucket` (mutation-audit gaps)."""

from __future__ import annotations

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, SchedRequest, Turn
from libra_core.scheduling.estimate import Estimate, NodeStats
from libra_core.scheduling.registry import build_scheduler


def _finish(sched, rid: str, prompt_tokens: int, size: int) -> None:
    req = SchedRequest(rid, "p", prompt_tokens, 0)
    sched.admit(req)
    turn = Turn(gen_tokens=size - prompt_tokens, tool=None, payload_tokens=0, status=None)
    sched.on_finish(FinishedTrajectory(rid, "p", prompt_tokens, 0, 0, (turn,)))


def test_input_length_window_forgets_old_sizes() -> None:
    # Regression: the per-bin window `deque(maxlen=256)` made unbounded kept the 10000-token past.
    sched = build_scheduler(SchedulerConfig(type="input_length", buckets=(2000, 8000)))
    for i in range(256):
        _finish(sched, f"big{i}", 100, 10000)
    for i in range(256):
        _finish(sched, f"small{i}", 100, 500)
    assert sched.admit(SchedRequest("next", "p", 100, 0)) == 0


def test_least_load_first_admission_breaks_tie_to_bucket_zero() -> None:
    # Regression: least_load's tie-break (load, bucket) changed so an idle tie did not go to bucket 0.
    sched = build_scheduler(SchedulerConfig(type="least_load", buckets=(2000, 8000)))
    assert sched.admit(SchedRequest("r0", "p", 100, 0)) == 0
    assert sched.admit(SchedRequest("r1", "p", 100, 0)) == 1


def test_tail_bucket_takes_bucket_at_exact_quantile() -> None:
    # Regression: `cdf >= quantile - 1e-12` made `cdf > quantile`, skipping a bucket whose cdf equals q.
    stats = NodeStats.build([100, 1000], [50, 500], [0, 0], 0, 10.0)
    est = Estimate.mix([(2.0, stats, 0)], 2.0, 1.0)
    assert est.tail_bucket((200, 2000), 0, 0.5) == 0
