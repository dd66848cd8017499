"""Connection limits of the side-channel gateway: a peer that never says hello, or replays a recorded
hello and sends no authentic request, is closed after the handshake timeout and may not make the
gateway buffer a body; an idle session is closed after the idle timeout; connections past the cap are
closed on accept, and their slots come back; an authentic frame with a broken header is counted."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Coordinator
from tests.elastic.builders import KEY, closed_by_gateway, wait_until


def _gateway(**options: Any) -> Gateway:
    return Gateway(KEY, Coordinator(1), numel=4, dtype=torch.float64, deadline_s=1.0, **options)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _connect(gateway: Gateway, sockets: list[socket.socket]) -> socket.socket:
    sockets.append(socket.create_connection(gateway.address, timeout=5))
    return sockets[-1]


def test_connections_that_never_say_hello_are_closed_after_the_handshake_timeout(
    sockets: list[socket.socket],
) -> None:
    # The audit's case: idle peers with a partial prefix held a handler thread each, forever.
    gateway = _gateway(handshake_timeout_s=0.5)
    try:
        idle = [_connect(gateway, sockets) for _ in range(20)]
        for sock in idle:
            sock.sendall(wire.MAGIC)  # a partial prefix, then silence
        # A peer that keeps sending (a byte every 0.1 s, each read well inside the timeout) is still
        # bounded by the same deadline: its sends fail once the gateway has closed it.
        trickle = _connect(gateway, sockets)
        t0, trickled_s = time.monotonic(), None
        while time.monotonic() - t0 < 10:
            try:
                trickle.sendall(b"\0")
            except OSError:
                trickled_s = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert trickled_s is not None and trickled_s < 5, trickled_s
        assert all(closed_by_gateway(sock, within_s=10) for sock in idle)
        assert wait_until(lambda: gateway.connections == 0, timeout_s=5), gateway.connections
        assert gateway.timed_out == 21 and gateway.unauthenticated == 0
    finally:
        gateway.close()


def test_a_first_frame_with_a_body_is_dropped_before_its_body_is_read(sockets: list[socket.socket]) -> None:
    # Before the hello nobody is authenticated, so the gateway reads at most a small header: a prefix
    # announcing a 512 MiB body (under max_frame_bytes) must not make it wait for and buffer that body.
    gateway = _gateway(handshake_timeout_s=30)
    try:
        sock = _connect(gateway, sockets)
        sock.sendall(struct.pack(">4sIQ", wire.MAGIC, 2, 512 << 20))
        assert closed_by_gateway(sock, within_s=5)
        assert gateway.unauthenticated == 1 and gateway.timed_out == 0
        sock = _connect(gateway, sockets)
        sock.sendall(struct.pack(">4sIQ", wire.MAGIC, 1 << 20, 0))  # a 1 MiB header
        assert closed_by_gateway(sock, within_s=5)
        assert gateway.unauthenticated == 2
    finally:
        gateway.close()


def test_an_idle_session_is_closed_after_the_idle_timeout() -> None:
    gateway = _gateway(idle_timeout_s=0.5)
    client = GatewayClient(gateway.address, KEY, "h0", timeout_s=10)
    try:
        for _ in range(3):  # requests closer together than the timeout keep the session open
            reply, _ = client.pull(0, wait_s=0.01)
            assert not reply["ok"] and "not published" in reply["reason"]
            time.sleep(0.2)
        assert wait_until(lambda: gateway.timed_out == 1, timeout_s=10)
        with pytest.raises(OSError):  # ConnectionError (closed) or a reset, depending on timing
            client.pull(0, wait_s=0.01)
        assert wait_until(lambda: gateway.connections == 0, timeout_s=5)
    finally:
        client.close()
        gateway.close()


def test_connections_past_the_cap_are_closed_on_accept_and_slots_come_back(
    sockets: list[socket.socket],
) -> None:
    gateway = _gateway(max_connections=2, handshake_timeout_s=30)
    try:
        held = [_connect(gateway, sockets) for _ in range(2)]
        assert wait_until(lambda: gateway.connections == 2, timeout_s=5)
        extra = _connect(gateway, sockets)
        assert closed_by_gateway(extra, within_s=5)
        assert gateway.refused_connections == 1
        with pytest.raises(OSError):
            GatewayClient(gateway.address, KEY, "h0", timeout_s=5)
        for sock in held:
            sock.close()
        assert wait_until(lambda: gateway.connections == 0, timeout_s=5)
        client = GatewayClient(gateway.address, KEY, "h0", timeout_s=5)  # a slot is free again
        try:
            reply, _ = client.pull(0, wait_s=0.01)
            assert reply["kind"] == "pull_reply"
        finally:
            client.close()
        assert gateway.refused_connections == 2 and gateway.timed_out == 0
    finally:
        gateway.close()


def _recorded_hello() -> bytes:
    """A hello as an eavesdropper records it off an honest hybrid's connection (made with the key)."""
    return wire.encode_frame(KEY, {"kind": "hello", "worker": "h0", "nonce": secrets.token_hex(16)})


def _hello_reply(sock: socket.socket) -> dict[str, Any]:
    header, _ = wire.read_frame(sock, KEY, 0)
    assert header["kind"] == "hello_reply"
    return header


def test_a_replayed_hello_holds_its_slot_only_for_the_handshake_timeout(sockets: list[socket.socket]) -> None:
    # The audit's case: a keyless peer replaying a recorded hello got a session and, from then on,
    # the 600 s idle timeout per read instead of the handshake's bound (docs promised the latter).
    gateway = _gateway(handshake_timeout_s=0.5, idle_timeout_s=600, max_connections=2)
    try:
        t0 = time.monotonic()
        replayers = [_connect(gateway, sockets) for _ in range(2)]
        for sock in replayers:
            sock.sendall(_recorded_hello())
            _hello_reply(sock)  # a hello is answered: it proves nothing, and opens nothing usable
        assert all(closed_by_gateway(sock, within_s=5) for sock in replayers)
        assert time.monotonic() - t0 < 3
        assert wait_until(lambda: gateway.connections == 0, timeout_s=5)
        assert gateway.timed_out == 2
        client = GatewayClient(gateway.address, KEY, "h1", timeout_s=5)  # the slots are free again
        client.close()
    finally:
        gateway.close()


def test_after_a_replayed_hello_a_large_body_is_refused_unread(sockets: list[socket.socket]) -> None:
    # Until a request carrying the session passes its MAC check, a frame may have no body: the gateway
    # must not wait for and buffer up to max_frame_bytes of a keyless peer's bytes.
    gateway = _gateway(handshake_timeout_s=30)
    try:
        sock = _connect(gateway, sockets)
        sock.sendall(_recorded_hello())
        _hello_reply(sock)
        sock.sendall(struct.pack(">4sIQ", wire.MAGIC, 10, 256 << 20) + b"\0" * 32 + b"x" * 10)
        assert closed_by_gateway(sock, within_s=5)
        assert gateway.unauthenticated == 1 and gateway.timed_out == 0
    finally:
        gateway.close()


def test_after_its_first_request_a_session_is_bound_by_the_idle_timeout_not_the_handshake() -> None:
    gateway = _gateway(handshake_timeout_s=0.5, idle_timeout_s=10)
    client = GatewayClient(gateway.address, KEY, "h0", timeout_s=10)
    try:
        for _ in range(2):
            reply, _ = client.pull(0, wait_s=0.01)
            assert reply["kind"] == "pull_reply"
            time.sleep(1.0)  # twice the handshake timeout between requests
        assert gateway.timed_out == 0
    finally:
        client.close()
        gateway.close()


def _frame_with_raw_header(raw_header: bytes) -> bytes:
    prefix = struct.pack(">4sIQ", wire.MAGIC, len(raw_header), 0)
    return prefix + hmac.new(KEY, prefix + raw_header, hashlib.sha256).digest() + raw_header


@pytest.mark.parametrize("raw_header", [b"{not json", b"\xff\xfe", b"[1, 2]"], ids=["json", "utf8", "list"])
def test_an_authentic_frame_whose_header_is_not_a_json_object_is_a_counted_protocol_error(
    raw_header: bytes,
) -> None:
    # It used to raise JSONDecodeError (not a FrameError) out of the handler thread, uncounted.
    with pytest.raises(wire.HeaderError):
        wire.decode_frame(KEY, _frame_with_raw_header(raw_header), max_bytes=0)
    gateway = _gateway(handshake_timeout_s=5)
    try:
        with socket.create_connection(gateway.address, timeout=5) as sock:
            sock.sendall(_recorded_hello())
            _hello_reply(sock)
            sock.sendall(_frame_with_raw_header(raw_header))
            assert closed_by_gateway(sock, within_s=5)
        assert gateway.malformed == 1 and gateway.unauthenticated == 0
        client = GatewayClient(gateway.address, KEY, "h0", timeout_s=5)  # the gateway serves on
        try:
            assert client.pull(0, wait_s=0.01)[0]["kind"] == "pull_reply"
        finally:
            client.close()
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"step": 0, "wait_s": float("nan")}, "wait_s must be a finite number >= 0, got nan"),
        ({"step": 0, "wait_s": -1.0}, "wait_s must be a finite number >= 0, got -1.0"),
        ({"step": float("inf"), "wait_s": 0.1}, "OverflowError"),
    ],
)
def test_non_finite_numbers_in_an_authentic_header_are_a_bad_request(
    fields: dict[str, Any], problem: str
) -> None:
    # A NaN wait spun on the gateway lock (beside the core's step) until the update came; an
    # Infinity step killed the handler thread with no reply.
    gateway = _gateway()
    client = GatewayClient(gateway.address, KEY, "h0", timeout_s=5)
    try:
        started = time.process_time()
        reply, _ = client.request("pull", **fields)
        assert not reply["ok"] and problem in reply["reason"] and reply["reason"].startswith("bad request")
        assert time.process_time() - started < 0.5
        reply, _ = client.pull(0, wait_s=0.01)  # the session goes on
        assert "not published" in reply["reason"]
    finally:
        client.close()
        gateway.close()


def test_close_shuts_open_connections_and_ends_waiting_pulls() -> None:
    # Connections and their handler threads lived on after close() until the idle timeout (600 s),
    # served as before.
    gateway = _gateway()
    client = GatewayClient(gateway.address, KEY, "h0", timeout_s=10)
    waiting = GatewayClient(gateway.address, KEY, "h1", timeout_s=10)
    result: dict[str, Any] = {}

    def pull() -> None:
        try:
            result["reply"] = waiting.pull(5, wait_s=30)[0]
        except OSError as err:  # the reply may not make it out before the connection is shut
            result["error"] = err

    thread = threading.Thread(target=pull, daemon=True)
    try:
        assert client.pull(0, wait_s=0.01)[0]["retry"]
        thread.start()
        assert wait_until(lambda: gateway.connections == 2, timeout_s=5)
        time.sleep(0.1)  # h1 waits in its pull
        started = time.monotonic()
        gateway.close()
        thread.join(5)
        assert not thread.is_alive() and time.monotonic() - started < 5
        assert result.get("reply", {}).get("reason") == "the gateway closed" or "error" in result
        with pytest.raises(OSError):  # ConnectionError (closed) or a reset
            client.pull(0, wait_s=0.01)
        assert wait_until(lambda: gateway.connections == 0, timeout_s=5)
    finally:
        client.close()
        waiting.close()


def test_a_frame_the_peer_cuts_short_is_counted_and_reported_a_close_between_frames_is_not() -> None:
    # A push cut by the hybrid's crash mid-send vanished: no counter, nothing in the step's report.
    gateway = _gateway(handshake_timeout_s=5, idle_timeout_s=10)
    try:
        quiet = GatewayClient(gateway.address, KEY, "h1", timeout_s=5)
        assert quiet.pull(0, wait_s=0.01)[0]["kind"] == "pull_reply"
        quiet.close()  # between frames: the session's end, nothing lost
        client = GatewayClient(gateway.address, KEY, "h0", timeout_s=5)
        assert client.pull(0, wait_s=0.01)[0]["kind"] == "pull_reply"
        frame = wire.encode_frame(KEY, {"kind": "push"}, b"x" * 64)
        client._sock.sendall(frame[: len(frame) // 2])
        client.close()
        assert wait_until(lambda: gateway.cut == 1, 5)
        assert (gateway.unauthenticated, gateway.malformed, gateway.replayed) == (0, 0, 0)
        _, report = gateway.collect(0, 0)
        (rejected,) = report.rejected
        assert rejected[0] == "<cut>" and "peer closed the connection in a frame" in rejected[1]
    finally:
        gateway.close()
