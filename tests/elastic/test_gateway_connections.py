"""Connection limits of the side-channel gateway: a peer that never says hello is closed after the
handshake timeout and may not make the gateway buffer a body; an idle session is closed after the idle
timeout; connections past the cap are closed on accept, and their slots come back."""

from __future__ import annotations

import socket
import struct
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
