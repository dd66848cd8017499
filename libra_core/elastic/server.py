"""The side channel's connection layer: a TCP server that admits, authenticates and sequences frames.

The gateway on core rank 0 (libra_core/elastic/gateway.py) is built on it: this module knows
sockets, frames (libra_core/elastic/wire.py) and sessions (libra_core/elastic/session.py), not
hybrids or steps. One handler thread serves each connection, in three phases:

1. Handshake, bounded by `handshake_timeout_s` from the handler's start and by small sizes: the
   peer's bodiless hello (header at most HANDSHAKE_MAX_HEADER_BYTES), then its first request, which
   must also be bodiless and as small. A hello proves nothing (a recorded one can be replayed by a
   peer without the key, and is answered with a session), so the bounds are lifted only once a request
   carrying the new session has passed its MAC and session checks. A peer without the key thus holds
   a slot and a few KiB for at most `handshake_timeout_s`, replayed hello or not.
2. Requests: each frame may be up to `max_frame_bytes`, each read must make progress within
   `idle_timeout_s`, and each must carry the session and its next sequence number.
3. End: however the connection ends (peer closed, timeout, dropped frame, failed send, an error in
   `_handle`), `_connection_ended(session)` runs once for a connection that opened a session.

A dropped frame closes its connection and is counted: `unauthenticated` (bad MAC, bad prefix, over a
limit, or a body before the session is proven), `malformed` (an authentic frame whose header is not a
JSON object), `replayed` (fails the session check), `cut` (the peer closed the connection in the
middle of it: a push that never arrived whole); `timed_out` counts handshake and idle timeouts.

Call context: subclasses implement `_handle` (on handler threads, concurrently; it returns the reply
and an optional action to run once that reply is sent in full), `_connection_ended` and
`_report_dropped`, and call `_start_server` once at the end of their constructor.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from libra_core.elastic.session import ReplayError, ServerSession
from libra_core.elastic.wire import (
    AuthError,
    FrameCutError,
    FrameError,
    HeaderError,
    encode_frame,
    read_frame,
    send_frame,
)

log = logging.getLogger(__name__)

HANDSHAKE_MAX_HEADER_BYTES = (
    4096  # a hello or first request is ~200 B of JSON; an unproven peer buffers no more
)
HELLO_MAX_HEADER_BYTES = HANDSHAKE_MAX_HEADER_BYTES  # the name before the first request was bounded too


@dataclass(frozen=True)
class Reply:
    """A handler's answer: header fields and body, and `on_sent`, run only once the frame is sent."""

    header: dict[str, Any]
    body: bytes = b""
    on_sent: Callable[[], None] | None = None


class SideChannelServer:
    def __init__(
        self,
        key: bytes,
        *,
        max_frame_bytes: int,
        handshake_timeout_s: float,
        idle_timeout_s: float,
        max_connections: int,
    ) -> None:
        assert len(key) >= 16, "the side-channel key must be at least 16 bytes"
        assert handshake_timeout_s > 0 and idle_timeout_s > 0, "side-channel timeouts must be positive"
        assert max_connections >= 1, "the gateway must accept at least one connection"
        self.key, self.max_frame_bytes = key, max_frame_bytes
        self.handshake_timeout_s, self.idle_timeout_s = handshake_timeout_s, idle_timeout_s
        self.max_connections = max_connections
        self._conn_lock = threading.Lock()
        self._live: set[socket.socket] = set()  # connections being served, for `close`
        self.connections = 0  # connections being served now
        self.refused_connections = 0  # closed on accept: `max_connections` were being served
        self.timed_out = 0  # connections closed for a handshake or a read past its timeout
        self.unauthenticated = 0  # frames dropped for a bad MAC, a malformed prefix or a size limit
        self.malformed = 0  # authentic frames whose header is not a JSON object
        self.replayed = 0  # authentic frames dropped by the session check (replayed or out of order)
        self.cut = 0  # frames the peer closed its connection in the middle of

    # ------------------------------------------------------------------ for subclasses

    def _handle(self, session: ServerSession, header: dict[str, Any], body: bytes) -> Reply:
        """Act on one request that passed every check; return its reply (handler threads)."""
        raise NotImplementedError

    def _connection_ended(self, session: ServerSession) -> None:
        """The connection of `session` has ended, for whatever reason (handler thread, once)."""
        raise NotImplementedError

    def _report_dropped(self, label: str, reason: str) -> None:
        """A dropped frame, for the subclass's own reports (`label` names the counter's kind)."""
        raise NotImplementedError

    def _start_server(self, host: str, port: int) -> None:
        server = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve_connection(self.request)

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = self.max_connections  # listen backlog: a burst of hybrids need not retry

            def verify_request(self, request: Any, client_address: Any) -> bool:
                return server._admit_connection()

            def process_request(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    server._release_connection()  # no handler thread started to release it
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    server._release_connection()

        self._server = _Server((host, port), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="libra-gateway", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Stop accepting, then shut every open connection: its handler thread ends and its peer
        sees the end (until 2026-12-06 both lived on until the idle timeout, served as before)."""
        self._server.shutdown()
        self._server.server_close()
        with self._conn_lock:
            live = list(self._live)
        for sock in live:
            with contextlib.suppress(OSError):  # already closed by its peer
                sock.shutdown(socket.SHUT_RDWR)

    # ------------------------------------------------------------------ connections (accept thread)

    def _admit_connection(self) -> bool:
        """On the accept thread, before a handler starts: take a connection slot if one is free."""
        with self._conn_lock:
            if self.connections >= self.max_connections:
                self.refused_connections += 1
                admitted = False
            else:
                self.connections += 1
                admitted = True
        if not admitted:
            log.warning("side channel: refused a connection (%d served at once)", self.max_connections)
        return admitted

    def _release_connection(self) -> None:
        with self._conn_lock:
            self.connections -= 1

    # ------------------------------------------------------------------ one connection (handler thread)

    def _drop(self, label: str, exc: Exception) -> None:
        """Count a dropped frame and report it; the caller closes the connection."""
        with self._conn_lock:
            if label == "<replayed>":
                self.replayed += 1
            elif label == "<malformed>":
                self.malformed += 1
            elif label == "<cut>":
                self.cut += 1
            else:
                self.unauthenticated += 1
        self._report_dropped(label, str(exc))
        log.warning("side channel: dropped a frame and its connection: %s", exc)

    def _timed_out(self, what: str, limit_s: float) -> None:
        with self._conn_lock:
            self.timed_out += 1
        log.warning("side channel: closed a connection: %s within %.1f s", what, limit_s)

    def _read(
        self, sock: socket.socket, session: ServerSession | None, deadline: float | None
    ) -> tuple[dict[str, Any], bytes] | None:
        """One frame, checked against `session` when given; None when the connection must close (the
        reason counted). With `deadline` the frame is held to the handshake's bounds: no body, a small
        header, complete by the deadline."""
        try:
            if deadline is None:
                header, body = read_frame(sock, self.key, self.max_frame_bytes)
            else:
                header, body = read_frame(
                    sock, self.key, 0, max_header_bytes=HANDSHAKE_MAX_HEADER_BYTES, deadline=deadline
                )
            if session is not None:
                session.check(header)
            return header, body
        except TimeoutError:
            if deadline is not None:
                what = "no authenticated request after the hello" if session else "no hello"
                self._timed_out(what, self.handshake_timeout_s)
            else:
                assert session is not None, "only a session's reads have no deadline"
                self._timed_out(f"{session.worker}'s session idle", self.idle_timeout_s)
        except FrameCutError as exc:  # uncounted until 2026-12-07: a push lost without a trace
            self._drop("<cut>", exc)
        except OSError:  # the peer closed or reset the connection between frames
            pass
        except HeaderError as exc:
            self._drop("<malformed>", exc)
        except (AuthError, FrameError) as exc:
            self._drop("<unauthenticated>", exc)
        except ReplayError as exc:
            self._drop("<replayed>", exc)
        return None

    def _hello(self, sock: socket.socket, deadline: float) -> ServerSession | None:
        """Open a session from the connection's first frame, which must be a hello; None if it is not."""
        frame = self._read(sock, None, deadline)
        if frame is None:
            return None
        try:
            return ServerSession.accept(frame[0])
        except ReplayError as exc:
            self._drop("<replayed>", exc)
            return None

    def _serve_connection(self, sock: socket.socket) -> None:
        with self._conn_lock:
            self._live.add(sock)
        try:
            self._serve_session(sock)
        finally:
            with self._conn_lock:
                self._live.discard(sock)

    def _serve_session(self, sock: socket.socket) -> None:
        handshake_deadline = time.monotonic() + self.handshake_timeout_s
        session = self._hello(sock, handshake_deadline)
        if session is None:
            return
        try:
            try:  # a peer that does not read its hello reply is bounded by the handshake's deadline too
                sock.settimeout(max(handshake_deadline - time.monotonic(), 1e-3))
                send_frame(sock, encode_frame(self.key, session.hello_reply()))
            except OSError:
                return
            deadline: float | None = handshake_deadline
            while (frame := self._read(sock, session, deadline)) is not None:
                if deadline is not None:  # the session is proven: the request limits apply from now on
                    deadline = None
                    sock.settimeout(self.idle_timeout_s)
                header, body = frame
                reply = self._handle(session, header, body)
                try:
                    out = {**reply.header, **session.reply_fields(header)}
                    send_frame(sock, encode_frame(self.key, out, reply.body))
                except OSError:
                    return
                if reply.on_sent is not None:
                    reply.on_sent()
        finally:
            self._connection_ended(session)
