"""A core step that fails (a non-finite reduced gradient) leaves the backend and the gateway
consistent: the core raises, the step can be taken again, and every hybrid's loop ends with the
reason; a core that stops answering cannot keep a hybrid asking for ever."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from libra_core.elastic.client import GatewayClient
from libra_core.elastic.replica import CoreReplica
from libra_core.elastic.toy import flat_params, reference_params
from libra_core.training.backends.ddp import DDPBackend
from tests.elastic.builders import KEY, PROBLEM, Core, Harness, hybrid_thread, wait_until

NAN_MESSAGE = "core step 0: the reduced gradient norm is nan"


def _nan_step(core: CoreReplica) -> None:
    with pytest.raises(FloatingPointError, match=NAN_MESSAGE):
        core.step(lambda m, s: PROBLEM.loss(m, 0, s) * float("nan"))


def test_a_failed_core_step_without_a_gateway_can_be_taken_again() -> None:
    # Until 2026-12-07 the retry raised "backward() called twice": the failed step kept its gradient
    # and the backend's pending backward (DDPBackend.step drops both).
    torch.set_num_threads(1)
    model = PROBLEM.model()
    backend = DDPBackend()
    backend.setup(model, PROBLEM.optimizer(model))
    core = CoreReplica(backend, grad_clip=PROBLEM.grad_clip)
    _nan_step(core)
    assert all(p.grad is None for p in model.parameters())
    report = core.step(lambda m, s: PROBLEM.loss(m, 0, s))
    assert (report.step, report.divisor, core.step_index, core.version) == (0, 1, 1, 1)
    np.testing.assert_allclose(flat_params(model), reference_params(PROBLEM, [(0,)]), rtol=0, atol=1e-9)


def test_a_failed_core_step_ends_the_hybrids_join_with_the_reason_and_reopens_the_step() -> None:
    with Harness() as harness:  # h0 is warming, waiting for update 0
        _nan_step(harness.core)
        reply, update = harness.client.pull(0, wait_s=0.5)
        assert update is None and reply["ended"] and not reply.get("retry"), reply
        assert NAN_MESSAGE in reply["reason"] and "h0 failed: core step 0 failed" in reply["reason"]
        assert harness.gateway.states() == {"h0": "rollout"}
        report = harness.core_step()  # the same step again, on a finite batch, without the hybrid
        assert (report["step"], report["divisor"], report["missing"]) == (0, 1, ())
        expected = reference_params(PROBLEM, [(0,)])
        np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-9)


def test_an_active_hybrids_loop_ends_when_the_core_step_fails() -> None:
    core = Core(deadline_s=2.0)
    out: dict[str, Any] = {}
    try:
        core.gateway.request_join("h1")
        thread = hybrid_thread(core.gateway, "h1", out, pull_wait_s=0.2)
        core.step()  # step 0: the snapshot is taken at its boundary
        assert wait_until(lambda: core.gateway.states() == {"h1": "warming"}, timeout_s=5)
        included = False
        for _ in range(20):  # until h1 is active and its gradient is in a step
            if included := bool(core.step()["included"]):
                break
        assert included, "h1 never became active"
        step = core.replica.step_index
        assert wait_until(lambda: core.gateway._open.received, timeout_s=5)  # h1 pushed, now pulls
        with pytest.raises(FloatingPointError, match=f"core step {step}: the reduced gradient norm is nan"):
            core.replica.step(lambda m, s: PROBLEM.loss(m, 0, s) * float("nan"))
        thread.join(timeout=5)
        assert not thread.is_alive(), "the hybrid kept pulling after the core step failed"
        final = out["report"].final_state
        assert final.startswith("ended: ") and f"core step {step} failed: FloatingPointError" in final
        assert core.step()["divisor"] == 1  # the core goes on alone
    finally:
        core.close()


def test_a_hybrid_stops_asking_for_an_update_that_never_comes() -> None:
    core = Core(deadline_s=0.5)
    out: dict[str, Any] = {}
    try:
        core.gateway.request_join("h1")
        thread = hybrid_thread(core.gateway, "h1", out, pull_wait_s=0.05, max_wait_s=0.5)
        core.step()  # step 0 publishes; step 1 never comes (a core hung without failing)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the hybrid kept pulling for ever"
        assert isinstance(out.get("error"), TimeoutError), out
        assert "update 1 not published within max_wait_s=0.5 s" in str(out["error"])
    finally:
        core.close()


def test_a_snapshot_that_never_comes_is_not_asked_for_again_for_ever() -> None:
    core = Core(deadline_s=0.5)
    client = GatewayClient(core.gateway.address, KEY, "h1", max_wait_s=0.3)
    try:
        core.gateway.request_join("h1")  # the core never reaches a step boundary: no snapshot
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no snapshot for h1 within max_wait_s=0.3 s"):
            client.snapshot(wait_s=0.05)
        assert time.monotonic() - t0 < 5
    finally:
        client.close()
        core.close()


def test_an_update_published_while_no_hybrid_needed_it_is_expired_not_retried() -> None:
    # With no hybrid the gateway keeps no copy of an update; a connection that asks for one anyway
    # (it never fetched a snapshot) was answered `retry` for ever: the update never comes.
    core = Core(deadline_s=0.5)
    client = GatewayClient(core.gateway.address, KEY, "h1", max_wait_s=5.0)
    try:
        core.step()  # step 0, published with nobody to pull it
        t0 = time.monotonic()
        reply, update = client.pull(0, wait_s=2.0)
        assert update is None and reply == {**reply, "ok": False, "reason": "expired"}, reply
        assert not reply.get("retry") and time.monotonic() - t0 < 1.5
    finally:
        client.close()
        core.close()
