"""The synthetic generator: seeded, drifting, long-tailed, and causal only as far as documented."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

from libra_core.traces.schema import validate_trace
from libra_core.traces.synthetic import (
    PRESETS,
    TIMEOUT_S,
    SyntheticTraceConfig,
    synthetic_trace,
    synthetic_trajectories,
)

SMALL = SyntheticTraceConfig(num_iterations=10, prompts_per_iteration=16, group_size=8, prompt_pool=40)


def remaining_after_first_return(trajs: list, status: str) -> float:
    vals = [
        sum(u.gen_tokens + u.payload_tokens for u in t.turns[1:])
        for t in trajs
        if len(t.turns) > 1 and t.turns[0].status == status
    ]
    return statistics.mean(vals)


def test_same_seed_same_trace() -> None:
    a = synthetic_trace(random.Random(1), SMALL)
    assert a.equals(synthetic_trace(random.Random(1), SMALL))
    assert not a.equals(synthetic_trace(random.Random(2), SMALL))
    assert len(validate_trace(a)) == 10 * 16 * 8


def test_drift_lengthens_generations() -> None:
    trajs = synthetic_trajectories(random.Random(0), SMALL)
    first = statistics.mean(u.gen_tokens for t in trajs if t.iteration == 0 for u in t.turns[:-1])
    last = statistics.mean(u.gen_tokens for t in trajs if t.iteration == 9 for u in t.turns[:-1])
    assert 1.6 < last / first < 2.5  # drift 1.0 doubles the median by the last iteration
    no_drift = synthetic_trajectories(random.Random(0), replace(SMALL, drift=0.0))
    flat_last = statistics.mean(u.gen_tokens for t in no_drift if t.iteration == 9 for u in t.turns[:-1])
    assert flat_last / first < 1.3


def test_long_tail() -> None:
    sizes = sorted(t.size for t in synthetic_trajectories(random.Random(0), SMALL))
    median, p99 = sizes[len(sizes) // 2], sizes[int(0.99 * len(sizes))]
    assert p99 > 8 * median


def test_failures_predict_more_work_and_noise_weakens_it() -> None:
    clean = synthetic_trajectories(random.Random(0), SMALL)
    noisy = synthetic_trajectories(random.Random(0), replace(SMALL, observation_noise=1.0))
    clean_gap = remaining_after_first_return(clean, "failure") / remaining_after_first_return(
        clean, "success"
    )
    noisy_gap = remaining_after_first_return(noisy, "failure") / remaining_after_first_return(
        noisy, "success"
    )
    assert clean_gap > 1.1  # a failure causes a retry
    assert abs(noisy_gap - 1.0) < 0.15  # fully redrawn observations carry no signal
    assert clean_gap > noisy_gap


def test_fresh_preset_never_repeats_a_prompt() -> None:
    cfg = replace(PRESETS["fresh"], num_iterations=3, prompts_per_iteration=5, group_size=2)
    trajs = synthetic_trajectories(random.Random(0), cfg)
    per_prompt = {t.prompt_id: t.iteration for t in trajs}
    assert len(per_prompt) == 15


def test_every_call_gets_a_latency_by_its_tool_and_status() -> None:
    trajs = synthetic_trajectories(random.Random(0), SMALL)
    calls = [(u, x) for t in trajs for u, x in zip(t.turns, t.tool_latency_s or (None,), strict=False)]
    assert all(x is None for t in trajs for x in (t.tool_latency_s or (None,))[-1:])  # none on the answer
    timed = [(u, x) for u, x in calls if u.tool is not None]
    assert timed and all(x is not None and x > 0 for _, x in timed)
    assert all(x == TIMEOUT_S for u, x in timed if u.status == "timeout")

    def median_s(tool: str) -> float:
        return statistics.median(
            x for u, x in timed if u.tool == tool and u.status != "timeout" and u.payload_tokens < 1000
        )

    # medians near the tool's (0.5, 2, 5 s), in that order
    assert median_s("search") < median_s("python") < median_s("shell")
    assert 0.35 < median_s("search") < 0.7 and 3.5 < median_s("shell") < 7.0


def test_latencies_leave_the_token_draws_as_they_were() -> None:
    # The latency stream is separate: the same seed gives the same turns as a trace without them.
    a = synthetic_trajectories(random.Random(4), SMALL)
    b = synthetic_trajectories(random.Random(4), SMALL)
    assert [t.tool_latency_s for t in a] == [t.tool_latency_s for t in b]
    # The generator before latencies (at 8c7ec1d) drew, for seed 4: these tokens, turns and timeouts.
    assert sum(t.size for t in a) == 13_255_204
    assert (sum(len(t.turns) for t in a), sum(u.status == "timeout" for t in a for u in t.turns)) == (
        13_573,
        822,
    )
    assert validate_trace(synthetic_trace(random.Random(4), SMALL))[0].tool_latency_s == a[0].tool_latency_s
