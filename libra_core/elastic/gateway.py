"""The side-channel gateway on core rank 0: hybrid gradients in, averaged updates and snapshots out.

Hybrids never join the core's process group (its communicators are built once and never rebuilt).
Instead each talks to this TCP server over authenticated frames (libra_core/elastic/wire.py). Core
rank 0 is the only core rank that sees hybrid gradients: it adds their sum to its own gradient and
their count to the divisor carried in the core all-reduce (libra_core/elastic/replica.py), so every
core rank applies the same update without knowing hybrids exist. Connections, handshakes, sessions and
their limits are the server layer's (libra_core/elastic/server.py); this module holds the requests.

Call context: the core training loop on rank 0 calls `collect` then `publish` once per step, in that
order, or `collect` then `abandon` when the step failed in between (nothing applied); handler
threads (one per hybrid connection) call into the coordinator under one lock.

Joins (which connection serves which join, snapshots in parts, and when an abandoned join fails)
are the join desk's (libra_core/elastic/joins.py); a request on a connection bound to an earlier
join of its worker changes nothing and is answered `ended`.

Message kinds and their checks (a failed check is a typed rejection, logged and counted, never a crash):

- `snapshot` (wait_s, part_bytes): for a worker whose join was requested; binds the connection to the
  join, waits for a fresh snapshot (model, optimizer state and hyperparameters), and replies with
  its step, version, size and number of parts (each at most `part_bytes`, under the hybrid's frame
  limit), and part 0; one not ready within `wait_s` is refused with `retry` (the hybrid asks again
  on the same connection; its join goes on).
- `snapshot_part` (index): the next part of that snapshot. The join moves to LOADING only once the
  last part has been sent.
- `loaded` (aligned_through): the worker has loaded the snapshot and starts replaying updates.
- `pull` (step, wait_s): blocks until update `step` is published; replies with the update, the
  optimizer hyperparameters it was applied with, and whether the worker is active in step+1. An
  update older than the log is `expired` (the join fails); one not published within `wait_s` is
  refused with `retry` (the hybrid pulls again; its join goes on).
- `push` (step, version, epoch, grad): accepted only for the open step, at its frozen version and
  membership epoch, from a member still ACTIVE (or LEAVING) on the connection serving its current
  join (not one that failed in the step and is joining again), once, with a
  body that decodes as one finite tensor of the expected size and dtype, with a finite norm.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from libra_core.elastic.joins import SNAPSHOT_PART_BYTES, JoinDesk, ended, why_over
from libra_core.elastic.membership import Coordinator, Membership
from libra_core.elastic.server import HELLO_MAX_HEADER_BYTES, Reply, SideChannelServer
from libra_core.elastic.session import ServerSession
from libra_core.elastic.snapshot import Hyperparams, Snapshot
from libra_core.elastic.state_machine import TRAINING_SIDE, HybridState, IllegalTransition
from libra_core.elastic.wire import BodyError, bytes_to_tensors, tensors_to_bytes

if TYPE_CHECKING:
    import torch

_PAYING = (HybridState.ACTIVE, HybridState.LEAVING)  # the states that send a step's gradient

__all__ = ["HELLO_MAX_HEADER_BYTES", "MAX_PULL_WAIT_S", "Gateway", "StepCollection"]

log = logging.getLogger(__name__)

MAX_PULL_WAIT_S = 120.0
_PAYLOAD_OVERHEAD_BYTES = 1024  # a one-tensor safetensors header, rounded up


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
class _Open:
    membership: Membership
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False


@dataclass(frozen=True)
class _Published:
    update: torch.Tensor
    next_membership: Membership
    param_groups: Hyperparams | None  # the optimizer hyperparameters the update was applied with


class Gateway(SideChannelServer):
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
        join_timeout_s: float = 600.0,
    ) -> None:
        """`handshake_timeout_s` bounds a new connection until its first authenticated request (the
        only time a peer without the key holds a thread); `idle_timeout_s` bounds each read on an open
        session, so it must exceed the longest gap between a hybrid's frames (its gradient computation
        between a pull and a push); `max_connections` caps connections served at once (hybrids plus
        any unauthenticated peers); `join_timeout_s` is how long a requested join may wait for a
        connection to ask for its snapshot (its training loop queued or dead) before it fails."""
        assert update_log_steps >= 2, (
            f"update_log_steps={update_log_steps}: a join replays from a snapshot taken within half the "
            "log, so the log must keep at least 2 updates (Gateway(update_log_steps=...))"
        )
        assert join_timeout_s > 0, "join_timeout_s must be positive"
        payload_bytes = numel * dtype.itemsize + _PAYLOAD_OVERHEAD_BYTES
        if payload_bytes > max_frame_bytes:
            raise ValueError(
                f"a gradient of {numel} {dtype} values is a {payload_bytes / 2**20:.1f} MiB frame, over the "
                f"side channel's frame limit of {max_frame_bytes / 2**20:.1f} MiB: raise the Gateway's "
                f"max_frame_bytes to at least {-(-payload_bytes // 2**20)} MiB (gradients and updates "
                "travel as one frame each; snapshots are sent in parts)"
            )
        super().__init__(
            key,
            max_frame_bytes=max_frame_bytes,
            handshake_timeout_s=handshake_timeout_s,
            idle_timeout_s=idle_timeout_s,
            max_connections=max_connections,
        )
        # Import the codec now: a first import on a handler thread would hold the GIL during a core step.
        import safetensors.torch  # noqa: F401

        self.coordinator, self.numel, self.dtype = coordinator, numel, dtype
        self.update_bytes = payload_bytes  # the largest body a hybrid receives (an update frame)
        self._closed = False
        self.deadline_s, self.update_log_steps = deadline_s, update_log_steps
        self._cond = threading.Condition()
        self._open = _Open(coordinator.current)
        self._log: OrderedDict[int, _Published] = OrderedDict()
        self.joins = JoinDesk(
            coordinator,
            self._cond,
            update_log_steps=update_log_steps,
            join_timeout_s=join_timeout_s,
            closed=lambda: self._closed,
        )
        self._start_server(host, port)

    # ------------------------------------------------------------------ control (plan applier, rank 0)

    def request_join(self, worker_id: str) -> None:
        with self._cond:
            self.coordinator.request_join(worker_id)
            self.joins.requested(worker_id)
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
        """True when a join waits for a snapshot and there is none recent enough to replay from."""
        with self._cond:
            return self.joins.wants_snapshot(self._open.membership.step)

    def set_snapshot(self, tensors: dict[str, torch.Tensor], *, step: int, version: int) -> None:
        """Store host copies of the state to serve (the core waits for the copy from its device);
        encoding happens on a handler thread, off the core's path."""
        # In host memory: on the core's GPU a model + optimizer copy stayed for the rest of the run.
        snap = Snapshot(step, version, {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()})
        with self._cond:
            self.joins.snapshot = snap
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

            def owed() -> set[str]:
                # A frozen member that failed meanwhile (a LEAVING one whose connection ended; an
                # ACTIVE one's end fails nothing, so it is waited for to the deadline), or was failed
                # and asked to join again, owes this step nothing: it is not waited for, and its new
                # join is not failed here (until 2026-12-06 both: a healthy rejoin was rolled back
                # as "missed the payload deadline" after the core waited the whole deadline).
                pending = m.active - set(current.received)
                return {w for w in pending if self.coordinator.state(w) in _PAYING}

            while owed() and (left := deadline - time.perf_counter()) > 0:
                self._cond.wait(left)  # every failure of a member notifies
            current.closed = True  # from here on, payloads for this step are late
            included = tuple(sorted(current.received))
            missing = tuple(sorted(m.active - set(current.received)))
            for worker_id in sorted(owed()):
                self.coordinator.fail(worker_id, f"missed the payload deadline of step {step}")
            import torch

            # Half precision is summed in fp32 (a sum of accepted fp16 payloads overflowed where
            # their average did not, until 2026-12-07); `DDPBackend.reduce` takes either dtype.
            wide = torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype
            total = None
            for worker_id in included:
                grad = current.received[worker_id]
                total = grad.to(wide, copy=True) if total is None else total.add_(grad)
            rejected = tuple(current.rejected)
        if missing:
            log.warning(
                "step %d completes without hybrids %s (deadline %.2f s)", step, missing, self.deadline_s
            )
        return total, StepCollection(step, m, included, missing, rejected, time.perf_counter() - t0)

    def publish(
        self, step: int, update: torch.Tensor, next_version: int, param_groups: Hyperparams | None = None
    ) -> Membership:
        """Log the applied update of `step` (and the optimizer hyperparameters it was applied with),
        freeze and open the membership of step+1, and fail joins nobody came for."""
        with self._cond:
            needed = self._log_needed()  # before the freeze: a hybrid leaving now pulls this update
            nxt = self.coordinator.freeze_next(step, next_version)
            if needed or self._log_needed():
                # In host memory, and only while a hybrid may pull it: until 2026-12-07 every step
                # kept a copy on the core's device, `update_log_steps` of them even with no hybrid
                # (64 x 4 B per parameter: 256 GB for 1B fp32 parameters).
                self._log[step] = _Published(update.detach().to("cpu", copy=True), nxt, param_groups)
                while len(self._log) > self.update_log_steps:
                    self._log.popitem(last=False)
            else:  # the newest stays: the update a hybrid that just left may still be pulling
                while len(self._log) > 1:
                    self._log.popitem(last=False)
                self.joins.snapshot = None  # no join to serve: the next one asks for a new snapshot
            self._open = _Open(nxt)
            self.joins.expire()
            self._cond.notify_all()
        return nxt

    def abandon(self, step: int, reason: str) -> Membership:
        """Close the books on `step` after the core's step failed between `collect` and `publish`
        (a non-finite reduced gradient: nothing was applied, so the core's model is still at the
        step's version), and open it again. Every hybrid on the training side fails with `reason`:
        its waiting and later pulls and snapshot requests are answered `ended` with that reason (a
        failed step is never published, so until 2026-12-07 they were answered `retry` for ever, and
        the core's retry of the step failed `collect`'s check). The step opens again at the same
        version with no hybrid in it: the core may take it again (on another batch), or stop; a
        hybrid asked to join again starts from a new snapshot."""
        with self._cond:
            current = self._open
            m = current.membership
            assert m.step == step and current.closed, (
                f"abandon(step={step}) does not match the collected step {m.step} (closed={current.closed})"
            )
            for worker_id, life in self.coordinator.hybrids.items():
                if life.state in TRAINING_SIDE:
                    self.coordinator.fail(worker_id, f"core step {step} failed: {reason}")
            # The boundary after update step-1 again: with every hybrid failed, nobody is active.
            self._open = _Open(self.coordinator.freeze_next(step - 1, m.version))
            self._cond.notify_all()
            return self._open.membership

    def _log_needed(self) -> bool:
        """Whether a hybrid may pull an update published now: one is joining, training or leaving
        (every state but ROLLOUT pulls, or will once it has loaded a snapshot)."""
        return any(life.state is not HybridState.ROLLOUT for life in self.coordinator.hybrids.values())

    def close(self) -> None:
        """Stop serving: waiting pulls return, open connections are shut (their hybrids see the
        end), then the server stops (SideChannelServer.close)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()

    # ------------------------------------------------------------------ hybrid side (handler threads)

    def _report_dropped(self, label: str, reason: str) -> None:
        with self._cond:
            self._open.rejected.append((label, reason))

    def _connection_ended(self, session: ServerSession) -> None:
        self.joins.connection_ended(session)

    def _handle(self, session: ServerSession, header: dict[str, Any], body: bytes) -> Reply:
        try:
            return self._dispatch(session, header, body)
        # OverflowError: int() of an Infinity in the JSON header (it killed the handler thread)
        except (KeyError, TypeError, ValueError, OverflowError, IllegalTransition) as exc:
            return Reply({"ok": False, "reason": f"bad request: {exc!r}"})

    def _dispatch(self, session: ServerSession, header: dict[str, Any], body: bytes) -> Reply:
        kind = header["kind"]
        if kind == "push":
            return Reply(self._on_push(session, header, body))
        if kind == "pull":
            return self._on_pull(session, int(header["step"]), _wait_s(header))
        if kind == "snapshot":
            part_bytes = int(header.get("part_bytes", SNAPSHOT_PART_BYTES))
            return self.joins.on_snapshot(
                session, _wait_s(header), part_bytes, lambda: self._open.membership.step, self.update_bytes
            )
        if kind == "snapshot_part":
            return self.joins.on_snapshot_part(session, int(header["index"]))
        if kind == "loaded":
            return Reply(self.joins.on_loaded(session, int(header["aligned_through"])))
        raise ValueError(f"unknown message kind {kind!r}")

    def _on_push(self, session: ServerSession, header: dict[str, Any], body: bytes) -> dict[str, Any]:
        worker = session.worker
        step, version, epoch = int(header["step"]), int(header["version"]), int(header["epoch"])
        with self._cond:
            reason = self._push_refusal(session, step, version, epoch)
            current = self._open  # a refusal goes to the report of the step it was for
        grad = None
        if reason is None:
            # Decoded and checked outside the lock (a safetensors load, isfinite and a norm: ~0.3 s
            # for 191 MiB): under it, `collect`, `publish` and every other hybrid's requests waited,
            # and hybrids' payloads were decoded one after another (until 2026-12-07).
            grad, reason = self._decode_payload(body)
        with self._cond:
            if grad is not None:
                reason = self._push_refusal(session, step, version, epoch)  # the step may have closed
                if reason is None:
                    self._open.received[worker] = grad
                    self._cond.notify_all()
                    return {"ok": True}
            assert reason is not None
            current.rejected.append((worker, reason))
        log.warning("side channel: rejected payload from %s: %s", worker, reason)
        return {"ok": False, "reason": reason}

    def _push_refusal(self, session: ServerSession, step: int, version: int, epoch: int) -> str | None:
        """Why a push for (step, version, epoch) on `session` is refused now, or None (under the lock)."""
        worker = session.worker
        current = self._open
        m = current.membership
        join = self.joins.join_of(session)
        if step != m.step or current.closed:
            return f"step {step} is not open (open step {m.step}, closed={current.closed})"
        if version != m.version:
            return f"version {version} != {m.version} of step {m.step}"
        if epoch != m.epoch:
            return f"membership epoch {epoch} != {m.epoch}"
        if worker not in m.active:
            return f"{worker} is not an active member of step {m.step}"
        if join is None or self.joins.superseded(join):
            return f"this connection does not serve {worker}'s current join"
        state = self.coordinator.state(worker)
        if state not in _PAYING:  # failed in this step and joining again: it has no weights to train
            return f"{worker} is {state.value}, not a member that trains step {m.step}"
        if worker in current.received:
            return f"duplicate payload from {worker} for step {m.step}"
        return None

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
        import torch  # loaded already (the codec is torch's)

        if not math.isfinite(float(torch.linalg.vector_norm(grad))):
            # Finite values whose norm overflows (1e18 on each of 1,000 float32 values) made the
            # reduced norm inf: clipping then stopped every core rank, mid-step, for good.
            return None, "payload 'grad' has a norm too large for its dtype"
        return grad.reshape(-1), ""

    def _on_pull(self, session: ServerSession, step: int, wait_s: float) -> Reply:
        """Update `step` for the connection's join (its state changes only for a bound connection;
        one that fetched no snapshot just reads the log)."""
        worker = session.worker
        deadline = time.perf_counter() + min(wait_s, MAX_PULL_WAIT_S)
        with self._cond:
            join = self.joins.join_of(session)
            life = self.coordinator.lifecycle(worker)
            while step not in self._log:
                if self._closed:
                    return Reply({"ok": False, "reason": "the gateway closed"})
                if over := self.joins.superseded(join):
                    return Reply(ended(over))
                if join is not None and life.state is HybridState.ROLLOUT:
                    return Reply(ended(why_over(life)))
                oldest = next(iter(self._log), None)
                # Before the open step and not in the log: trimmed, or published while no hybrid
                # needed a copy; it never comes (a pull for it was answered `retry` for ever).
                if (oldest is not None and step < oldest) or step < self._open.membership.step:
                    if join is not None:
                        self.coordinator.fail(worker, f"update {step} expired from the log (oldest {oldest})")
                        self._cond.notify_all()  # a step's close may be waiting for its payload
                    return Reply({"ok": False, "reason": "expired"})
                left = deadline - time.perf_counter()
                if left <= 0:
                    # A core step may outlast a pull's wait (an agentic update often does): the
                    # hybrid pulls again (`retry`). Until 2026-12-06 this failed a warming join, so
                    # no hybrid could join a core whose steps took over a minute; the join fails
                    # when its connection ends instead (joins.py).
                    reason = f"update {step} not published within {wait_s} s"
                    return Reply({"ok": False, "reason": reason, "retry": True})
                self._cond.wait(left)
            if over := self.joins.superseded(join):
                return Reply(ended(over))
            published = self._log[step]
            if join is not None:
                self.coordinator.update_applied(worker, step)
            state = life.state
        nxt = published.next_membership
        reply: dict[str, Any] = {
            "ok": True,
            "step": step,
            "next_step": nxt.step,
            "next_version": nxt.version,
            "next_epoch": nxt.epoch,
            "active_next": worker in nxt.active,
            "state": state.value,
        }
        if published.param_groups is not None:
            reply["param_groups"] = published.param_groups
        return Reply(reply, tensors_to_bytes({"update": published.update}))


def _wait_s(header: dict[str, Any]) -> float:
    """A request's `wait_s`, at most MAX_PULL_WAIT_S. A NaN passed every bound check, so the wait
    loop spun on the gateway lock, beside the core's step, until the update came."""
    wait_s = float(header.get("wait_s", 60.0))
    if not math.isfinite(wait_s) or wait_s < 0:
        raise ValueError(f"wait_s must be a finite number >= 0, got {wait_s}")
    return min(wait_s, MAX_PULL_WAIT_S)
