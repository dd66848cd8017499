"""Replay protection for the hybrid side channel: one gateway-chosen session per TCP connection.

The MAC (libra_core/elastic/wire.py) proves a frame was made by a holder of the run key, not that it
is new: without this module, a frame recorded off the wire could be sent to the gateway again (an old
`pull` evicted an honest hybrid as "expired"; an old `snapshot` request took a later join's snapshot),
and a recorded reply could be handed to a hybrid in place of the answer to its request. So every
frame carries, inside the MAC, the session and sequence number it belongs to:

    hybrid  -> gateway  {"kind": "hello", "worker": W, "nonce": N}          first frame, no body
    gateway -> hybrid   {"kind": "hello_reply", "ok": true, "worker": W, "nonce": N, "session": S}
    hybrid  -> gateway  {"kind": K, "worker": W, "session": S, "seq": n, ...}    n = 1, 2, 3, ...
    gateway -> hybrid   {"kind": K + "_reply", "worker": W, "session": S, "seq": n, ["step"], ...}

S is 16 random bytes chosen by the gateway for this connection and never reused (the gateway holds
no list of old sessions: a random 128-bit id makes reuse negligible). The gateway acts on a frame
only if it carries this connection's S, its worker is the one that said hello, and its `seq` is
exactly one more than the previous frame's; anything else raises `ReplayError` before the frame's
message is looked at, and the gateway drops the connection. A hello changes no state, so replaying
one only opens a session the replayer cannot use without the key. N, the hybrid's random nonce, binds
the hello reply to this hello; the hybrid then checks that each reply has its request's kind, worker,
S, seq and, where the request named one, step (`ReplyMismatchError` otherwise).

What this does not do: every worker holds the same run key, so any key holder can say hello as any
worker id and act as that worker. The session stops parties without the key from reusing captured
frames; it does not separate workers from each other.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

HELLO = "hello"
_NONCE_BYTES = 16


class ReplayError(ValueError):
    """An authentic frame that is not the next frame of this connection's session (replayed from
    another connection, repeated or reordered, sent before a hello, or for another worker); the
    gateway has not acted on it."""


class ReplyMismatchError(RuntimeError):
    """An authentic reply that does not answer the request just sent (another kind, step, session or
    sequence number: a recorded reply played back); nothing from it was used."""


def _is_token(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 2 * _NONCE_BYTES:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


@dataclass
class ServerSession:
    """The gateway's side of one connection; a handler thread owns it (not shared between threads)."""

    worker: str
    client_nonce: str
    session: str
    last_seq: int = 0

    @classmethod
    def accept(cls, hello: dict[str, Any]) -> ServerSession:
        """Open a session from a connection's first (authenticated) frame, which must be a hello."""
        if hello.get("kind") != HELLO:
            raise ReplayError(
                f"first frame of a connection is {hello.get('kind')!r} from {hello.get('worker')!r}, "
                "not a hello: a frame of another connection's session"
            )
        worker, nonce = hello.get("worker"), hello.get("nonce")
        if not isinstance(worker, str) or not worker or not _is_token(nonce):
            raise ReplayError(f"hello needs a worker id and a {_NONCE_BYTES}-byte hex nonce, got {hello!r}")
        assert isinstance(nonce, str)
        return cls(worker, nonce, secrets.token_hex(_NONCE_BYTES))

    def hello_reply(self) -> dict[str, Any]:
        return {
            "kind": f"{HELLO}_reply",
            "ok": True,
            "worker": self.worker,
            "nonce": self.client_nonce,
            "session": self.session,
        }

    def check(self, header: dict[str, Any]) -> None:
        """Accept `header` as the session's next frame or raise `ReplayError`; call before acting on it."""
        seq = header.get("seq")
        if header.get("session") != self.session:
            raise ReplayError(
                f"frame {header.get('kind')!r} from {header.get('worker')!r} carries session "
                f"{header.get('session')!r}, not this connection's"
            )
        if header.get("worker") != self.worker:
            raise ReplayError(f"frame for {header.get('worker')!r} in the session of {self.worker!r}")
        if type(seq) is not int or seq != self.last_seq + 1:
            raise ReplayError(
                f"frame {header.get('kind')!r} from {self.worker!r} has sequence number {seq!r}; "
                f"the session expects {self.last_seq + 1} (a repeated or reordered frame)"
            )
        self.last_seq = seq

    def reply_fields(self, header: dict[str, Any]) -> dict[str, Any]:
        """What every reply carries so the hybrid can match it to `header` (its request)."""
        fields = {
            "kind": f"{header.get('kind')}_reply",
            "worker": self.worker,
            "session": self.session,
            "seq": self.last_seq,
        }
        if "step" in header:
            fields["step"] = header["step"]
        return fields


class ClientSession:
    """The hybrid's side of one connection: numbers its requests and checks each reply against them."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.nonce = secrets.token_hex(_NONCE_BYTES)
        self.session: str | None = None
        self.seq = 0

    def hello(self) -> dict[str, Any]:
        return {"kind": HELLO, "worker": self.worker, "nonce": self.nonce}

    def bind(self, reply: dict[str, Any]) -> None:
        """Adopt the session from the gateway's reply to our hello."""
        expected = {"kind": f"{HELLO}_reply", "ok": True, "worker": self.worker, "nonce": self.nonce}
        _raise_on_mismatch("hello", expected, reply)
        if not _is_token(reply.get("session")):
            raise ReplyMismatchError(f"hello reply for {self.worker} has no session id: {reply!r}")
        self.session = reply["session"]

    def request(self, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The header of the next request (its own kind, worker, session and seq override `fields`)."""
        assert self.session is not None, "say hello (bind a session) before sending requests"
        self.seq += 1
        return {**fields, "kind": kind, "worker": self.worker, "session": self.session, "seq": self.seq}

    def check_reply(self, request: dict[str, Any], reply: dict[str, Any]) -> None:
        expected = {
            "kind": f"{request['kind']}_reply",
            "worker": self.worker,
            "session": self.session,
            "seq": request["seq"],
        }
        if "step" in request:
            expected["step"] = request["step"]
        _raise_on_mismatch(f"{request['kind']} (seq {request['seq']})", expected, reply)


def _raise_on_mismatch(what: str, expected: dict[str, Any], reply: dict[str, Any]) -> None:
    wrong = [
        f"{k}={reply.get(k)!r} (expected {v!r})"
        for k, v in expected.items()
        if reply.get(k) != v or type(reply.get(k)) is not type(v)
    ]
    if wrong:
        raise ReplyMismatchError(
            f"reply to {what} of {expected['worker']} does not answer that request: {', '.join(wrong)}"
        )
