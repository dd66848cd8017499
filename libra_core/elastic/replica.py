"""Core and hybrid replicas of the Elastic Hybrid Pool, and the exact averaging rule they share.

Averaging rule for step s. Let K be the core size and A_s the active hybrids frozen for step s, and
R_s ⊆ A_s those whose payload passed every check before the deadline. Each replica r computes g_r,
the gradient of its mean loss on its own shard, at the step's version. Core rank 0 adds
sum_{h in R_s} g_h to g_0 and 1 + |R_s| to its count; one all-reduce over the core group of
[g, count] gives, on every core rank,

    update_s = (sum_{k < K} g_k + sum_{h in R_s} g_h) / (K + |R_s|)

which is then clipped (torch's clip_grad_norm_ formula on the averaged vector) and applied, and
published to the hybrids, which apply the same vector. So step s equals a static data-parallel job of
K + |R_s| replicas on the same shards. Warming (joining) hybrids are not in A_s: they contribute
nothing and are not counted; they only apply published updates (zero-gradient steps). A missing or
late hybrid is not in R_s: the step completes at the deadline with K + |R_s| in the divisor, as if
that replica's shard had not been part of the step, and the hybrid is evicted from later steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from libra_core.elastic.client import GatewayClient, JoinEndedError
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.snapshot import (
    apply_hyperparams,
    load_state_tensors,
    optimizer_hyperparams,
    state_tensors,
)
from libra_core.elastic.state_machine import LOOP_STATES
from libra_core.training.backends.ddp import DDPBackend
from libra_core.training.backends.flat import clip_flat_, flat_grad, set_flat_grad, trainable

if TYPE_CHECKING:
    import torch

__all__ = [
    "CoreReplica",
    "CoreStepReport",
    "HybridReport",
    "load_state_tensors",
    "run_hybrid",
    "state_tensors",
]

log = logging.getLogger(__name__)

LossFn = Callable[["torch.nn.Module", int], "torch.Tensor"]  # (model, step) -> mean loss on own shard


@dataclass(frozen=True)
class CoreStepReport:
    step: int
    loss: float  # this rank's local loss
    divisor: int  # K + |R_s|
    epoch: int
    included: tuple[str, ...]  # hybrids in the sum (rank 0 only)
    missing: tuple[str, ...]
    rejected: tuple[tuple[str, str], ...]
    hybrid_wait_s: float  # rank 0's wait for hybrid payloads
    step_s: float  # wall time of the whole step on this rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CoreReplica:
    """One core training rank; rank 0 also runs the gateway (pass `gateway` only there)."""

    def __init__(
        self,
        backend: DDPBackend,
        *,
        gateway: Gateway | None = None,
        grad_clip: float | None = None,
        start_step: int = 0,
        start_version: int = 0,
    ) -> None:
        self.backend, self.gateway, self.grad_clip = backend, gateway, grad_clip
        self.step_index, self.version = start_step, start_version
        self._maybe_snapshot()

    def _maybe_snapshot(self) -> None:
        if self.gateway is not None and self.gateway.wants_snapshot():
            tensors = state_tensors(self.backend.model, self.backend.optimizer)
            self.gateway.set_snapshot(tensors, step=self.step_index, version=self.version)

    def step(self, loss_fn: LossFn) -> CoreStepReport:
        """Take step `step_index` on every core rank (each calls it once per step, in lockstep).

        A reduced gradient that is not finite raises FloatingPointError before any weight changes
        (every rank reduced the same sum, so every rank raises). Then, as after any error between
        the backward and the apply, the step is left undone and clean: the gradient is dropped, the
        backend takes a new backward, `step_index` and `version` stay, and on rank 0 the gateway
        fails every hybrid on the training side with the error (their pulls are answered `ended`)
        and opens the step again (`Gateway.abandon`). The caller may call `step` again (on another
        batch; all ranks must) or stop; hybrids rejoin only when the plan asks them to.
        """
        t0 = time.perf_counter()
        model, step = self.backend.model, self.step_index
        loss = loss_fn(model, step)
        self.backend.backward(loss)
        extra, collection = None, None
        try:
            local = flat_grad(trainable(model))
            if self.gateway is not None:
                extra, collection = self.gateway.collect(step, self.version)
            count = len(collection.included) if collection else 0
            if extra is not None:  # decoded from the wire on the CPU; the core may train on a GPU
                extra = extra.to(local.device)
            update, divisor = self.backend.reduce(local, extra_sum=extra, extra_count=count)
            # A non-finite norm raises FloatingPointError here, before any weight changes; every
            # replica reduced the same sum, so every one stops.
            clip_flat_(update, self.grad_clip, what=f"core step {step}: the reduced gradient")
            hyper = optimizer_hyperparams(self.backend.optimizer) if self.gateway is not None else None
            self.backend.apply(update)
        except BaseException as exc:
            # Until 2026-12-07 a failed step kept its gradient and the backend's pending backward (a
            # retry raised "backward() called twice"), and rank 0's gateway kept the step closed and
            # unpublished: the retry failed `collect`'s check and every hybrid pulled `retry` for ever.
            self.backend.optimizer.zero_grad(set_to_none=True)
            self.backend._backward_pending = False  # as DDPBackend.step does after a failed step
            if self.gateway is not None and collection is not None:
                self.gateway.abandon(step, f"{type(exc).__name__}: {exc}")
            raise
        self.version += 1
        self.step_index += 1
        epoch = collection.membership.epoch if collection else 0
        if self.gateway is not None:
            self._maybe_snapshot()
            self.gateway.publish(step, update, self.version, param_groups=hyper)
        return CoreStepReport(
            step=step,
            loss=float(loss.detach()),
            divisor=divisor,
            epoch=epoch,
            included=collection.included if collection else (),
            missing=collection.missing if collection else (),
            rejected=collection.rejected if collection else (),
            hybrid_wait_s=collection.wait_s if collection else 0.0,
            step_s=time.perf_counter() - t0,
        )


@dataclass
class HybridReport:
    worker_id: str
    snapshot_step: int
    load_s: float  # request -> snapshot loaded (fetch + decode + load)
    contributed_steps: list[int] = field(default_factory=list)
    replayed_steps: list[int] = field(default_factory=list)  # zero-gradient steps (updates applied)
    rejections: list[tuple[int, str]] = field(default_factory=list)
    final_state: str = ""
    final_step: int = 0  # next step the replica would take

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_hybrid(
    client: GatewayClient,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    *,
    step_delay_s: Callable[[int], float] | None = None,
) -> HybridReport:
    """Join (snapshot -> replay -> active), train until left, cancelled or failed; return what happened.

    The loop runs while the gateway reports the worker WARMING, ACTIVE or LEAVING, and ends on any
    other state, on a refused pull (one refused with `retry`, a core step that outlasted the wait,
    is pulled again, for at most the client's `max_wait_s`, then TimeoutError), or when the gateway
    says this join is over (`ended`: cancelled, failed, which includes a failed core step, or
    superseded by a later join of the same worker, which then goes on without this loop).
    `final_state` is the last state seen, or "ended: <reason>" / "failed: <reason>". If anything here
    raises, the connection is closed first, so the gateway fails the join at once rather than after
    its idle timeout. `step_delay_s(step)` is a fault-injection hook for tests and benchmarks.
    """
    try:
        return _run_hybrid(client, model, optimizer, loss_fn, step_delay_s)
    except BaseException:
        client.close()
        raise


def _run_hybrid(
    client: GatewayClient,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    step_delay_s: Callable[[int], float] | None,
) -> HybridReport:
    t0 = time.perf_counter()
    try:
        header, tensors = client.snapshot()
        load_state_tensors(model, optimizer, tensors)
        del tensors
        step, version = int(header["step"]), int(header["version"])
        client.loaded(aligned_through=step - 1)
    except JoinEndedError as exc:
        log.info("hybrid %s: %s", client.worker_id, exc)
        return HybridReport(client.worker_id, -1, time.perf_counter() - t0, final_state=f"ended: {exc}")
    report = HybridReport(client.worker_id, step, time.perf_counter() - t0)
    params = trainable(model)
    active, epoch = False, -1
    while True:
        if active:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model, step).backward()
            if step_delay_s is not None:
                time.sleep(step_delay_s(step))
            reply = client.push(flat_grad(params), step=step, version=version, epoch=epoch)
            if reply.get("ok"):
                report.contributed_steps.append(step)
            else:
                report.rejections.append((step, str(reply.get("reason"))))
        else:
            report.replayed_steps.append(step)
        deadline = time.monotonic() + client.max_wait_s
        reply, update = client.pull(step)
        while reply.get("retry"):  # the core's step outlasted the wait: it goes on, so does the join
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"hybrid {client.worker_id}: update {step} not published within max_wait_s="
                    f"{client.max_wait_s} s (last reply: {reply.get('reason')})"
                )
            reply, update = client.pull(step)
        if not reply.get("ok") or update is None:
            report.final_state = f"{'ended' if reply.get('ended') else 'failed'}: {reply.get('reason')}"
            break
        set_flat_grad(params, update)
        if reply.get("param_groups") is not None:
            apply_hyperparams(optimizer, reply["param_groups"])  # the lr etc. the core applied it with
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step, version = int(reply["next_step"]), int(reply["next_version"])
        active, epoch = bool(reply["active_next"]), int(reply["next_epoch"])
        report.final_state = str(reply["state"])
        if report.final_state not in {s.value for s in LOOP_STATES}:
            break
    report.final_step = step
    log.info(
        "hybrid %s done (%s): contributed %s, replayed %d updates",
        client.worker_id,
        report.final_state,
        report.contributed_steps,
        len(report.replayed_steps),
    )
    return report
