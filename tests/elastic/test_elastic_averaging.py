"""Exactness of the Elastic Hybrid Pool: K=2 core ranks (gloo) + 1 hybrid over the side channel equal a
static data-parallel run whose replica set follows the frozen per-step membership (float64, 1e-6)."""

from __future__ import annotations

import secrets
import socket
import time

import numpy as np
import pytest

from libra_core.elastic import toy
from libra_core.elastic.toy import ToyProblem, reference_params
from libra_core.pools.local import LocalPool

PROBLEM = ToyProblem()


def free_init_method() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


STATIC_3 = [(0, 1, 2)] * 6


def _start_core(pool: LocalPool, key: bytes | None, deadline_s: float = 20.0) -> tuple[str, int] | None:
    init = free_init_method()
    futures = [
        pool.submit(f"w{r}", toy.core_start, PROBLEM, r, 2, init, key=key, deadline_s=deadline_s)
        for r in (0, 1)
    ]
    return futures[0].result(timeout=60)


def _step(pool: LocalPool) -> dict:
    reports = [pool.submit(f"w{r}", toy.core_step) for r in (0, 1)]
    return [f.result(timeout=60) for f in reports][0]


def _wait_state(pool: LocalPool, worker: str, state: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := pool.run("w0", toy.core_states, timeout_s=10).get(worker)) != state:
        assert time.monotonic() < deadline, f"{worker} stuck in {got}, wanted {state}"
        time.sleep(0.05)


@pytest.mark.slow
def test_static_three_replica_ddp_equals_single_process_reference(pool3: LocalPool) -> None:
    init = free_init_method()
    futures = [pool3.submit(f"w{r}", toy.core_start, PROBLEM, r, 3, init) for r in range(3)]
    for f in futures:
        f.result(timeout=60)
    for _ in STATIC_3:
        reports = [pool3.submit(f"w{r}", toy.core_step) for r in range(3)]
        assert {f.result(timeout=60)["divisor"] for f in reports} == {3}
    params = [pool3.run(f"w{r}", toy.core_params) for r in range(3)]
    expected = reference_params(PROBLEM, STATIC_3)
    for p in params:
        np.testing.assert_allclose(p, expected, rtol=0, atol=1e-6)
    assert not np.allclose(expected, reference_params(PROBLEM, [(0, 1)] * 6), atol=1e-6)


@pytest.mark.slow
def test_hybrid_joins_at_step_3_leaves_at_step_5_and_matches_static_run(pool3: LocalPool) -> None:
    key = secrets.token_bytes(32)
    address = _start_core(pool3, key)
    assert address is not None
    reports = [_step(pool3)]  # step 0
    pool3.run("w0", toy.core_control, "join", "h0")  # snapshot taken at the end of step 1
    reports.append(_step(pool3))  # step 1
    hybrid = pool3.submit("w2", toy.hybrid_join, PROBLEM, "h0", address, key, shard=2)
    _wait_state(pool3, "h0", "warming")  # loaded before step 2's boundary -> active from step 3
    reports.append(_step(pool3))  # step 2: h0 replays (zero gradient, not counted)
    reports.append(_step(pool3))  # step 3: h0 active
    pool3.run("w0", toy.core_control, "leave", "h0")  # step 4's membership is frozen: leaves at 5
    reports.append(_step(pool3))  # step 4
    after_step_4 = pool3.run("w0", toy.core_params)
    reports.append(_step(pool3))  # step 5
    reports.append(_step(pool3))  # step 6
    result = hybrid.result(timeout=60)

    assert [r["divisor"] for r in reports] == [2, 2, 2, 3, 3, 2, 2]
    assert [list(r["included"]) for r in reports] == [[], [], [], ["h0"], ["h0"], [], []]
    assert [r["epoch"] for r in reports] == [0, 0, 0, 1, 1, 2, 2]
    assert result["snapshot_step"] == 2 and result["replayed_steps"] == [2]
    assert result["contributed_steps"] == [3, 4] and result["final_state"] == "rollout"
    np.testing.assert_allclose(result["params"], after_step_4, rtol=0, atol=1e-12)

    schedule = [(0, 1), (0, 1), (0, 1), (0, 1, 2), (0, 1, 2), (0, 1), (0, 1)]
    expected = reference_params(PROBLEM, schedule)
    for rank in ("w0", "w1"):
        np.testing.assert_allclose(pool3.run(rank, toy.core_params), expected, rtol=0, atol=1e-6)
    # The reference code's rule (divide by K while hybrids add gradients) gives a different model.
    wrong_divisor = reference_params(
        PROBLEM, [(0, 1), (0, 1), (0, 1), (0, 1, 2, 2), (0, 1, 2, 2), (0, 1), (0, 1)]
    )
    assert not np.allclose(expected, wrong_divisor, atol=1e-6)
    for rank in ("w0", "w1"):
        pool3.run(rank, toy.core_stop)


@pytest.mark.slow
def test_killed_hybrid_does_not_stop_the_core(pool3: LocalPool) -> None:
    key = secrets.token_bytes(32)
    address = _start_core(pool3, key, deadline_s=1.0)
    pool3.run("w0", toy.core_control, "join", "h0")
    reports = [_step(pool3)]  # step 0; snapshot taken at its end
    pool3.submit("w2", toy.hybrid_join, PROBLEM, "h0", address, key, shard=2, slow_steps={3: 60.0})
    _wait_state(pool3, "h0", "warming")
    reports += [_step(pool3), _step(pool3)]  # step 1 (replay), step 2 (active)
    assert [r["divisor"] for r in reports] == [2, 2, 3]
    pool3.kill("w2")  # h0 is computing step 3 (sleeping before its push)
    t0 = time.perf_counter()
    reports.append(_step(pool3))  # step 3 completes at the deadline without h0
    step3_s = time.perf_counter() - t0
    reports.append(_step(pool3))  # step 4 does not wait: h0 was evicted
    assert reports[3]["divisor"] == 2 and list(reports[3]["missing"]) == ["h0"]
    assert 0.9 < step3_s < 10.0
    assert reports[4]["divisor"] == 2 and reports[4]["hybrid_wait_s"] < 0.5
    assert pool3.run("w0", toy.core_states) == {"h0": "rollout"}
    expected = reference_params(PROBLEM, [(0, 1), (0, 1), (0, 1, 2), (0, 1), (0, 1)])
    np.testing.assert_allclose(pool3.run("w0", toy.core_params), expected, rtol=0, atol=1e-6)
