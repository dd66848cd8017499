"""The hybrid side channel: authentication before any parsing, and payload checks on step, version,
epoch and membership. The core step always completes, with the divisor counting accepted payloads."""

from __future__ import annotations

import json
import secrets
import socket
import struct
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
from libra_core.elastic.toy import flat_params, reference_params
from libra_core.training.backends.ddp import DDPBackend
from tests.elastic.builders import KEY, PROBLEM, Harness, closed_by_gateway, open_raw_session, wait_until

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


@pytest.fixture
def harness() -> Iterator[Harness]:
    with Harness(deadline_s=0.5) as h:
        yield h


def _in_background(fn: object) -> threading.Thread:
    t = threading.Thread(target=fn)  # type: ignore[arg-type]
    t.start()
    return t


def test_valid_payload_is_counted_and_duplicates_and_late_ones_are_not(harness: Harness) -> None:
    assert harness.core_step()["divisor"] == 1  # step 0: h0 is warming (not counted)
    reply = harness.pull_and_apply(0)
    assert reply["active_next"] and reply["next_step"] == 1 and reply["next_epoch"] == 1
    grad = harness.hybrid_grad(1)
    ok = harness.client.push(grad, step=1, version=1, epoch=1)
    assert {k: ok[k] for k in ("ok", "kind", "worker", "step")} == {
        "ok": True,
        "kind": "push_reply",
        "worker": "h0",
        "step": 1,
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
    bad_key = secrets.token_bytes(32)
    # As a connection's first frame (a forged hello) and inside an open session (a forged push).
    with socket.create_connection(harness.gateway.address, timeout=5) as sock:
        sock.sendall(wire.encode_frame(bad_key, {"kind": "hello", "worker": "h0", "nonce": "00" * 16}))
        assert closed_by_gateway(sock, within_s=5), "the gateway closes the connection without replying"
    sock, session = open_raw_session(harness.gateway.address, "h0")
    with sock:
        # An authentic first request proves the session (until then a body is refused unread).
        sock.sendall(wire.encode_frame(KEY, session.request("pull", {"step": 0, "wait_s": 1.0})))
        assert wire.read_frame(sock, KEY, 1 << 30)[0]["ok"]
        header = session.request("push", {"step": 1, "version": 1, "epoch": 1})
        sock.sendall(
            wire.encode_frame(bad_key, header, wire.tensors_to_bytes({"grad": harness.hybrid_grad(1)}))
        )
        assert closed_by_gateway(sock, within_s=5), "the gateway closes the connection without replying"
    report = harness.core_step()
    assert report["divisor"] == 1 and list(report["missing"]) == ["h0"]
    assert harness.gateway.unauthenticated == 2
    hmac_failure = (
        "<unauthenticated>",
        "side-channel frame failed HMAC verification (wrong key or tampered bytes)",
    )
    assert [tuple(r) for r in report["rejected"]].count(hmac_failure) == 2


def _safetensors_with_dtype(dtype: str) -> bytes:
    header = json.dumps({"grad": {"dtype": dtype, "shape": [1], "data_offsets": [0, 1]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0"


@pytest.mark.parametrize(
    "body",
    [
        b"not-safetensors",  # safetensors: "header too large" (a SafetensorError, not a ValueError)
        b"",
        wire.tensors_to_bytes({"grad": torch.zeros(8, dtype=torch.float64)})[:-3],  # truncated
        _safetensors_with_dtype("F8_E8M0"),  # a dtype torch has no name for: KeyError inside safetensors
    ],
    ids=["junk", "empty", "truncated", "unknown-dtype"],
)
def test_push_whose_body_is_not_safetensors_is_a_typed_rejection(harness: Harness, body: bytes) -> None:
    # An authenticated push from an active member for the open step, with a body that does not decode:
    # it used to raise out of the handler, killing its thread and the hybrid's connection.
    harness.core_step()
    harness.pull_and_apply(0)
    reply, _ = harness.client.request("push", body, step=1, version=1, epoch=1)
    assert not reply["ok"] and reply["reason"].startswith("payload body is not valid safetensors: ")
    # The connection and its handler survive: the same hybrid's valid push for the step still counts.
    assert harness.client.push(harness.hybrid_grad(1), step=1, version=1, epoch=1)["ok"]
    report = harness.core_step()
    assert report["divisor"] == 2 and list(report["included"]) == ["h0"]
    assert ("h0", reply["reason"]) in [tuple(r) for r in report["rejected"]]
    expected = reference_params(PROBLEM, [(0,), (0, 1)])
    np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)


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
    clients: list[GatewayClient] = []
    try:
        gateway.request_join("h0")  # the core snapshots step 0 for it; then the join is cancelled
        core = CoreReplica(backend, gateway=gateway, grad_clip=PROBLEM.grad_clip)
        gateway.cancel("h0")
        for _ in range(20):
            core.step(lambda m, s: PROBLEM.loss(m, 0, s))
        gateway.request_join("h1")
        assert gateway.wants_snapshot()  # step 0's snapshot is older than the log
        clients.append(GatewayClient(gateway.address, KEY, "h1"))
        reply, _ = clients[-1].request("snapshot", wait_s=0.2, part_bytes=clients[-1].max_frame_bytes)
        assert (
            reply.get("retry") and "no fresh snapshot within the wait" in reply["reason"]
        )  # not the stale one
        # A timed-out snapshot wait keeps the join (since 2026-12-07): it still asks for a snapshot.
        assert gateway.states()["h1"] == "join_requested" and gateway.wants_snapshot()
        core.step(lambda m, s: PROBLEM.loss(m, 0, s))  # the core stores a fresh one at the step's end
        header, _ = clients[-1].snapshot(wait_s=5)
        assert header["step"] == 21  # LOADING once the gateway's send has returned (just after ours)
        assert wait_until(lambda: gateway.states()["h1"] == "loading", timeout_s=5), gateway.states()
        clients[-1].loaded(aligned_through=20)
        core.step(lambda m, s: PROBLEM.loss(m, 0, s))
        reply, _ = clients[-1].pull(21)
        assert reply["ok"], reply  # replay starts inside the log
    finally:
        for client in clients:
            client.close()
        gateway.close()


def test_a_non_finite_core_gradient_stops_the_step_before_any_weight_changes(harness: Harness) -> None:
    before = flat_params(harness.backend.model).copy()
    with pytest.raises(FloatingPointError, match="core step 0: the reduced gradient norm is nan"):
        harness.core.step(lambda m, s: PROBLEM.loss(m, 0, s) * float("nan"))
    np.testing.assert_array_equal(flat_params(harness.backend.model), before)


def test_a_finite_payload_whose_norm_overflows_is_rejected_and_the_core_steps_on(harness: Harness) -> None:
    # Each value finite, the norm inf: the reduced norm was inf, clipping stopped every core rank
    # mid-step (FloatingPointError), and the step could not be retried.
    harness.core_step()
    harness.pull_and_apply(0)
    grad = torch.full_like(harness.hybrid_grad(1), 1e300)  # float64: 1e600 squared sum overflows
    assert bool(grad.isfinite().all()) and not torch.linalg.vector_norm(grad).isfinite()
    reply = harness.client.push(grad, step=1, version=1, epoch=1)
    assert not reply["ok"] and reply["reason"] == "payload 'grad' has a norm too large for its dtype"
    report = harness.core_step()
    assert report["divisor"] == 1 and list(report["missing"]) == ["h0"]
    expected = reference_params(PROBLEM, [(0,), (0,)])
    np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)
