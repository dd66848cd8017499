"""Authenticated frames for the hybrid side channel: HMAC-SHA256 over a JSON header and raw bytes.

Frame layout (big-endian):

    MAGIC b"LBR1" | header_len u32 | body_len u64 | mac[32] | header (UTF-8 JSON) | body

mac = HMAC-SHA256(key, MAGIC | header_len | body_len | header | body). The receiver checks the
lengths against its limit, reads exactly that many bytes, and compares the MAC in constant time
(`hmac.compare_digest`) BEFORE it parses anything: neither the JSON header nor the body (tensors as
safetensors bytes, which has no code-execution path either) is decoded for an unauthenticated
frame; an authentic header that is not a JSON object raises HeaderError (a FrameError). Nothing
is ever unpickled. The key is a per-run secret handed to workers by the driver.

The MAC says who made a frame, not when: the header also carries the connection's `session` and a
`seq` number (libra_core/elastic/session.py), which is what stops a recorded frame being used again.
The header carries `kind`, `worker`, `step`, `version` and `epoch` as well; what each kind must match
is checked by the gateway (libra_core/elastic/gateway.py), not here.

Reads can be given a deadline (the gateway bounds a connection's hello and first request with one)
and frames are sent in 1 MiB pieces, so a socket timeout bounds each piece, not the whole frame.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAGIC = b"LBR1"
_PREFIX = struct.Struct(">4sIQ")
MAC_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024
# What a hybrid accepts in a reply's header: a pull reply carries the optimizer's hyperparameters
# (about 240 B of JSON per param group), so a core with layer-wise learning rates (hundreds of groups)
# sent headers over 64 KiB, and its hybrid died on its first pull after loading the whole snapshot
# (until 2026-12-07). The body's bound (the frame limit, 1 GiB by default) dominates the memory.
REPLY_MAX_HEADER_BYTES = 8 << 20
_CHUNK_BYTES = 1 << 20


class AuthError(ValueError):
    """The frame's MAC does not verify (wrong key, tampering, or truncation); nothing was parsed."""


class FrameError(ValueError):
    """The frame is malformed or over the size limit (rejected before any parsing)."""


class HeaderError(FrameError):
    """An authenticated frame whose header is not a UTF-8 JSON object (a key holder's bug)."""


class FrameCutError(ConnectionError):
    """The peer closed the connection in the middle of a frame (a close between frames is a plain
    ConnectionError: the end of a session)."""


class BodyError(ValueError):
    """An authenticated body that does not decode as safetensors tensors torch can hold."""


def _mac(key: bytes, prefix: bytes, header: bytes, body: bytes) -> bytes:
    h = hmac.new(key, prefix, hashlib.sha256)
    h.update(header)
    h.update(body)
    return h.digest()


def encode_frame(key: bytes, header: dict[str, Any], body: bytes = b"") -> bytes:
    raw_header = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    prefix = _PREFIX.pack(MAGIC, len(raw_header), len(body))
    return prefix + _mac(key, prefix, raw_header, body) + raw_header + body


def send_frame(sock: socket.socket, frame: bytes) -> None:
    """Send a frame in 1 MiB pieces: the socket's timeout then bounds each piece, not the whole frame."""
    view = memoryview(frame)
    for start in range(0, len(view), _CHUNK_BYTES):
        sock.sendall(view[start : start + _CHUNK_BYTES])


def _recv_exact(sock: socket.socket, n: int, deadline: float | None, *, in_frame: bool = True) -> bytes:
    """`n` bytes; `in_frame` False for a frame's first bytes, where a close before any is no cut."""
    chunks, remaining = [], n
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"frame not complete by its deadline ({remaining} of {n} bytes unread)")
            sock.settimeout(left)
        chunk = sock.recv(min(remaining, _CHUNK_BYTES))
        if not chunk:
            if in_frame or remaining < n:
                raise FrameCutError(f"peer closed the connection in a frame, {remaining} of {n} bytes unread")
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(
    sock: socket.socket,
    key: bytes,
    max_bytes: int,
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
    deadline: float | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Read one frame and return (header, body); raises AuthError/FrameError before decoding anything.

    `max_bytes` and `max_header_bytes` bound the body and header before they are read. `deadline`
    (a `time.monotonic()` value) bounds the whole frame; without it the socket's own timeout bounds
    each read. A timeout raises TimeoutError, a closed peer ConnectionError (FrameCutError once the
    frame has begun).
    """
    prefix = _recv_exact(sock, _PREFIX.size, deadline, in_frame=False)
    magic, header_len, body_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}; not a Libra side-channel frame")
    if header_len > max_header_bytes or body_len > max_bytes:
        raise FrameError(
            f"frame too large (header {header_len} B, body {body_len} B; "
            f"limits {max_header_bytes} B, {max_bytes} B)"
        )
    mac = _recv_exact(sock, MAC_BYTES, deadline)
    raw_header = _recv_exact(sock, header_len, deadline)
    body = _recv_exact(sock, body_len, deadline)
    return verify_frame(key, prefix, mac, raw_header, body), body


def verify_frame(key: bytes, prefix: bytes, mac: bytes, raw_header: bytes, body: bytes) -> dict[str, Any]:
    if not hmac.compare_digest(mac, _mac(key, prefix, raw_header, body)):
        raise AuthError("side-channel frame failed HMAC verification (wrong key or tampered bytes)")
    try:
        header = json.loads(raw_header)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HeaderError(f"authenticated frame header is not JSON: {exc!r}") from exc
    if not isinstance(header, dict):
        raise HeaderError("frame header must be a JSON object")
    return header


def decode_frame(key: bytes, frame: bytes, max_bytes: int) -> tuple[dict[str, Any], bytes]:
    """`read_frame` for a frame already in memory (tests, and non-socket transports)."""
    if len(frame) < _PREFIX.size + MAC_BYTES:
        raise FrameError("frame shorter than its fixed prefix")
    prefix = frame[: _PREFIX.size]
    magic, header_len, body_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}; not a Libra side-channel frame")
    if header_len > MAX_HEADER_BYTES or body_len > max_bytes:
        raise FrameError(f"frame too large (header {header_len} B, body {body_len} B, limit {max_bytes} B)")
    start = _PREFIX.size + MAC_BYTES
    if len(frame) != start + header_len + body_len:
        raise FrameError("frame length does not match its prefix")
    raw_header = frame[start : start + header_len]
    body = frame[start + header_len :]
    return verify_frame(key, prefix, frame[_PREFIX.size : start], raw_header, body), body


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def bytes_to_tensors(body: bytes) -> dict[str, torch.Tensor]:
    """Decode a safetensors body; call only on a body whose frame has been verified.

    Raises BodyError for any body the codec refuses: safetensors raises its own SafetensorError (not
    a ValueError) for a malformed header or offsets, and KeyError for a dtype torch has no name for.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(body)
    except (SafetensorError, KeyError, TypeError, ValueError) as exc:
        raise BodyError(f"body is not valid safetensors: {exc!r}") from exc
