"""A Libra policy whose next update fits no layout on its training GPUs replans at once, not at the
next due replan (pipeline.try_start_train): until 2026-12-07 it stopped as "could not run" unless
the update fell on a replan iteration. The move stalls that update, and the rollout after it, by
`move_cost_s`; a pending audit is dropped; with no plan that holds it, the policy still fails."""

from __future__ import annotations

import pytest

from libra_core.planner.audit import AuditPolicy
from libra_core.sim import pipeline, simulate
from libra_core.sim.settings import SimSettings
from libra_core.sim.training import UpdateDoesNotFit
from tests.sim.builders import build_sim

# Trajectories that grow tenfold over three iterations (test_sim_failures.py): past iteration 0
# the training GPUs Libra's planner picks for iteration 0 cannot hold the longest sequences.
GROWING = {"gen_median": 6000, "max_total_tokens": 400000, "prompt_median": 2000, "gen_drift": 10}


def test_an_update_that_outgrew_its_gpus_moves_them_at_once() -> None:
    sim = build_sim("tiny", "+planning", 3, gpus="16xA800", **GROWING)
    first = sim.dep
    assert first is not None and sim.s.replan_every > 3  # no replan falls due in this run
    st = sim.run()
    forced = [d for d in st.replans if "does not fit the running plan's training GPUs" in d["reason"]]
    assert [d["iteration"] for d in forced] == [1, 2]
    assert all(d["action"] == "apply" and d["current_t_iter_s"] is None for d in forced)
    assert sim.dep is not None and sim.dep.train_gpus > first.train_gpus
    move_s = sim.replanner.move_cost_s
    for j in (1, 2):  # the update waits for the move; so does the rollout after it (staleness 1)
        rec = st.records[j]
        assert rec.train_end_s == pytest.approx(rec.rollout_end_s + move_s + rec.train_s + sim.t_sync)
    nxt = st.records[2]
    assert nxt.rollout_start_s == pytest.approx(st.records[1].rollout_end_s + move_s)


def test_the_forced_move_drops_a_pending_audit() -> None:
    sim = build_sim("tiny", "+planning", 3, gpus="16xA800", **GROWING)
    assert sim.dep is not None and sim.dep.plan is not None
    sim.audit.policy = AuditPolicy(window=2)
    sim.audit.moved(0, sim.dep.plan, sim.dep.plan, 0.1)
    sim.before_move = sim.dep
    st = sim.run()
    assert any("does not fit" in d["reason"] for d in st.replans)
    assert not sim.audit.pending and sim.before_move is None
    assert all(d["action"] != "revert" for d in st.replans)


def test_with_no_plan_that_holds_it_the_policy_still_fails() -> None:
    sim = build_sim("tiny", "+planning", 3, **GROWING)  # 8 GPUs: no split trains 400k tokens
    with pytest.raises(UpdateDoesNotFit, match=r"replanning at once found no plan on 8 GPUs that does$"):
        sim.run()


def test_policies_without_a_planner_are_not_rescued() -> None:
    report = simulate("tiny", "16xA800", 3, ["static-optimal", "+planning"], spec_overrides=GROWING)
    assert [r.policy for r in report.results] == ["+planning"]
    assert [f.policy for f in report.failures] == ["static-optimal"]


def test_a_forced_replan_with_reranked_plans() -> None:
    # The running plan is priced at inf there: re-simulating it ran the update that does not fit,
    # and its error escaped (iteration 0's, the probe's numbering) until the same day's fix.
    settings = SimSettings(rerank_plans=2)
    report = simulate(
        "tiny", "16xA800", 3, ["+planning", "+elastic"], spec_overrides=GROWING, settings=settings
    )
    assert [r.policy for r in report.results] == ["+planning", "+elastic"] and not report.failures
    for r in report.results:
        forced = [d for d in r.replans if "does not fit the running plan's training GPUs" in d["reason"]]
        assert forced and all(d["action"] == "apply" for d in forced)


def test_an_audit_does_not_revert_to_a_plan_that_cannot_run_the_window() -> None:
    sim = build_sim("tiny", "+planning", 3, gpus="16xA800", **GROWING)
    first = sim.dep
    assert first is not None and first.plan is not None
    sim.run()  # two forced moves: the window (iteration 2's) no longer fits the first plan
    moved_to = sim.dep
    assert moved_to is not None and moved_to.plan is not None
    sim.audit.policy = AuditPolicy(window=1)
    sim.audit.moved(3, first.plan, moved_to.plan, 0.1)
    sim.before_move = first
    sim.audit.record(1, 1000, 1.0)  # before the move: fast
    sim.audit.record(4, 1000, 100.0)  # after it: slower
    assert not pipeline.audit_move(sim, 5)
    record = sim.stats.replans[-1]
    assert record["action"] == "confirm" and record["reason"].endswith(
        "; kept: the plan before the move cannot run the window (memory)"
    )
    assert sim.dep is moved_to and not sim.audit.refuses(moved_to.plan, 6)
