"""What the gateway keeps between steps: updates only while a hybrid may pull them, and the join
snapshot only while a join may use it (both in host memory); the hybrid sum in a wide dtype; payloads
decoded outside its lock; pull replies as large as an optimizer's hyperparameters make them."""

from __future__ import annotations

import pytest
import torch

from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Coordinator
from libra_core.elastic.replica import CoreReplica
from libra_core.training.backends.ddp import DDPBackend
from tests.elastic.builders import KEY, PROBLEM, Harness


def test_no_update_is_logged_while_no_hybrid_can_pull_it() -> None:
    # Until 2026-12-07 every step kept a copy of its update, `update_log_steps` of them, with no
    # hybrid at all (on the core's device: 64 x 4 B per parameter).
    torch.set_num_threads(1)
    model = PROBLEM.model()
    backend = DDPBackend()
    backend.setup(model, PROBLEM.optimizer(model))
    numel = sum(p.numel() for p in model.parameters())
    gateway = Gateway(KEY, Coordinator(1), numel=numel, dtype=torch.float64, deadline_s=0.5)
    try:
        core = CoreReplica(backend, gateway=gateway, grad_clip=PROBLEM.grad_clip)
        for _ in range(6):
            core.step(lambda m, s: PROBLEM.loss(m, 0, s))
        assert len(gateway._log) <= 1 and gateway.joins.snapshot is None
    finally:
        gateway.close()


def test_a_join_keeps_the_log_until_its_hybrid_has_left() -> None:
    with Harness(deadline_s=5.0, update_log_steps=8) as harness:
        snapshot = harness.gateway.joins.snapshot
        assert snapshot is not None
        assert all(t.device.type == "cpu" for t in snapshot.tensors.values())
        harness.core_step()
        harness.pull_and_apply(0)
        for step in range(1, 4):
            assert harness.client.push(harness.hybrid_grad(step), step=step, version=step, epoch=1)["ok"]
            harness.core_step()
            harness.pull_and_apply(step)
        assert list(harness.gateway._log) == [0, 1, 2, 3]
        assert all(p.update.device.type == "cpu" for p in harness.gateway._log.values())
        harness.gateway.request_leave("h0")
        assert harness.client.push(harness.hybrid_grad(4), step=4, version=4, epoch=1)["ok"]
        harness.core_step()  # h0 leaves with this step: its last update is logged for its pull
        assert harness.pull_and_apply(4)["state"] == "rollout"
        for _ in range(3):
            harness.core_step()
        assert list(harness.gateway._log) == [4] and harness.gateway.joins.snapshot is None


def test_half_precision_payloads_are_summed_without_overflow() -> None:
    # Two accepted fp16 payloads of 39,296 summed to inf in fp16 (until 2026-12-07): every core rank
    # then stopped on a non-finite norm, though the average over three replicas is 26,197.
    from libra_core.elastic.client import GatewayClient

    numel = 64
    gateway = Gateway(KEY, Coordinator(1), numel=numel, dtype=torch.float16, deadline_s=5.0)
    clients = {}
    try:
        for worker in ("h0", "h1"):
            gateway.request_join(worker)
        gateway.set_snapshot({"x": torch.zeros(1)}, step=0, version=0)
        for worker in ("h0", "h1"):
            client = clients[worker] = GatewayClient(gateway.address, KEY, worker)
            client.snapshot(wait_s=5)
            client.loaded(aligned_through=-1)
        gateway.collect(0, 0)
        gateway.publish(0, torch.zeros(numel, dtype=torch.float16), 1)
        for client in clients.values():
            reply, _ = client.pull(0)
            assert reply["active_next"], reply
        grad = torch.zeros(numel, dtype=torch.float16)
        grad[7] = 39296.0
        for client in clients.values():
            assert client.push(grad, step=1, version=1, epoch=reply["next_epoch"])["ok"]
        total, collection = gateway.collect(1, 1)
        assert collection.included == ("h0", "h1") and total is not None
        assert float(total[7]) == 2 * 39296.0
        update, divisor = DDPBackend().reduce(
            torch.zeros(numel, dtype=torch.float16), extra_sum=total, extra_count=2
        )
        assert divisor == 3 and float(update[7]) == pytest.approx(2 * 39296.0 / 3, rel=1e-3)
    finally:
        for client in clients.values():
            client.close()
        gateway.close()


def test_a_payload_is_decoded_outside_the_gateway_lock() -> None:
    # Until 2026-12-07 a push was decoded and checked under the lock: `collect`, `publish` and every
    # other hybrid's requests waited for it (0.3 s for 191 MiB; hybrids decoded one after another).
    import threading
    import time

    with Harness(deadline_s=5.0) as harness:
        harness.core_step()
        harness.pull_and_apply(0)
        gateway = harness.gateway
        decode, started = gateway._decode_payload, threading.Event()

        def slow_decode(body: bytes) -> tuple[torch.Tensor | None, str]:
            started.set()
            time.sleep(1.0)
            return decode(body)

        gateway._decode_payload = slow_decode  # type: ignore[method-assign]
        replies: list[dict] = []
        push = threading.Thread(
            target=lambda: replies.append(
                harness.client.push(harness.hybrid_grad(1), step=1, version=1, epoch=1)
            )
        )
        push.start()
        assert started.wait(5)
        t0 = time.perf_counter()
        assert gateway.states() == {"h0": "active"}
        assert time.perf_counter() - t0 < 0.5
        push.join(10)
        assert replies and replies[0]["ok"], replies
        assert harness.core_step()["divisor"] == 2  # the payload counted


def test_a_pull_carries_the_hyperparameters_of_hundreds_of_param_groups() -> None:
    # One param group per tensor (layer-wise learning rates): the pull reply's header carries their
    # hyperparameters, 94 KB for 400 groups, over the 64 KiB a hybrid accepted (until 2026-12-07 it
    # died on its first pull, after downloading and loading the whole snapshot).
    from libra_core.elastic.client import GatewayClient

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(200)])
    groups = [{"params": [p], "lr": 1e-3 * 0.99**i} for i, p in enumerate(model.parameters())]
    backend = DDPBackend()
    backend.setup(model, torch.optim.AdamW(groups))
    numel = sum(p.numel() for p in model.parameters())
    gateway = Gateway(KEY, Coordinator(1), numel=numel, dtype=torch.float32, deadline_s=5.0)
    client = GatewayClient(gateway.address, KEY, "h0")
    try:
        gateway.request_join("h0")
        core = CoreReplica(backend, gateway=gateway)
        header, _ = client.snapshot(wait_s=5)
        client.loaded(aligned_through=header["step"] - 1)
        core.step(lambda m, s: m(torch.ones(1, 2)).pow(2).mean())
        reply, update = client.pull(header["step"])
        assert reply["ok"] and update is not None and update.numel() == numel
        assert len(reply["param_groups"]) == 400
        assert reply["param_groups"][399]["lr"] == pytest.approx(1e-3 * 0.99**399)
    finally:
        client.close()
        gateway.close()
