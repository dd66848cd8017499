"""The join snapshot: it carries the core's optimizer hyperparameters (and each update the ones it was
applied with), it arrives in parts under the hybrid's frame limit, the join is LOADING only once the
last part is sent, and an update log too short to serve any join is refused where it is configured."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from libra_core.config.pools import ElasticConfig
from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient, JoinEndedError
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Coordinator
from libra_core.elastic.replica import load_state_tensors, state_tensors
from libra_core.elastic.toy import ToyProblem, flat_params
from tests.elastic.builders import (
    KEY,
    PROBLEM,
    Core,
    Harness,
    hybrid_thread,
    open_raw_session,
    step_until,
    wait_until,
)

# ~25k float64 parameters: a snapshot (parameters + two AdamW moments) of ~600 KB, an update of ~200 KB.
BIG = ToyProblem(in_dim=64, hidden=128, depth=2)
# An update of 31,880 B (a 48 KiB frame holds it) and a snapshot of 95,862 B (parts at 48 or 64 KiB).
MEDIUM = ToyProblem(in_dim=32, hidden=48, depth=2)

# ---------------------------------------------------------------------------- update log


def test_an_update_log_of_one_step_is_refused_where_it_is_configured() -> None:
    # The audit's case: accepted, but `step - snapshot.step < 1 // 2` is never true, so no join could
    # ever be served a snapshot (and the core cloned its whole state at every boundary meanwhile).
    with pytest.raises(ValidationError, match="update_log_steps"):
        ElasticConfig(update_log_steps=1)
    assert ElasticConfig(update_log_steps=2).update_log_steps == 2
    with pytest.raises(AssertionError, match="must keep at least 2 updates"):
        Core(deadline_s=0.5, update_log_steps=1)


def test_the_shortest_update_log_allowed_serves_a_join() -> None:
    with Harness(update_log_steps=2) as harness:
        harness.core_step()
        harness.pull_and_apply(0)
        assert harness.client.push(harness.hybrid_grad(1), step=1, version=1, epoch=1)["ok"]
        assert harness.core_step()["divisor"] == 2


# ---------------------------------------------------------------------------- optimizer hyperparameters


def test_the_snapshot_carries_the_core_optimizer_hyperparameters() -> None:
    core = Core(deadline_s=5.0)
    try:
        for group in core.backend.optimizer.param_groups:  # what a schedule may have set
            group.update(lr=0.0123, weight_decay=0.5, betas=(0.8, 0.95))
        core.gateway.request_join("h0")
        core.step()
        client = GatewayClient(core.gateway.address, KEY, "h0")
        try:
            _, tensors = client.snapshot(wait_s=5)
        finally:
            client.close()
        model = PROBLEM.model()
        optimizer = PROBLEM.optimizer(model)
        assert optimizer.param_groups[0]["lr"] == PROBLEM.lr
        load_state_tensors(model, optimizer, tensors)
        group = optimizer.param_groups[0]
        assert (group["lr"], group["weight_decay"], group["betas"]) == (0.0123, 0.5, (0.8, 0.95))
    finally:
        core.close()


def test_a_hybrid_follows_the_core_lr_schedule_through_replay_and_training() -> None:
    # The audit's case: a hybrid replayed every update with its constructor's lr, so from its first
    # replayed step it trained from weights the core never had (and nothing detected it).
    core = Core(deadline_s=5.0)
    try:
        groups = core.backend.optimizer.param_groups
        params_at: dict[int, np.ndarray] = {}

        def step() -> dict:
            for group in groups:  # a schedule that changes the lr at every step
                group["lr"] = PROBLEM.lr * (1 + core.replica.step_index % 4) / 4
            report = core.step()
            params_at[core.replica.version] = flat_params(core.backend.model)
            return report

        for _ in range(3):
            step()
        core.gateway.request_join("h0")
        step()
        out: dict = {}
        thread = hybrid_thread(core.gateway, "h0", out)
        step_until(step, lambda r: "h0" in r["included"])
        for _ in range(3):
            step()
        core.gateway.request_leave("h0")
        step_until(step, lambda r: r["divisor"] == 1)
        thread.join(10)
        report = out["report"]
        assert (
            report.final_state == "rollout" and report.replayed_steps and len(report.contributed_steps) >= 4
        )
        # The hybrid applied every update through final_step - 1: it holds the core's weights then.
        np.testing.assert_allclose(
            flat_params(out["model"]), params_at[report.final_step], rtol=0, atol=1e-12
        )
        assert out["optimizer"].param_groups[0]["lr"] == PROBLEM.lr * (1 + (report.final_step - 1) % 4) / 4
    finally:
        core.close()


# ---------------------------------------------------------------------------- snapshot in parts


def test_a_snapshot_larger_than_the_hybrid_frame_limit_arrives_in_parts() -> None:
    # The audit's case: the snapshot was one frame, so a model over ~89M float32 parameters could not
    # join under the default 1 GiB frame limit (shown here with a 256 KiB limit).
    core = Core(BIG, deadline_s=5.0)
    try:
        core.step()  # the optimizer has state now
        core.gateway.request_join("h0")
        core.step()
        client = GatewayClient(core.gateway.address, KEY, "h0", max_frame_bytes=256 << 10)
        try:
            header, tensors = client.snapshot(wait_s=5)
            assert header["bytes"] > 2 * (256 << 10)
            assert header["parts"] == math.ceil(header["bytes"] / (256 << 10))
            expected = state_tensors(core.backend.model, core.backend.optimizer)  # no step since
            assert tensors.keys() == expected.keys()
            assert all(torch.equal(tensors[k], expected[k]) for k in expected)
            client.loaded(aligned_through=header["step"] - 1)
            assert core.gateway.states() == {"h0": "warming"}
            core.step()
            reply, update = client.pull(header["step"])
            assert reply["ok"] and update is not None
        finally:
            client.close()
    finally:
        core.close()


def test_the_join_is_loading_only_once_the_last_part_is_sent_and_fails_if_the_hybrid_goes() -> None:
    # The audit's case: LOADING was set before the (single) frame was sent, so a send that failed, or
    # a hybrid that refused the frame, left the join LOADING for good.
    core = Core(MEDIUM, deadline_s=5.0)
    try:
        core.step()
        core.gateway.request_join("h0")
        core.step()
        sock, session = open_raw_session(core.gateway.address, "h0")
        with sock:
            request = session.request("snapshot", {"wait_s": 5.0, "part_bytes": 64 << 10})
            sock.sendall(wire.encode_frame(KEY, request))
            reply, body = wire.read_frame(sock, KEY, 1 << 20)
            assert reply["ok"] and reply["parts"] > 1 and len(body) == 64 << 10
            time.sleep(0.2)
            assert core.gateway.states() == {"h0": "join_requested"}  # parts remain to be sent
            assert not core.gateway.wants_snapshot()  # this one is being sent: no new clone per step
        assert wait_until(lambda: core.gateway.states() == {"h0": "rollout"}, timeout_s=5)
    finally:
        core.close()


def test_a_gradient_over_the_frame_limit_is_refused_at_start_naming_the_setting() -> None:
    # Gradients and updates still travel as one frame each: say so at start, not at the first push.
    # It names the constructor argument: pools.elastic is not wired into the experiment flow (the
    # message named pools.elastic.max_frame_mib, which changed nothing, until 2026-12-07).
    with pytest.raises(ValueError, match=r"raise the Gateway's max_frame_bytes to at least 2 MiB"):
        Gateway(
            KEY, Coordinator(1), numel=200_000, dtype=torch.float64, deadline_s=1.0, max_frame_bytes=1 << 20
        )


@pytest.mark.parametrize(
    ("problem", "limit", "refusal"),
    [
        (MEDIUM, 48 << 10, None),
        (MEDIUM, 2 << 10, r"frame limit \(2048 B\) is below the smallest snapshot part"),
        # BIG's update (200,712 B) is pulled as one frame: refused before its snapshot is sent (it
        # downloaded the whole snapshot, then failed on its first pull)
        (BIG, 48 << 10, r"frame limit \(49152 B\) is below one update \(200712 B"),
    ],
)
def test_parts_fit_a_small_frame_limit_or_the_join_is_refused_saying_why(
    problem: ToyProblem, limit: int, refusal: str | None
) -> None:
    # Parts were raised to at least 64 KiB: a hybrid with a 48 KiB limit was sent a part it
    # refused (FrameError), though its gradients fit.
    core = Core(problem, deadline_s=5.0)
    try:
        core.step()
        core.gateway.request_join("h0")
        core.step()
        client = GatewayClient(core.gateway.address, KEY, "h0", max_frame_bytes=limit)
        try:
            if refusal is None:
                header, tensors = client.snapshot(wait_s=5)
                assert header["parts"] == math.ceil(header["bytes"] / limit) > 1
                assert tensors.keys() == state_tensors(core.backend.model, core.backend.optimizer).keys()
                client.loaded(aligned_through=header["step"] - 1)
                core.step()
                reply, update = client.pull(header["step"])  # the update fits the frame limit too
                assert reply["ok"] and update is not None
            else:
                with pytest.raises(JoinEndedError, match=refusal):
                    client.snapshot(wait_s=5)
                assert core.gateway.states() == {"h0": "rollout"}  # the join failed back, not stuck
        finally:
            client.close()
    finally:
        core.close()
