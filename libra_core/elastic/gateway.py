"""The side-channel gateway on core rank 0: hybrid gradients in, averaged updates and snapshots out.

Hybrids never join the core's process group (its communicators are built once and never rebuilt).
Instead each talks to this TCP server over authenticated frames (libra_core/elastic/wire.py). Core
rank 0 is the only core rank that sees hybrid gradients: it adds their sum to its own gradient and
their count to the divisor carried in the core all-reduce (libra_core/elastic/replica.py), so every
core rank applies the same update without knowing hybrids exist.

Call context: the core training loop on rank 0 calls `collect` then `publish` once per step, in that
order; handler threads (one per hybrid connection) call into the coordinator under one lock.

Connections. At most `max_connections` are served at once (more are closed on accept). A connection's
first frame must be a bodiless `hello` (libra_core/elastic/session.py), complete within
`handshake_timeout_s` and at most `HELLO_MAX_HEADER_BYTES`, so a peer without the key holds a thread
and a few KiB for a bounded time. After the hello each frame must carry the connection's session and
next sequence number (a replayed or reordered frame is dropped with its connection, counted in
`replayed`, before anything acts on it), and each read must make progress within `idle_timeout_s`.

Message kinds and their checks (a failed check is a typed rejection, logged and counted, never a crash):

- `push` (step, version, epoch, grad): accepted only for the open step, at its frozen version and
  membership epoch, from an ACTIVE member, once, with a body that decodes as one finite tensor of the
  expected size and dtype. A payload for a step that has closed (late), a future step, an old version
  or epoch, or a body that is not safetensors, is rejected.
- `pull` (step): blocks until update `step` is published; replies with the update and whether the
  worker is active in step+1. An update older than the log is `expired` (the join fails).
- `snapshot`: the model + optimizer snapshot, for a worker whose join was requested.
- `loaded` (aligned_through): the worker has loaded the snapshot and starts replaying updates.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from libra_core.elastic.membership import Coordinator, Membership
from libra_core.elastic.session import ReplayError, ServerSession
from libra_core.elastic.state_machine import HybridState, IllegalTransition
from libra_core.elastic.wire import (
    AuthError,
    BodyError,
    FrameError,
    bytes_to_tensors,
    encode_frame,
    read_frame,
    send_frame,
    tensors_to_bytes,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MAX_PULL_WAIT_S = 120.0
HELLO_MAX_HEADER_BYTES = 4096  # a hello is ~100 B of JSON; an unauthenticated peer buffers no more


@dataclass(frozen=True)
class StepCollection:
    """What rank 0 gathered from hybrids for one step."""

    step: int
    membership: Membership
    included: tuple[str, ...]  # hybrids whose gradient is in the sum (and in the divisor)
    missing: tuple[str, ...]  # active hybrids with no valid payload by the deadline (evicted)
    rejected: tuple[tuple[str, str], ...]  # (worker, reason) of payloads refused while the step was open
    wait_s: float  # time rank 0 waited for hybrids after its own gradient was ready


@dataclass
class _Snapshot:
    step: int  # the first step the snapshot's weights are used for (taken after update step-1)
    version: int
    tensors: dict[str, torch.Tensor]
    encoded: bytes | None = None


@dataclass
class _Open:
    membership: Membership
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False


class Gateway:
    def __init__(
        self,
        key: bytes,
        coordinator: Coordinator,
        *,
        numel: int,
        dtype: torch.dtype,
        deadline_s: float,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = 1 << 30,
        update_log_steps: int = 64,
        handshake_timeout_s: float = 10.0,
        idle_timeout_s: float = 600.0,
        max_connections: int = 64,
    ) -> None:
        """`handshake_timeout_s` bounds a new connection's hello (the only time a peer without the key
        holds a thread); `idle_timeout_s` bounds each read on an open session, so it must exceed the
        longest gap between a hybrid's frames (its gradient computation between a pull and a push);
        `max_connections` caps connections served at once (hybrids plus any unauthenticated peers)."""
        assert len(key) >= 16, "the side-channel key must be at least 16 bytes"
        assert handshake_timeout_s > 0 and idle_timeout_s > 0, "side-channel timeouts must be positive"
        assert max_connections >= 1, "the gateway must accept at least one connection"
        # Import the codec now: a first import on a handler thread would hold the GIL during a core step.
        import safetensors.torch  # noqa: F401

        self.key, self.coordinator, self.numel, self.dtype = key, coordinator, numel, dtype
        self.deadline_s, self.max_frame_bytes, self.update_log_steps = (
            deadline_s,
            max_frame_bytes,
            update_log_steps,
        )
        self._cond = threading.Condition()
        self._open = _Open(coordinator.current)
        self._log: OrderedDict[int, tuple[torch.Tensor, Membership]] = OrderedDict()
        self._snapshot: _Snapshot | None = None
        self.handshake_timeout_s, self.idle_timeout_s = handshake_timeout_s, idle_timeout_s
        self.max_connections = max_connections
        self._conn_lock = threading.Lock()
        self.connections = 0  # connections being served now
        self.refused_connections = 0  # closed on accept: `max_connections` were being served
        self.timed_out = 0  # connections closed for a hello or read past its timeout
        self.unauthenticated = 0  # frames dropped for a bad MAC or malformed prefix
        self.replayed = 0  # authentic frames dropped by the session check (replayed or out of order)
        gateway = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                gateway._serve_connection(self.request)

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = max_connections  # listen backlog: a burst of hybrids is not made to retry

            def verify_request(self, request: Any, client_address: Any) -> bool:
                return gateway._admit_connection()

            def process_request(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    gateway._release_connection()  # no handler thread started to release it
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    gateway._release_connection()

        self._server = _Server((host, port), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="libra-gateway", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ control (plan applier, rank 0)

    def request_join(self, worker_id: str) -> None:
        with self._cond:
            self.coordinator.request_join(worker_id)
            self._cond.notify_all()

    def request_leave(self, worker_id: str) -> None:
        with self._cond:
            self.coordinator.request_leave(worker_id)

    def cancel(self, worker_id: str) -> None:
        with self._cond:
            self.coordinator.cancel(worker_id)
            self._cond.notify_all()

    def states(self) -> dict[str, str]:
        with self._cond:
            return {w: life.state.value for w, life in self.coordinator.hybrids.items()}

    # ------------------------------------------------------------------ core side (rank 0 training loop)

    def wants_snapshot(self) -> bool:
        """True when a join waits and there is no snapshot recent enough to replay from."""
        with self._cond:
            pending = any(
                life.state is HybridState.JOIN_REQUESTED for life in self.coordinator.hybrids.values()
            )
            return pending and not self._snapshot_fresh()

    def _snapshot_fresh(self) -> bool:
        """A snapshot a joining hybrid can catch up from: stored, and recent enough that the updates
        after it are still in the log (half the log, so replaying stays short). Under `_cond`."""
        snap = self._snapshot
        return snap is not None and self._open.membership.step - snap.step < self.update_log_steps // 2

    def set_snapshot(self, tensors: dict[str, torch.Tensor], *, step: int, version: int) -> None:
        """Store clones of the state to serve; encoding happens on a handler thread, off the core's path."""
        snap = _Snapshot(step, version, {k: v.detach().clone() for k, v in tensors.items()})
        with self._cond:
            self._snapshot = snap
            self._cond.notify_all()

    def collect(self, step: int, version: int) -> tuple[torch.Tensor | None, StepCollection]:
        """Wait (at most the deadline) for the active hybrids' payloads of `step`; close the step."""
        t0 = time.perf_counter()
        with self._cond:
            current = self._open
            m = current.membership
            assert m.step == step and m.version == version and not current.closed, (
                f"collect(step={step}, version={version}) does not match the open step "
                f"{m.step} (version {m.version}, closed={current.closed})"
            )
            deadline = t0 + self.deadline_s
            while set(current.received) != m.active and (left := deadline - time.perf_counter()) > 0:
                self._cond.wait(left)
            current.closed = True  # from here on, payloads for this step are late
            included = tuple(sorted(current.received))
            missing = tuple(sorted(m.active - set(current.received)))
            for worker_id in missing:
                self.coordinator.fail(worker_id, f"missed the payload deadline of step {step}")
            total = None
            for worker_id in included:
                grad = current.received[worker_id]
                total = grad.clone() if total is None else total.add_(grad)
            rejected = tuple(current.rejected)
        if missing:
            log.warning(
                "step %d completes without hybrids %s (deadline %.2f s)", step, missing, self.deadline_s
            )
        return total, StepCollection(step, m, included, missing, rejected, time.perf_counter() - t0)

    def publish(self, step: int, update: torch.Tensor, next_version: int) -> Membership:
        """Log the applied update of `step`, freeze and open the membership of step+1."""
        with self._cond:
            nxt = self.coordinator.freeze_next(step, next_version)
            self._log[step] = (update.detach().clone(), nxt)
            while len(self._log) > self.update_log_steps:
                self._log.popitem(last=False)
            self._open = _Open(nxt)
            self._cond.notify_all()
        return nxt

    # ------------------------------------------------------------------ hybrid side (handler threads)

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

    def _drop(self, label: str, exc: Exception) -> None:
        """A frame that failed authentication (`label` "<unauthenticated>") or the session check
        ("<replayed>"): counted and reported in the open step; the caller closes the connection."""
        with self._cond:
            if label == "<replayed>":
                self.replayed += 1
            else:
                self.unauthenticated += 1
            self._open.rejected.append((label, str(exc)))
        log.warning("side channel: dropped a frame and its connection: %s", exc)

    def _open_session(self, sock: socket.socket) -> ServerSession | None:
        """Read the connection's hello (bounded in time and size, as its sender is not yet known)."""
        deadline = time.monotonic() + self.handshake_timeout_s
        try:
            hello, _ = read_frame(
                sock, self.key, 0, max_header_bytes=HELLO_MAX_HEADER_BYTES, deadline=deadline
            )
            session = ServerSession.accept(hello)
        except TimeoutError:
            with self._conn_lock:
                self.timed_out += 1
            log.warning(
                "side channel: closed a connection with no hello within %.1f s", self.handshake_timeout_s
            )
            return None
        except OSError:  # the peer closed or reset the connection
            return None
        except (AuthError, FrameError) as exc:
            self._drop("<unauthenticated>", exc)
            return None
        except ReplayError as exc:
            self._drop("<replayed>", exc)
            return None
        sock.settimeout(self.idle_timeout_s)
        try:
            send_frame(sock, encode_frame(self.key, session.hello_reply()))
        except OSError:
            return None
        return session

    def _serve_connection(self, sock: socket.socket) -> None:
        session = self._open_session(sock)
        while session is not None:
            try:
                header, body = read_frame(sock, self.key, self.max_frame_bytes)
                session.check(header)
            except TimeoutError:
                with self._conn_lock:
                    self.timed_out += 1
                log.warning(
                    "side channel: closed %s's connection, idle for %.1f s",
                    session.worker,
                    self.idle_timeout_s,
                )
                return
            except OSError:  # the peer closed or reset the connection
                return
            except (AuthError, FrameError) as exc:
                self._drop("<unauthenticated>", exc)
                return
            except ReplayError as exc:
                self._drop("<replayed>", exc)
                return
            try:
                reply, reply_body = self._dispatch(header, body)
            except (KeyError, TypeError, ValueError, IllegalTransition) as exc:
                reply, reply_body = {"ok": False, "reason": f"bad request: {exc!r}"}, b""
            reply = {**reply, **session.reply_fields(header)}
            try:
                send_frame(sock, encode_frame(self.key, reply, reply_body))
            except OSError:
                return

    def _dispatch(self, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        kind, worker = header["kind"], str(header["worker"])
        if kind == "push":
            return self._on_push(worker, header, body), b""
        if kind == "pull":
            return self._on_pull(worker, int(header["step"]), float(header.get("wait_s", 60.0)))
        if kind == "snapshot":
            return self._on_snapshot(worker, float(header.get("wait_s", 60.0)))
        if kind == "loaded":
            with self._cond:
                self.coordinator.loaded(worker, int(header["aligned_through"]))
            return {"ok": True}, b""
        raise ValueError(f"unknown message kind {kind!r}")

    def _on_push(self, worker: str, header: dict[str, Any], body: bytes) -> dict[str, Any]:
        with self._cond:
            current = self._open
            m = current.membership
            step, version, epoch = int(header["step"]), int(header["version"]), int(header["epoch"])
            reason = None
            if step != m.step or current.closed:
                reason = f"step {step} is not open (open step {m.step}, closed={current.closed})"
            elif version != m.version:
                reason = f"version {version} != {m.version} of step {m.step}"
            elif epoch != m.epoch:
                reason = f"membership epoch {epoch} != {m.epoch}"
            elif worker not in m.active:
                reason = f"{worker} is not an active member of step {m.step}"
            elif worker in current.received:
                reason = f"duplicate payload from {worker} for step {m.step}"
            if reason is None:
                grad, reason = self._decode_payload(body)
                if grad is not None:
                    current.received[worker] = grad
                    self._cond.notify_all()
                    return {"ok": True}
            current.rejected.append((worker, reason))
        log.warning("side channel: rejected payload from %s: %s", worker, reason)
        return {"ok": False, "reason": reason}

    def _decode_payload(self, body: bytes) -> tuple[torch.Tensor | None, str]:
        """The flat gradient in an authenticated push body, or None and the reason it is refused."""
        try:
            tensors = bytes_to_tensors(body)
        except BodyError as exc:
            return None, f"payload {exc}"
        grad = tensors.get("grad")
        if grad is None or grad.dtype != self.dtype or grad.numel() != self.numel or len(tensors) != 1:
            return None, f"payload must hold one tensor 'grad' of {self.numel} {self.dtype} values"
        if not bool(grad.isfinite().all()):
            # One NaN would pass clipping (its norm is NaN) and poison every replica's weights and the
            # optimizer state for good.
            return None, "payload 'grad' holds non-finite values"
        return grad.reshape(-1), ""

    def _on_pull(self, worker: str, step: int, wait_s: float) -> tuple[dict[str, Any], bytes]:
        deadline = time.perf_counter() + min(wait_s, MAX_PULL_WAIT_S)
        with self._cond:
            while step not in self._log:
                oldest = next(iter(self._log), None)
                if oldest is not None and step < oldest:
                    self.coordinator.fail(worker, f"update {step} expired from the log (oldest {oldest})")
                    return {"ok": False, "reason": "expired"}, b""
                left = deadline - time.perf_counter()
                if left <= 0:
                    return {"ok": False, "reason": f"update {step} not published within {wait_s} s"}, b""
                self._cond.wait(left)
            update, nxt = self._log[step]
            self.coordinator.update_applied(worker, step)
            state = self.coordinator.state(worker)
        reply = {
            "ok": True,
            "step": step,
            "next_step": nxt.step,
            "next_version": nxt.version,
            "next_epoch": nxt.epoch,
            "active_next": worker in nxt.active,
            "state": state.value,
        }
        return reply, tensors_to_bytes({"update": update})

    def _on_snapshot(self, worker: str, wait_s: float) -> tuple[dict[str, Any], bytes]:
        deadline = time.perf_counter() + min(wait_s, MAX_PULL_WAIT_S)
        with self._cond:
            if self.coordinator.state(worker) is not HybridState.JOIN_REQUESTED:
                return {"ok": False, "reason": f"no join requested for {worker}"}, b""
            # A stale snapshot (stored before the log's oldest kept updates) would fail the join as
            # "expired" on its first pull: wait for the fresh one `wants_snapshot` asks the core for.
            while not self._snapshot_fresh():
                left = deadline - time.perf_counter()
                if left <= 0:
                    return {"ok": False, "reason": "no fresh snapshot within the wait"}, b""
                self._cond.wait(left)
            snap = self._snapshot
            assert snap is not None, "a fresh snapshot is a stored one"
            self.coordinator.snapshot_fetched(worker)
        if snap.encoded is None:
            snap.encoded = tensors_to_bytes(snap.tensors)
        return {"ok": True, "step": snap.step, "version": snap.version}, snap.encoded
