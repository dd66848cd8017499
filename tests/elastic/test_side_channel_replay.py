"""Replay protection on the side channel: a recorded frame sent again is dropped before the gateway acts
on it (each connection has its own gateway-chosen session and numbered frames), and a hybrid refuses a
reply that does not answer the request it just sent."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient
from libra_core.elastic.session import ReplyMismatchError, ServerSession
from libra_core.elastic.toy import flat_params, reference_params
from tests.elastic.builders import (
    KEY,
    PROBLEM,
    Harness,
    closed_by_gateway,
    frame_of,
    open_raw_session,
    record_client_frames,
    wait_until,
)


@pytest.fixture
def sent_frames(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    return record_client_frames(monkeypatch)


def _replay(address: tuple[str, int], *frames: bytes) -> bool:
    """Send recorded frames on a fresh connection; True if the gateway closed it having sent back
    nothing but, for a replayed hello, the hello reply (a hello opens a session, nothing more)."""
    got, closed = b"", False
    with socket.create_connection(address, timeout=5) as sock:
        for frame in frames:
            sock.sendall(frame)
        try:
            while chunk := sock.recv(1 << 16):
                got += chunk
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass  # the gateway kept the connection open: it took the frames for the session's own
    if not closed:
        return False
    if not got:
        return True
    try:
        header, _ = wire.decode_frame(KEY, got, max_bytes=1 << 30)
    except wire.FrameError:  # more than one frame came back: a replayed request was answered
        return False
    return bool(header["kind"] == "hello_reply")


def test_a_replayed_pull_frame_does_not_evict_an_active_hybrid(sent_frames: list[bytes]) -> None:
    # The audit's attack: h0's pull of update 1, recorded off the wire and sent again once update 1
    # has left the log, made the gateway fail h0 as "expired" while it was training honestly.
    with Harness(deadline_s=5.0, update_log_steps=4) as harness:
        harness.core_step()
        harness.pull_and_apply(0)
        for step in range(1, 7):
            assert harness.client.push(harness.hybrid_grad(step), step=step, version=step, epoch=1)["ok"]
            assert harness.core_step()["divisor"] == 2
            harness.pull_and_apply(step)
        assert 1 not in harness.gateway._log, "update 1 has left the log: a pull of it is 'expired'"
        pull_1 = frame_of(sent_frames, "pull", step=1)
        hello = frame_of(sent_frames, "hello")
        address = harness.gateway.address
        assert _replay(address, pull_1), "a pull as a connection's first frame is dropped"
        assert harness.gateway.states() == {"h0": "active"}
        assert _replay(address, hello, pull_1), "a pull from another connection's session is dropped"
        assert harness.gateway.states() == {"h0": "active"}
        assert harness.gateway.replayed == 2
        # h0 keeps training: its next payload is counted and the model equals the static run.
        assert harness.client.push(harness.hybrid_grad(7), step=7, version=7, epoch=1)["ok"]
        report = harness.core_step()
        assert report["divisor"] == 2 and list(report["included"]) == ["h0"]
        replays = [reason for who, reason in report["rejected"] if who == "<replayed>"]
        assert len(replays) == 2 and all("'pull' from 'h0'" in r for r in replays), replays
        expected = reference_params(PROBLEM, [(0,)] + [(0, 1)] * 7)
        np.testing.assert_allclose(flat_params(harness.backend.model), expected, rtol=0, atol=1e-6)


def test_a_replayed_snapshot_request_does_not_take_a_later_join(sent_frames: list[bytes]) -> None:
    # The audit's attack: h0's snapshot request from its first join, sent again after a second join
    # request, took that join's snapshot (h0 moved to LOADING) and the real h0 was then refused.
    with Harness() as harness:
        harness.gateway.cancel("h0")  # the first join ends (h0 was warming)
        harness.gateway.request_join("h0")
        harness.core_step()
        snapshot, hello = frame_of(sent_frames, "snapshot"), frame_of(sent_frames, "hello")
        assert _replay(harness.gateway.address, snapshot)
        assert _replay(harness.gateway.address, hello, snapshot)
        assert harness.gateway.states() == {"h0": "join_requested"}
        assert harness.gateway.replayed == 2
        fresh = GatewayClient(harness.gateway.address, KEY, "h0")
        try:
            header, _ = fresh.snapshot(wait_s=5)
            assert header["ok"]
            assert wait_until(lambda: harness.gateway.states() == {"h0": "loading"}, timeout_s=5)
        finally:
            fresh.close()


def test_a_frame_repeated_or_out_of_order_inside_its_session_is_dropped() -> None:
    with Harness() as harness:
        harness.core_step()
        address = harness.gateway.address

        def pull_0(fields: dict[str, Any]) -> bytes:
            return wire.encode_frame(KEY, {"kind": "pull", "step": 0, "wait_s": 1.0, **fields})

        # A frame sent twice in one session: the first is served, the copy is dropped.
        sock, session = open_raw_session(address, "h1")
        with sock:
            frame = pull_0(session.request("pull", {}))
            sock.sendall(frame)
            reply, _ = wire.read_frame(sock, KEY, 1 << 30)
            assert reply["ok"] and reply["seq"] == 1
            sock.sendall(frame)
            assert closed_by_gateway(sock, within_s=5)
        # A sequence number that skips ahead, and a frame naming another worker than the hello did.
        for fields in ({"seq": 5}, {"worker": "h0"}):
            sock, session = open_raw_session(address, "h1")
            with sock:
                sock.sendall(pull_0({**session.request("pull", {}), **fields}))
                assert closed_by_gateway(sock, within_s=5)
        assert harness.gateway.replayed == 3
        # h0's own session is undisturbed: it is active in step 1 and its payload counts.
        assert harness.gateway.states()["h0"] == "active"
        harness.pull_and_apply(0)
        assert harness.client.push(harness.hybrid_grad(1), step=1, version=1, epoch=1)["ok"]
        report = harness.core_step()
        assert report["divisor"] == 2
        reasons = [r for who, r in report["rejected"] if who == "<replayed>"]
        assert "the session expects 2" in reasons[0] and "the session expects 1" in reasons[1]
        assert reasons[2] == "frame for 'h0' in the session of 'h1'"


# ---------------------------------------------------------------------------- reply binding (client)

Tamper = Callable[[dict[str, Any], list[bytes]], bytes | None]


class ScriptedGateway:
    """A gateway double holding the key (as a recorder of real replies would have them): it says
    hello honestly, then answers request n with `tamper(honest_reply, earlier_frames)`."""

    def __init__(self, tamper: Tamper) -> None:
        self.tamper = tamper
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = self._server.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            hello, _ = wire.read_frame(conn, KEY, 0)
            session = ServerSession.accept(hello)
            conn.sendall(wire.encode_frame(KEY, session.hello_reply()))
            sent: list[bytes] = []
            while True:
                try:
                    header, _ = wire.read_frame(conn, KEY, 1 << 30)
                except ConnectionError:
                    return
                session.check(header)
                honest = {"ok": True, **session.reply_fields(header), "next_step": header["step"] + 1}
                honest.update(next_version=header["step"] + 1, next_epoch=1, active_next=True, state="active")
                body = wire.tensors_to_bytes({"update": torch.full((3,), float(header["step"]))})
                frame = self.tamper(honest, sent) or wire.encode_frame(KEY, honest, body)
                sent.append(frame)
                conn.sendall(frame)

    def close(self) -> None:
        self._server.close()


def _with(**changes: Any) -> Tamper:
    return lambda honest, sent: wire.encode_frame(
        KEY, {**honest, **changes}, wire.tensors_to_bytes({"update": torch.zeros(3)})
    )


def _replay_first(honest: dict[str, Any], sent: list[bytes]) -> bytes | None:
    return sent[0] if sent else None  # the second request gets the first reply again, byte for byte


@pytest.fixture
def scripted() -> Iterator[Callable[[Tamper], GatewayClient]]:
    servers: list[ScriptedGateway] = []
    clients: list[GatewayClient] = []

    def make(tamper: Tamper) -> GatewayClient:
        servers.append(ScriptedGateway(tamper))
        clients.append(GatewayClient(servers[-1].address, KEY, "h0", timeout_s=10))
        return clients[-1]

    yield make
    for c in clients:
        c.close()
    for s in servers:
        s.close()


def test_an_honest_reply_is_accepted(scripted: Callable[[Tamper], GatewayClient]) -> None:
    client = scripted(lambda honest, sent: None)
    for step in (4, 5):
        reply, update = client.pull(step)
        assert reply["step"] == step and update is not None and update.tolist() == [float(step)] * 3


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        (_with(step=3), "step=3 (expected 4)"),  # the audit's case: a reply for update 3 to a pull of 4
        (_with(kind="snapshot_reply"), "kind='snapshot_reply' (expected 'pull_reply')"),
        (_with(session=secrets.token_hex(16)), "session="),  # a reply recorded on another connection
        (_with(worker="h1"), "worker='h1' (expected 'h0')"),
    ],
    ids=["other-step", "other-kind", "other-session", "other-worker"],
)
def test_a_reply_to_another_request_is_refused(
    scripted: Callable[[Tamper], GatewayClient], tamper: Tamper, error: str
) -> None:
    client = scripted(tamper)
    with pytest.raises(ReplyMismatchError, match="reply to pull") as info:
        client.pull(4)
    assert error in str(info.value)


def test_a_replayed_earlier_reply_is_refused(scripted: Callable[[Tamper], GatewayClient]) -> None:
    # Played back, update 4 would be applied twice by run_hybrid (once per pull).
    client = scripted(_replay_first)
    reply, _ = client.pull(4)
    assert reply["step"] == 4
    with pytest.raises(ReplyMismatchError, match=r"seq=1 \(expected 2\)"):
        client.pull(5)
