"""Builders for the side-channel tests: core rank 0 of a one-replica core with its gateway, in this
process, driving a hybrid by hand (`Harness`) or through `run_hybrid` on a thread (`Core`,
`hybrid_thread`); raw sessions for sending hand-made frames; a frame recorder."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from libra_core.elastic import client as client_module
from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Coordinator
from libra_core.elastic.replica import CoreReplica, load_state_tensors, run_hybrid
from libra_core.elastic.session import ClientSession
from libra_core.elastic.toy import ToyProblem
from libra_core.training.backends.ddp import DDPBackend
from libra_core.training.backends.flat import flat_grad, set_flat_grad, trainable

KEY = secrets.token_bytes(32)
PROBLEM = ToyProblem()


class Harness:
    """Core rank 0 of a one-replica core (shard 0) with its gateway; hybrid h0 (shard 1) by hand.

    On return h0 has loaded the snapshot taken at start and is warming: step 0 counts only the core,
    and h0 is active from step 1 once it has pulled update 0.
    """

    def __init__(self, deadline_s: float = 0.5, **gateway_options: Any) -> None:
        torch.set_num_threads(1)
        model = PROBLEM.model()
        self.backend = DDPBackend()
        self.backend.setup(model, PROBLEM.optimizer(model))
        self.numel = sum(p.numel() for p in model.parameters())
        self.gateway = Gateway(
            KEY,
            Coordinator(1),
            numel=self.numel,
            dtype=torch.float64,
            deadline_s=deadline_s,
            **gateway_options,
        )
        self.gateway.request_join("h0")
        self.core = CoreReplica(self.backend, gateway=self.gateway, grad_clip=PROBLEM.grad_clip)
        self.client = GatewayClient(self.gateway.address, KEY, "h0")
        self.h_model = PROBLEM.model()
        self.h_opt = PROBLEM.optimizer(self.h_model)
        header, tensors = self.client.snapshot()
        load_state_tensors(self.h_model, self.h_opt, tensors)
        assert header["step"] == 0
        self.client.loaded(aligned_through=-1)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def core_step(self) -> dict:
        return self.core.step(lambda m, s: PROBLEM.loss(m, 0, s)).to_dict()

    def pull_and_apply(self, step: int) -> dict:
        reply, update = self.client.pull(step)
        assert reply["ok"], reply
        set_flat_grad(trainable(self.h_model), update)
        self.h_opt.step()
        self.h_opt.zero_grad(set_to_none=True)
        return reply

    def hybrid_grad(self, step: int) -> torch.Tensor:
        self.h_opt.zero_grad(set_to_none=True)
        PROBLEM.loss(self.h_model, 1, step).backward()
        return flat_grad(trainable(self.h_model))

    def close(self) -> None:
        self.client.close()
        self.gateway.close()


class Core:
    """Core rank 0 of a one-replica core with its gateway, built before any join is requested."""

    def __init__(self, problem: ToyProblem = PROBLEM, **gateway_options: Any) -> None:
        torch.set_num_threads(1)
        self.problem = problem
        model = problem.model()
        self.backend = DDPBackend()
        self.backend.setup(model, problem.optimizer(model))
        numel = sum(p.numel() for p in model.parameters())
        dtype = getattr(torch, problem.dtype)
        self.gateway = Gateway(KEY, Coordinator(1), numel=numel, dtype=dtype, **gateway_options)
        self.replica = CoreReplica(self.backend, gateway=self.gateway, grad_clip=problem.grad_clip)

    def step(self) -> dict:
        return self.replica.step(lambda m, s: self.problem.loss(m, 0, s)).to_dict()

    def close(self) -> None:
        self.gateway.close()


def hybrid_thread(
    gateway: Gateway,
    worker: str,
    out: dict[str, Any],
    *,
    delay: Callable[[int], float] | None = None,
    **client_options: Any,
) -> threading.Thread:
    """run_hybrid on a thread (as a pool worker would run it); its report or error, model and
    optimizer land in `out`; `client_options` go to its GatewayClient."""

    def body() -> None:
        client = GatewayClient(gateway.address, KEY, worker, **client_options)
        model = out["model"] = PROBLEM.model()
        optimizer = out["optimizer"] = PROBLEM.optimizer(model)
        try:
            out["report"] = run_hybrid(
                client, model, optimizer, lambda m, s: PROBLEM.loss(m, 1, s), step_delay_s=delay
            )
        except Exception as exc:
            out["error"] = exc
        finally:
            client.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def step_until(core_step: Callable[[], dict], done: Callable[[dict], bool], limit: int = 200) -> dict:
    for _ in range(limit):
        report = core_step()
        if done(report):
            return report
        time.sleep(0.01)
    raise AssertionError(f"condition not reached within {limit} core steps")


def open_raw_session(address: tuple[str, int], worker: str) -> tuple[socket.socket, ClientSession]:
    """A connection that has said hello, for sending hand-made frames in its session."""
    sock = socket.create_connection(address, timeout=5)
    session = ClientSession(worker)
    wire.send_frame(sock, wire.encode_frame(KEY, session.hello()))
    reply, _ = wire.read_frame(sock, KEY, 0)
    session.bind(reply)
    return sock, session


def closed_by_gateway(sock: socket.socket, within_s: float) -> bool:
    """True if the gateway closes `sock` (without sending anything) within `within_s`."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def wait_until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def record_client_frames(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every frame any GatewayClient sends from now on, byte for byte (what a wiretap would see)."""
    frames: list[bytes] = []
    real_send = client_module.send_frame

    def recording(sock: socket.socket, frame: bytes) -> None:
        frames.append(frame)
        real_send(sock, frame)

    monkeypatch.setattr(client_module, "send_frame", recording)
    return frames


def frame_of(frames: list[bytes], kind: str, **fields: Any) -> bytes:
    """The first recorded frame of `kind` whose header has `fields`."""
    for frame in frames:
        header, _ = wire.decode_frame(KEY, frame, max_bytes=1 << 30)
        if header["kind"] == kind and all(header.get(k) == v for k, v in fields.items()):
            return frame
    raise AssertionError(f"no {kind} frame with {fields} was sent")
