"""The move audit (planner/audit.py): a replan whose measured throughput fell is reverted."""

from __future__ import annotations

import pytest

from libra_core.config import LibraConfig
from libra_core.planner.audit import AuditPolicy, MoveAudit
from libra_core.planner.presets import workload_preset
from libra_core.planner.replan import ReplanPolicy, audit_decision
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import Plan, SearchSettings, search_plans
from libra_core.planner.service import LibraPlanner
from libra_core.planner.specs import get_hardware, get_model

LONG = workload_preset("math-short").scaled(4.0)


def two_plans() -> tuple[Plan, Plan]:
    """Two plans of different resources for one workload."""
    w = workload_preset("math-short")
    plans = search_plans(get_model("qwen3-8b"), get_hardware("A800"), 48, w, SearchSettings(staleness=1))
    first = plans[0]
    other = next(p for p in plans[1:] if not p.same_resources(first))
    return first, other


def audited(after_tokens_per_s: float, policy: AuditPolicy | None = None) -> tuple[MoveAudit, Plan, Plan]:
    old, new = two_plans()
    audit = MoveAudit(policy or AuditPolicy(window=3, max_loss_fraction=0.05, refuse_iterations=10))
    for i in range(5):  # before the move at 5: 100 tok/s
        audit.record(i, tokens=1000.0, seconds=10.0)
    audit.moved(5, old, new, predicted_gain_fraction=0.08)
    audit.record(5, tokens=1000.0, seconds=30.0)  # the iteration that paid the move: not counted
    for i in (6, 7):
        audit.record(i, tokens=1000.0, seconds=1000.0 / after_tokens_per_s)
    assert audit.verdict(8) is None  # only two iterations after the move so far
    audit.record(8, tokens=1000.0, seconds=1000.0 / after_tokens_per_s)
    return audit, old, new


def test_a_move_that_lost_throughput_is_reverted_and_refused_for_a_while() -> None:
    audit, old, new = audited(after_tokens_per_s=90.0)
    v = audit.verdict(9)
    assert v is not None and v.action == "revert"
    assert v.before_tokens_per_s == pytest.approx(100.0) and v.after_tokens_per_s == pytest.approx(90.0)
    assert v.change_fraction == pytest.approx(-0.10)
    assert v.previous is old and v.applied is new
    assert audit.verdict(10) is None  # one verdict per move
    assert audit.refuses(new, 10) and not audit.refuses(old, 10)
    assert audit.refuses(new, 18) and not audit.refuses(new, 19)  # refused for 10 iterations from 9
    # The model's error on the move (predicted +8%, measured -10%) raises the hysteresis as long.
    assert audit.extra_margin(18) == pytest.approx(0.18) and audit.extra_margin(19) == 0.0


def test_a_move_within_the_margin_is_confirmed() -> None:
    audit, _, new = audited(after_tokens_per_s=97.0)  # -3% is within the 5% margin
    v = audit.verdict(9)
    assert v is not None and v.action == "confirm"
    assert not audit.refuses(new, 10) and audit.extra_margin(10) == 0.0


def test_an_iteration_missing_after_the_move_does_not_hold_the_verdict_back_for_good() -> None:
    # iteration 7 was never recorded (no lake rows, a zero period): the move stayed pending for
    # good, so a move that halved throughput was never reverted
    old, new = two_plans()
    audit = MoveAudit(AuditPolicy(window=3, max_loss_fraction=0.05, refuse_iterations=10))
    for i in range(5):
        audit.record(i, tokens=1000.0, seconds=10.0)
    audit.moved(5, old, new, predicted_gain_fraction=0.08)
    for i in (6, 8, 10):
        audit.record(i, tokens=1000.0, seconds=20.0)  # 50 tok/s
    assert audit.verdict(9) is None  # the window's last record may still come (a pipelined run)
    v = audit.verdict(10)
    assert v is not None and v.action == "revert" and v.after_tokens_per_s == pytest.approx(50.0)
    # none recorded after the move: dropped unjudged, not pending for ever
    audit.moved(20, new, old, predicted_gain_fraction=0.08)
    assert audit.verdict(24) is None and audit._pending is not None  # still within reach
    assert audit.verdict(25) is None and audit._pending is None


def test_window_zero_turns_the_audit_off() -> None:
    audit, _, _ = audited(after_tokens_per_s=50.0, policy=AuditPolicy(window=0))
    assert audit.verdict(9) is None


def test_audit_record_reads_as_the_loss() -> None:
    audit, old, new = audited(after_tokens_per_s=80.0)
    v = audit.verdict(9)
    assert v is not None
    d = audit_decision(9, v, workload_preset("math-short"), ReplanPolicy(), move_cost_s=60.0)
    assert d.action == "revert" and d.move_cost_s == 60.0
    tokens = workload_preset("math-short").stats()["tokens_per_iteration"]
    # seconds per iteration of the window's size, at the throughput measured after and before
    assert d.saving_per_iter_s == pytest.approx(tokens / 80 - tokens / 100)
    assert "-20.0%" in d.reason and d.proposed_split != d.current_split


@pytest.mark.parametrize(
    "kw", [{"window": -1}, {"max_loss_fraction": 1.0}, {"max_loss_fraction": -0.1}, {"refuse_iterations": -1}]
)
def test_bad_audit_policy_is_rejected(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        AuditPolicy(**kw)  # type: ignore[arg-type]


def _moved_service() -> tuple[LibraPlanner, Plan, Plan, float]:
    """A service that applied a move at iteration 2 (audit window 1, replans every 2 iterations);
    returns it, the first plan, the moved plan and the seconds iterations 0-1 measured."""
    cfg = LibraConfig.model_validate(
        {
            "planner": {
                "type": "libra",
                "replan_every": 2,
                "hardware": "48xA800",
                "model_spec": "qwen3-8b",
                "initial_workload": "math-short",
                "audit_window": 1,
                "min_gain_fraction": 0.001,  # any saving moves (the audit margin is this too)
            }
        }
    )
    planner = LibraPlanner.from_config(cfg)
    first, _ = planner.step(0)
    # Iterations 0 and 1 ran the first plan; the workload drifted 4x longer (the replan moves GPUs).
    seconds = 4 * first.t_rollout_s + 4 * first.t_train_s
    for i in (0, 1):
        planner.observe(
            LONG, 16, {"rollout": first.t_rollout_s * 4, "update": first.t_train_s * 4}, iteration=i
        )
    assert planner.step(1)[1] is None
    moved, decision = planner.step(2)
    assert decision is not None and decision.action == "apply", decision
    assert not moved.same_resources(first)
    return planner, first, moved, seconds


def test_service_reverts_a_move_that_measured_worse() -> None:
    planner, first, moved, seconds = _moved_service()
    # The moved plan measures twice as slow per token as before the move: reverted at iteration 4.
    for i in (2, 3):
        planner.observe(LONG, 16, {"rollout": seconds * 2, "update": 0.0}, iteration=i)
    back, verdict = planner.step(4)
    assert verdict is not None and verdict.action == "revert", verdict
    assert back is first  # the plan as it ran before the move
    assert planner.audit.refuses(moved, 5)
    assert planner.audit.extra_margin(5) > 0.5  # the predicted saving plus the 50% measured loss


def test_the_audit_reads_the_iteration_period_when_given() -> None:
    """In async mode the stages overlap: the iteration's wall time, not the stages' sum, is what a
    move that balances them shortens. Here the stages sum to twice as long as before the move, but
    the iterations ran as fast as before: confirmed, not reverted."""
    planner, _, moved, seconds = _moved_service()
    for i in (2, 3):
        planner.observe(LONG, 16, {"rollout": seconds, "update": seconds}, iteration=i, period_s=seconds)
    _, decision = planner.step(4)  # confirmed (a revert would come back instead of the replan's)
    assert decision is not None and decision.action in ("keep", "apply"), decision
    assert not planner.audit.refuses(moved, 5) and planner.audit.extra_margin(5) == 0.0


def test_a_confirmed_move_does_not_skip_the_replan_due() -> None:
    planner, _, moved, seconds = _moved_service()
    for i in (2, 3):  # the moved plan measures as fast per token as before: confirmed at 4
        planner.observe(LONG, 16, {"rollout": seconds, "update": 0.0}, iteration=i)
    _, decision = planner.step(4)  # 4 is also a replan iteration: the replan's decision comes back
    assert decision is not None and decision.action in ("keep", "apply"), decision
    assert not planner.audit.refuses(moved, 5) and planner.audit.extra_margin(5) == 0.0
    assert planner.audit.verdict(5) is None  # the move's one verdict was given


def test_the_audit_margin_raises_the_hysteresis() -> None:
    on_policy = SearchSettings(staleness=0)  # a length drift moves the best split (test_planner_replan)
    m, hw = get_model("qwen3-8b"), get_hardware("A800")
    short = workload_preset("math-short")
    long = short.scaled(4.0)
    current = search_plans(m, hw, 48, short, on_policy)[0]
    now = evaluate_plan(current, m, hw, long, on_policy)
    proposed = search_plans(m, hw, 48, long, on_policy)[0]
    saving = (now.t_iter_s - proposed.t_iter_s) / now.t_iter_s
    policy = ReplanPolicy(0.05, 50, move_cost_s=1.0)
    assert policy.decide(3, current, now, proposed, long).action == "apply"
    kept = policy.decide(3, current, now, proposed, long, extra_gain_fraction=saving)
    assert kept.action == "keep" and kept.min_gain_fraction == pytest.approx(0.05 + saving)


def test_a_replan_due_while_the_audit_is_pending_waits_for_the_verdict() -> None:
    """A pipelined run has not finished iteration 3 when it plans iteration 4 (a replan iteration):
    a move at 4 replaced the pending audit of the move at 2, which was then never judged."""
    planner, first, moved, seconds = _moved_service()
    planner.observe(LONG, 16, {"rollout": seconds * 2, "update": 0.0}, iteration=2)
    plan, decision = planner.step(4)
    assert decision is None and plan is moved and planner.audit.pending
    planner.observe(LONG, 16, {"rollout": seconds * 2, "update": 0.0}, iteration=3)
    back, verdict = planner.step(5)  # the move at 2 measured twice as slow per token: reverted
    assert verdict is not None and verdict.action == "revert" and back is first
    assert not planner.audit.pending and planner.audit.refuses(moved, 6)
