"""The hybrid side channel: authentication before any parsing, and payload checks on step, version,
epoch and membership. The core step always completes, with the divisor counting accepted payloads."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Coordinator
from libra_core.elastic.replica import CoreReplica
from libra_core.elastic.toy import ToyProblem, flat_params, reference_params
from libra_core.training.backends.ddp import DDPBackend
from libra_core.training.backends.flat import flat_grad, set_flat_grad, trainable

KEY = secrets.token_bytes(32)
PROBLEM = ToyProblem()


# ---------------------------------------------------------------------------- wire format


def test_frame_round_trip_and_tamper_detection() -> None:
    body = wire.tensors_to_bytes({"grad": torch.arange(4, dtype=torch.float64)})
    frame = wire.encode_frame(KEY, {"kind": "push", "step": 3}, body)
    header, got = wire.decode_frame(KEY, frame, max_bytes=1 << 20)
    assert header == {"kind": "push", "step": 3}
    assert torch.equal(wire.bytes_to_tensors(got)["grad"], torch.arange(4, dtype=torch.float64))
    tampered = bytearray(frame)
    tampered[-1] ^= 1
    with pytest.raises(wire.AuthError):
        wire.decode_frame(KEY, bytes(tampered), max_bytes=1 << 20)
    with pytest.raises(wire.FrameError, match="too large"):
        wire.decode_frame(KEY, frame, max_bytes=8)


def test_wrong_key_is_rejected_before_any_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = wire.encode_frame(secrets.token_bytes(32), {"kind": "push"}, b"\x00" * 64)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed an unauthenticated frame")

    monkeypatch.setattr(wire.json, "loads", forbidden)
    monkeypatch.setattr(wire, "bytes_to_tensors", forbidden)
    with pytest.raises(wire.AuthError):
        wire.decode_frame(KEY, frame, max_bytes=1 << 20)


# ---------------------------------------------------------------------------- gateway + core (K=1)


class Harness:
    """Core rank 0 of a one-replica core (shard 0) with its gateway, in this process."""

    def __init__(self, deadline_s: float) -> None:
        torch.set_num_threads(1)
        model = PROBLEM.model()
        self.backend = DDPBackend()
        self.backend.setup(model, PROBLEM.optimizer(model))
        numel = sum(p.numel() for p in model.parameters())
        self.gateway = Gateway(KEY, Coordinator(1), numel=numel, dtype=torch.float64, deadline_s=deadline_s)
        self.gateway.request_join("h0")
        self.core = CoreReplica(self.backend, gateway=self.gateway, grad_clip=PROBLEM.grad_clip)
        self.client = GatewayClient(self.gateway.address, KEY, "h0")
        # A hand-driven hybrid on shard 1: load the snapshot taken at start, then replay update 0.
        self.h_model = PROBLEM.model()
        self.h_opt = PROBLEM.optimizer(self.h_model)
        header, tensors = self.client.snapshot()
        from libra_core.elastic.replica import load_state_tensors

        load_state_tensors(self.h_model, self.h_opt, tensors)
        assert header["step"] == 0
        self.client.loaded(aligned_through=-1)

    def core_step(self) -> dict:
        return self.core.step(lambda m, s: PROBLEM.loss(m, 0, s)).to_dict()

    def pull_and_apply(self, step: int) -> dict:
        reply, update = self.client.pull(step)
        assert reply["ok"], reply
        set_flat_grad(trainable(self.h_model), update)
        self.h_opt.step()
        self.h_opt.zero_grad(set_to_none=True)
        return reply

    def hybrid_grad(self, step: int) -> torch.Tensor:
        self.h_opt.zero_grad(set_to_none=True)
        PROBLEM.loss(self.h_model, 1, step).backward()
        return flat_grad(trainable(self.h_model))

    def close(self) -> None:
        self.client.close()
        self.gateway.close()


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(deadline_s=0.5)
    try:
        yield h
    finally:
        h.close()


def _in_background(fn: object) -> threading.Thread:
    t = threading.Thread(target=fn)  # type: ignore[arg-type]
    t.start()
    return t


def test_valid_payload_is_counted_and_duplicates_and_late_ones_are_not(harness: Harness) -> None:
    assert harness.core_step()["divisor"] == 1  # step 0: h0 is warming (not counted)
    reply = harness.pull_and_apply(0)
    assert reply["active_next"] and reply["next_step"] == 1 and reply["next_epoch"] == 1
    grad = harness.hybrid_grad(1)
    assert harness.client.push(grad, step=1, version=1, epoch=1) == {
        "ok": True,
        "kind": "push_reply",
        "worker": "h0",
    }
    dup = harness.client.push(grad, step=1, version=1, epoch=1)
    assert not dup["ok"] and "duplicate" in dup["reason"]
    report = harness.core_step()  # step 1 does not wait: every active member has pushed
    assert report["divisor"] == 2 and list(report["included"]) == ["h0"] and report["hybrid_wait_s"] < 0.4
    late = harness.client.push(grad, step=1, version=1, epoch=1)
    assert not late["ok"] and "not open" in late["reason"]
    expected = reference_params(PROBLEM, [(0,), (0, 1)])
    np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("step", 2, "step 2 is not open"), ("version", 0, "version 0 != 1"), ("epoch", 0, "epoch 0 != 1")],
)
def test_mismatched_payload_is_rejected_and_the_core_step_completes(
    harness: Harness, field: str, value: int, reason: str
) -> None:
    harness.core_step()
    harness.pull_and_apply(0)
    fields = {"step": 1, "version": 1, "epoch": 1, field: value}
    reply = harness.client.push(harness.hybrid_grad(1), **fields)
    assert not reply["ok"] and reason in reply["reason"]
    report = harness.core_step()  # waits for the deadline, then completes without h0
    assert report["divisor"] == 1 and list(report["missing"]) == ["h0"]
    assert any(reason in r for _, r in report["rejected"])
    assert harness.gateway.states() == {"h0": "rollout"}
    expected = reference_params(PROBLEM, [(0,), (0,)])
    np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)


def test_bad_key_is_dropped_and_the_core_step_completes(harness: Harness) -> None:
    harness.core_step()
    harness.pull_and_apply(0)
    forged = wire.encode_frame(
        secrets.token_bytes(32),
        {"kind": "push", "worker": "h0", "step": 1, "version": 1, "epoch": 1},
        wire.tensors_to_bytes({"grad": harness.hybrid_grad(1)}),
    )
    with socket.create_connection(harness.gateway.address, timeout=5) as sock:
        sock.sendall(forged)
        assert sock.recv(1) == b"", "the gateway closes the connection without replying"
    report = harness.core_step()
    assert report["divisor"] == 1 and list(report["missing"]) == ["h0"]
    assert harness.gateway.unauthenticated == 1
    assert (
        "<unauthenticated>",
        "side-channel frame failed HMAC verification (wrong key or tampered bytes)",
    ) in [tuple(r) for r in report["rejected"]]


def test_warming_hybrid_payload_is_not_counted(harness: Harness) -> None:
    # Before its activation boundary h0 is not a member: a real gradient from it must be refused.
    reply = harness.client.push(harness.hybrid_grad(0), step=0, version=0, epoch=0)
    assert not reply["ok"] and "not an active member" in reply["reason"]
    assert harness.core_step()["divisor"] == 1
    np.testing.assert_allclose(
        flat_params(harness.backend.model), reference_params(PROBLEM, [(0,)]), rtol=0, atol=1e-6
    )


def test_non_finite_payload_is_rejected_and_the_core_stays_finite(harness: Harness) -> None:
    # One NaN passes clipping (its norm is NaN) and would poison the weights and Adam's state for good.
    harness.core_step()
    harness.pull_and_apply(0)
    grad = harness.hybrid_grad(1)
    grad[3] = float("nan")
    reply = harness.client.push(grad, step=1, version=1, epoch=1)
    assert not reply["ok"] and reply["reason"] == "payload 'grad' holds non-finite values"
    report = harness.core_step()
    assert report["divisor"] == 1 and list(report["missing"]) == ["h0"]
    expected = reference_params(PROBLEM, [(0,), (0,)])
    np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)


def test_a_late_join_is_served_a_fresh_snapshot_not_a_stale_one() -> None:
    # A join whose snapshot was left stored from long before: the updates after it have left the
    # log, so serving it would fail the join as "expired" on its first pull.
    torch.set_num_threads(1)
    model = PROBLEM.model()
    backend = DDPBackend()
    backend.setup(model, PROBLEM.optimizer(model))
    numel = sum(p.numel() for p in model.parameters())
    gateway = Gateway(
        KEY, Coordinator(1), numel=numel, dtype=torch.float64, deadline_s=0.5, update_log_steps=8
    )
    client = GatewayClient(gateway.address, KEY, "h1")
    try:
        gateway.request_join("h0")  # the core snapshots step 0 for it; then the join is cancelled
        core = CoreReplica(backend, gateway=gateway, grad_clip=PROBLEM.grad_clip)
        gateway.cancel("h0")
        for _ in range(20):
            core.step(lambda m, s: PROBLEM.loss(m, 0, s))
        gateway.request_join("h1")
        assert gateway.wants_snapshot()  # step 0's snapshot is older than the log
        with pytest.raises(RuntimeError, match="no fresh snapshot within the wait"):
            client.snapshot(wait_s=0.2)  # the stale one is not served
        core.step(lambda m, s: PROBLEM.loss(m, 0, s))  # the core stores a fresh one at the step's end
        header, _ = client.snapshot(wait_s=5)
        assert header["step"] == 21 and gateway.states()["h1"] == "loading"
        client.loaded(aligned_through=20)
        core.step(lambda m, s: PROBLEM.loss(m, 0, s))
        reply, _ = client.pull(21)
        assert reply["ok"], reply  # replay starts inside the log
    finally:
        client.close()
        gateway.close()


def test_a_non_finite_core_gradient_stops_the_step_before_any_weight_changes(harness: Harness) -> None:
    before = flat_params(harness.backend.model).copy()
    with pytest.raises(FloatingPointError, match="core step 0: the reduced gradient norm is nan"):
        harness.core.step(lambda m, s: PROBLEM.loss(m, 0, s) * float("nan"))
    np.testing.assert_array_equal(flat_params(harness.backend.model), before)
