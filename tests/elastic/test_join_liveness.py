"""A join that no process drives any more does not stay in a training state (the planner counts those
as training), and a hybrid loop whose join was cancelled or evicted and then requested again stops,
while the new join goes on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from libra_core.elastic import wire
from libra_core.elastic.client import GatewayClient
from libra_core.elastic.gateway import Gateway
from libra_core.elastic.membership import Role
from libra_core.elastic.plan import RoleSwitch, plan_switches
from libra_core.elastic.replica import HybridReport, run_hybrid
from libra_core.elastic.state_machine import HybridState
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

ROLES = {"c0": Role.CORE_TRAINING, "h0": Role.HYBRID, "h1": Role.HYBRID}


def _plan(gateway: Gateway, num_training: int) -> list[RoleSwitch]:
    states = {w: HybridState(s) for w, s in gateway.states().items()}
    return plan_switches(ROLES, states, num_training)


# ---------------------------------------------------------------------------- a join nobody drives


def test_a_timed_out_snapshot_wait_keeps_the_join_and_its_connection_asks_again() -> None:
    # The snapshot comes at the next step boundary; a long core step puts it off past the wait.
    # Until 2026-12-07 the timed-out wait failed the join (run_hybrid waits 60 s), so no hybrid could
    # join a core whose step in progress had more than a minute left.
    core = Core(deadline_s=0.5)
    try:
        core.gateway.request_join("h0")  # after the core's last boundary: no snapshot is stored yet
        client = GatewayClient(core.gateway.address, KEY, "h0")
        try:
            ask = {"wait_s": 0.2, "part_bytes": client.max_frame_bytes}
            reply, _ = client.request("snapshot", **ask)
            assert reply == {**reply, "ok": False, "retry": True}, reply
            assert "no fresh snapshot within the wait" in reply["reason"]
            assert core.gateway.states() == {"h0": "join_requested"} and core.gateway.wants_snapshot()
            core.step()  # the boundary stores the snapshot the bound join still waits for
            header, _ = client.snapshot(wait_s=5)  # asked again on the same connection
            assert header["step"] == 1
        finally:
            client.close()
        # A hybrid that gives up (its connection ends) fails the join: it does not stay requested.
        assert wait_until(lambda: core.gateway.states() == {"h0": "rollout"}, timeout_s=5)
        assert _plan(core.gateway, 2) == [RoleSwitch("h0", "join_training")]
    finally:
        core.close()


def test_closing_the_gateway_ends_a_snapshot_wait_at_once() -> None:
    core = Core(deadline_s=0.5)
    core.gateway.request_join("h0")
    client = GatewayClient(core.gateway.address, KEY, "h0")
    got: dict[str, Any] = {}

    def ask() -> None:
        try:
            got["reply"] = client.request("snapshot", wait_s=30, part_bytes=client.max_frame_bytes)[0]
        except (ConnectionError, OSError) as exc:
            got["error"] = exc

    waiter = threading.Thread(target=ask)
    waiter.start()
    bound = core.gateway.joins._joins.values
    assert wait_until(lambda: any(j.worker == "h0" for j in bound()), timeout_s=5)
    t0 = time.perf_counter()
    core.close()
    waiter.join(timeout=10)
    client.close()
    assert not waiter.is_alive() and time.perf_counter() - t0 < 5
    assert got.get("reply", {}).get("reason") == "the gateway closed" or "error" in got, got
    # Until 2026-12-07 the handler waited out its 30 s on the closed gateway (its connection, and so
    # the join, ended only then); now the wait ends with the gateway, and the join with its connection.
    time.sleep(1.5)
    failure = core.gateway.coordinator.lifecycle("h0").failure or ""
    assert "the connection serving its join closed" in failure, failure


@pytest.mark.parametrize("stage", ["loading", "warming"])
def test_a_hybrid_whose_connection_ends_mid_join_is_failed(stage: str) -> None:
    # The audit's case: a hybrid that died after fetching its snapshot stayed LOADING for good.
    with Harness() as harness:
        if stage == "loading":  # a second join, dropped after its snapshot arrived
            harness.gateway.cancel("h0")
            harness.gateway.request_join("h0")
            harness.core_step()
            client = GatewayClient(harness.gateway.address, KEY, "h0")
            client.snapshot(wait_s=5)
            assert wait_until(lambda: harness.gateway.states() == {"h0": "loading"}, timeout_s=5)
        else:
            client = harness.client  # loaded and warming
            assert harness.gateway.states() == {"h0": "warming"}
        client.close()
        assert wait_until(lambda: harness.gateway.states() == {"h0": "rollout"}, timeout_s=5)
        assert f"connection serving its join closed ({stage})" in str(
            harness.gateway.coordinator.lifecycle("h0").failure
        )
        assert harness.core_step()["divisor"] == 1
        assert _plan(harness.gateway, 2) == [RoleSwitch("h0", "join_training")]


def test_a_timed_out_pull_of_a_warming_hybrid_keeps_the_join_and_asks_for_a_retry() -> None:
    with Harness() as harness:
        reply, _ = harness.client.pull(0, wait_s=0.2)  # the core has not finished step 0
        assert not reply["ok"] and "not published within 0.2 s" in reply["reason"] and reply["retry"]
        assert harness.gateway.states() == {"h0": "warming"}
        assert harness.core_step()["divisor"] == 1
        assert harness.pull_and_apply(0)["active_next"]  # the retry gets it; h0 is active in step 1
        assert harness.gateway.states() == {"h0": "active"}


def test_a_core_step_longer_than_the_pull_wait_does_not_end_the_join() -> None:
    # With steps over the pull's wait (60 s by default; an agentic update often takes longer) the
    # pull timed out, the gateway failed the warming join and run_hybrid ended: no hybrid joined.
    core = Core(deadline_s=5.0)
    try:
        core.gateway.request_join("h0")
        core.step()  # the snapshot is stored at this boundary
        out: dict[str, Any] = {}
        thread = hybrid_thread(core.gateway, "h0", out, pull_wait_s=0.1)
        assert wait_until(lambda: core.gateway.states() == {"h0": "warming"}, timeout_s=10)
        time.sleep(0.6)  # a long core step: several pull waits pass
        assert core.gateway.states() == {"h0": "warming"} and thread.is_alive()
        step_until(core.step, lambda r: "h0" in r["included"])
        core.gateway.request_leave("h0")
        step_until(core.step, lambda r: r["divisor"] == 1)
        thread.join(10)
        assert "error" not in out and out["report"].final_state == "rollout"
        assert out["report"].contributed_steps
    finally:
        core.close()


def test_run_hybrid_that_raises_closes_its_connection_so_the_join_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = Core(deadline_s=0.5)
    try:
        core.gateway.request_join("h0")
        core.step()  # the core stores a snapshot for the join at this boundary
        client = GatewayClient(core.gateway.address, KEY, "h0")

        def broken_pull(step: int, wait_s: float = 60.0) -> Any:
            raise MemoryError("out of memory while replaying")

        monkeypatch.setattr(client, "pull", broken_pull)
        model = PROBLEM.model()
        with pytest.raises(MemoryError):
            run_hybrid(client, model, PROBLEM.optimizer(model), lambda m, s: PROBLEM.loss(m, 1, s))
        # Before, the connection stayed open until idle_timeout_s (600 s) and h0 stayed WARMING.
        assert wait_until(lambda: core.gateway.states() == {"h0": "rollout"}, timeout_s=5)
    finally:
        core.close()


def test_a_join_nobody_asks_a_snapshot_for_fails_after_the_join_timeout() -> None:
    # The hybrid's loop never started (its pool worker died, or the call is queued behind rollout).
    core = Core(deadline_s=0.5, join_timeout_s=0.3)
    try:
        core.gateway.request_join("h0")
        core.step()
        assert core.gateway.states() == {"h0": "join_requested"}  # within the timeout
        time.sleep(0.4)
        core.step()  # checked at the step boundary
        assert core.gateway.states() == {"h0": "rollout"}
        assert "no snapshot request within 0.3 s" in str(core.gateway.coordinator.lifecycle("h0").failure)
    finally:
        core.close()


def test_a_connection_that_does_not_serve_the_join_cannot_end_it() -> None:
    # Only the connection bound to the join (by its snapshot request) fails it when it ends: another
    # key holder's session for the same worker id, or a replayed hello, changes nothing.
    with Harness() as harness:
        sock, session = open_raw_session(harness.gateway.address, "h0")
        with sock:
            sock.sendall(wire.encode_frame(KEY, session.request("pull", {"step": 0, "wait_s": 0.01})))
            reply, _ = wire.read_frame(sock, KEY, 1 << 30)
            assert not reply["ok"] and "not published" in reply["reason"]
        time.sleep(0.2)
        assert harness.gateway.states() == {"h0": "warming"}  # neither the timed-out pull nor the close
        harness.core_step()
        harness.pull_and_apply(0)
        assert harness.gateway.states() == {"h0": "active"}


# ---------------------------------------------------------------------------- superseded joins


def test_cancel_then_join_again_stops_the_old_loop_and_the_new_join_activates() -> None:
    # The audit's case: the old loop, waiting in a pull, saw 'join_requested' (not 'rollout') and kept
    # replaying for ever; on a pool worker the new join's loop queued behind it and never started.
    core = Core(deadline_s=5.0)
    try:
        core.gateway.request_join("h0")
        core.step()
        old: dict[str, Any] = {}
        old_thread = hybrid_thread(core.gateway, "h0", old)
        assert wait_until(lambda: core.gateway.states() == {"h0": "warming"}, timeout_s=10)
        core.gateway.cancel("h0")
        core.gateway.request_join("h0")  # a plan flip-flop while the old loop waits in pull
        old_thread.join(10)
        assert not old_thread.is_alive(), "the old loop still runs"
        report: HybridReport = old["report"]
        assert report.final_state == "ended: join 1 of h0 is over: join 2 was requested since"
        assert core.gateway.states() == {"h0": "join_requested"}  # the old loop's end left it alone
        new: dict[str, Any] = {}
        new_thread = hybrid_thread(core.gateway, "h0", new)
        step_until(core.step, lambda r: "h0" in r["included"])
        core.gateway.request_leave("h0")
        step_until(core.step, lambda r: r["divisor"] == 1)
        new_thread.join(10)
        assert new["report"].final_state == "rollout" and new["report"].contributed_steps
    finally:
        core.close()


def test_an_evicted_hybrid_joined_again_before_its_loop_noticed_stops_that_loop() -> None:
    # The audit's realistic variant: an ACTIVE hybrid is slow once, evicted at the deadline, and the
    # planner asks it to join again before its loop has pulled.
    core = Core(deadline_s=0.3)
    try:
        core.gateway.request_join("h0")
        core.step()
        old: dict[str, Any] = {}
        slow = {"step": None}

        def delay(step: int) -> float:
            if slow["step"] is None:
                slow["step"] = step
            return 1.5 if step == slow["step"] else 0.0

        old_thread = hybrid_thread(core.gateway, "h0", old, delay=delay)
        report = step_until(core.step, lambda r: bool(r["missing"]))
        assert list(report["missing"]) == ["h0"]
        core.gateway.request_join("h0")
        for _ in range(3):
            core.step()
        old_thread.join(10)
        assert not old_thread.is_alive(), "the old loop still runs"
        assert old["report"].final_state.startswith("ended: ")
        assert core.gateway.states() == {"h0": "join_requested"}
        new: dict[str, Any] = {}
        new_thread = hybrid_thread(core.gateway, "h0", new)
        assert wait_until(lambda: core.gateway.states()["h0"] in ("loading", "warming"), timeout_s=10)
        core.gateway.cancel("h0")
        step_until(core.step, lambda r: not new_thread.is_alive())
        assert new["report"].final_state in ("rollout", "ended: the join is over: h0 is in rollout (cancel)")
    finally:
        core.close()


def test_a_member_that_died_mid_step_is_not_waited_for_and_its_rejoin_survives_the_close() -> None:
    # A leaving hybrid died mid-step and was asked to join again: the step's close waited the whole
    # deadline for it and then failed the new join ("missed the payload deadline"), until 2026-12-06.
    import threading

    with Harness(deadline_s=5.0) as h:
        h.core_step()  # step 0: core only; h0 active from step 1
        h.pull_and_apply(0)
        g = h.gateway
        g.request_leave("h0")
        h.client.close()  # its process dies mid-step 1
        assert wait_until(lambda: g.states()["h0"] == "rollout", 5), g.states()
        g.request_join("h0")
        again = GatewayClient(g.address, KEY, "h0")
        out: dict[str, Any] = {}
        fetch = threading.Thread(target=lambda: out.update(reply=again.request("snapshot", wait_s=30)[0]))
        fetch.start()
        try:
            assert wait_until(lambda: g.states()["h0"] in ("join_requested", "loading"), 5)
            started = time.perf_counter()
            report = h.core_step()  # step 1 closes without h0
            assert time.perf_counter() - started < 2.5  # not the 5 s deadline
            assert report["missing"] == ("h0",)
            fetch.join(10)
            assert out["reply"]["ok"], out
            life = g.coordinator.lifecycle("h0")
            assert life.state is not HybridState.ROLLOUT and "payload deadline" not in (life.failure or "")
        finally:
            again.close()


def test_a_push_on_a_superseded_joins_connection_is_refused() -> None:
    # The superseded-join tests above cover pulls; this covers a gradient pushed over the old join's
    # connection. An ACTIVE h0 that pulls an update gone from the log is failed with its connection
    # still open, and is asked to join again within the same step: it is still a member of the open
    # step's frozen membership (same version and epoch), so only the join check stops the old
    # connection's payload. Accepted, it was summed into the step as h0's (divisor 2) while the new
    # join had not even fetched a snapshot.
    with Harness(deadline_s=5.0, update_log_steps=2) as harness:
        g = harness.gateway
        harness.core_step()
        harness.pull_and_apply(0)
        for step in (1, 2):
            assert harness.client.push(harness.hybrid_grad(step), step=step, version=step, epoch=1)["ok"]
            harness.core_step()
            harness.pull_and_apply(step)
        assert list(g._log) == [1, 2] and g.states() == {"h0": "active"}  # step 3 is open
        reply, _ = harness.client.pull(0)  # older than the log: the join fails, the connection stays
        assert reply == {**reply, "ok": False, "reason": "expired"}, reply
        g.request_join("h0")  # join 2
        assert g.states() == {"h0": "join_requested"}
        push = harness.client.push(harness.hybrid_grad(3), step=3, version=3, epoch=1)
        reason = "this connection does not serve h0's current join"
        assert not push["ok"] and push["reason"] == reason, push
        started = time.perf_counter()
        report = harness.core_step()  # h0 owes step 3 nothing now: not waited for
        assert time.perf_counter() - started < 2.5
        assert report["divisor"] == 1 and list(report["included"]) == [] and list(report["missing"]) == ["h0"]
        assert [tuple(r) for r in report["rejected"]] == [("h0", reason)]
        assert g.states() == {"h0": "join_requested"}  # the new join goes on


def test_a_push_from_a_rejoining_member_on_its_new_joins_connection_is_refused() -> None:
    # The case beside the one above: h0, a member of the open step, dies while leaving, is asked to
    # join again and fetches the new join's snapshot (the start's is still fresh) on a new
    # connection. That connection serves h0's current join and h0 is still in the open step's frozen
    # membership (same version and epoch), so until 2026-12-07 a gradient pushed on it for the open
    # step was summed as h0's (divisor 2), from a process that had not even loaded the snapshot: a
    # member pays a step only while ACTIVE or LEAVING (the states `collect` waits for).
    with Harness(deadline_s=5.0, update_log_steps=16) as h:
        g = h.gateway
        h.core_step()  # step 0: core only; h0 active from step 1
        h.pull_and_apply(0)
        g.request_leave("h0")
        h.client.close()  # its process dies mid-step 1
        assert wait_until(lambda: g.states()["h0"] == "rollout", 5), g.states()
        g.request_join("h0")
        again = GatewayClient(g.address, KEY, "h0")
        try:
            fetched, _ = again.snapshot(wait_s=10)
            assert fetched["step"] == 0, fetched
            # LOADING once the last part has been sent (joins._after_part), after the reply went out
            assert wait_until(lambda: g.states() == {"h0": "loading"}, 5), g.states()
            push = again.push(h.hybrid_grad(1), step=1, version=1, epoch=1)
            reason = "h0 is loading, not a member that trains step 1"
            assert not push["ok"] and push["reason"] == reason, push
            report = h.core_step()
            assert report["divisor"] == 1 and list(report["included"]) == []
            assert list(report["missing"]) == ["h0"]
            assert [tuple(r) for r in report["rejected"]] == [("h0", reason)]
            assert g.states() == {"h0": "loading"}  # the new join goes on
        finally:
            again.close()
