"""What the gateway keeps between steps: updates only while a hybrid may pull them, and the join
snapshot only while a join may use it (both in host memory)."""

from __future__ import annotations

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
