"""The hybrid's end of the side channel: one persistent, authenticated connection to the gateway.

Used by the hybrid training loop (libra_core/elastic/replica.py) from a single thread. Connecting
says hello and adopts the session the gateway picks (libra_core/elastic/session.py); each method then
sends one numbered frame and reads one reply frame, whose MAC is verified before its header or tensors
are parsed (AuthError otherwise), and which must answer that request: the same kind, worker, session,
sequence number and step, or ReplyMismatchError is raised and nothing from the reply is used (a
recorded reply played back could otherwise make `run_hybrid` apply an update twice).

The snapshot arrives in parts no larger than this client's frame limit (`snapshot` asks for them in
order and joins them), so its size is not capped by any one frame. A refused `snapshot` or `loaded`
raises `JoinEndedError`: the gateway has ended (or never had) the join this connection asked for.
A snapshot (or, in `run_hybrid`, an update) still refused with `retry` after `max_wait_s` raises
TimeoutError: a core that stopped stepping without ending the join must not hold the hybrid for ever.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from libra_core.elastic.session import ClientSession
from libra_core.elastic.wire import (
    REPLY_MAX_HEADER_BYTES,
    bytes_to_tensors,
    encode_frame,
    read_frame,
    send_frame,
    tensors_to_bytes,
)

if TYPE_CHECKING:
    import torch


class JoinEndedError(RuntimeError):
    """The gateway refused a join step (`snapshot`, `loaded`): the join was cancelled, failed, or
    superseded by a later one, or never requested. Nothing more is to be done for it on this connection."""


class GatewayClient:
    def __init__(
        self,
        address: tuple[str, int],
        key: bytes,
        worker_id: str,
        *,
        timeout_s: float = 150.0,
        max_frame_bytes: int = 1 << 30,
        pull_wait_s: float = 60.0,
        max_wait_s: float = 1800.0,
    ) -> None:
        self.key, self.worker_id, self.max_frame_bytes = key, worker_id, max_frame_bytes
        # How long one pull waits for its update (the gateway caps it at MAX_PULL_WAIT_S); a core
        # step that takes longer answers `retry`, and run_hybrid pulls again.
        self.pull_wait_s = pull_wait_s
        # How long one snapshot or update is asked for again (`retry`) before TimeoutError: longer
        # than the slowest core step. A failed core step ends the join (`ended`); only a core that
        # hangs without failing (a stuck collective, a stopped process whose socket stays open)
        # leaves the hybrid asking, and until 2026-12-07 it asked for ever.
        assert max_wait_s > 0, f"max_wait_s must be positive, got {max_wait_s}"
        self.max_wait_s = max_wait_s
        self._session = ClientSession(worker_id)
        self._sock = socket.create_connection(address, timeout=timeout_s)
        try:
            send_frame(self._sock, encode_frame(key, self._session.hello()))
            reply, _ = read_frame(self._sock, key, 0)
            self._session.bind(reply)
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def request(self, kind: str, body: bytes = b"", **fields: Any) -> tuple[dict[str, Any], bytes]:
        """Send one request and return the reply that answers it (ReplyMismatchError otherwise)."""
        header = self._session.request(kind, fields)
        send_frame(self._sock, encode_frame(self.key, header, body))
        reply, reply_body = read_frame(
            self._sock, self.key, self.max_frame_bytes, max_header_bytes=REPLY_MAX_HEADER_BYTES
        )
        self._session.check_reply(header, reply)
        return reply, reply_body

    def snapshot(self, wait_s: float = 60.0) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Fetch the join's snapshot (every part, in order); return the first reply and its tensors.
        Asks again while the reply says `retry`, for at most `max_wait_s` (then TimeoutError)."""
        deadline = time.monotonic() + self.max_wait_s
        reply, body = self.request("snapshot", wait_s=wait_s, part_bytes=self.max_frame_bytes)
        while reply.get("retry"):  # the core's step outlasted the wait: it goes on, so does the join
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no snapshot for {self.worker_id} within max_wait_s={self.max_wait_s} s "
                    f"(last reply: {reply.get('reason')})"
                )
            reply, body = self.request("snapshot", wait_s=wait_s, part_bytes=self.max_frame_bytes)
        if not reply.get("ok"):
            raise JoinEndedError(f"snapshot refused for {self.worker_id}: {reply.get('reason')}")
        parts = [body]
        for index in range(1, int(reply["parts"])):
            part_reply, part = self.request("snapshot_part", index=index)
            if not part_reply.get("ok"):
                raise JoinEndedError(
                    f"snapshot part {index} refused for {self.worker_id}: {part_reply.get('reason')}"
                )
            parts.append(part)
        encoded = b"".join(parts)
        del parts
        if len(encoded) != int(reply["bytes"]):
            raise ValueError(
                f"snapshot for {self.worker_id} has {len(encoded)} bytes in {reply['parts']} parts, "
                f"the gateway announced {reply['bytes']}"
            )
        return reply, bytes_to_tensors(encoded)

    def loaded(self, aligned_through: int) -> None:
        reply, _ = self.request("loaded", aligned_through=aligned_through)
        if not reply.get("ok"):
            raise JoinEndedError(f"loaded refused for {self.worker_id}: {reply.get('reason')}")

    def push(self, grad: torch.Tensor, *, step: int, version: int, epoch: int) -> dict[str, Any]:
        body = tensors_to_bytes({"grad": grad.reshape(-1)})
        reply, _ = self.request("push", body, step=step, version=version, epoch=epoch)
        return reply

    def pull(self, step: int, wait_s: float | None = None) -> tuple[dict[str, Any], torch.Tensor | None]:
        wait = self.pull_wait_s if wait_s is None else wait_s
        reply, body = self.request("pull", step=step, wait_s=wait)
        return reply, (bytes_to_tensors(body)["update"] if reply.get("ok") else None)
