"""A policy that cannot run the workload (an update no training layout on its GPUs holds) is a
failed row of the report, not the end of the simulation: until 2026-12-07 the first such policy
stopped `libra simulate` (exit 2), the results of every other policy with it (the `causal` trace
replay on 48xA800 lost all four policies to greedy's iteration 23)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.sim import simulate
from libra_core.sim.report import format_table, format_verdicts

# Trajectories that grow tenfold over the run: past iteration 0, 4 or 2 A800s of training cannot
# hold the longest sequences, 8 still can.
GROWING = {"gen_median": 6000, "max_total_tokens": 400000, "prompt_median": 2000, "gen_drift": 10}


def _run(policies: list[str], jobs: int = 1, out: Path | None = None):  # noqa: ANN202
    return simulate("tiny", "8xA800", 3, policies, spec_overrides=GROWING, jobs=jobs, out_dir=out)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_policy_that_cannot_train_is_reported_and_the_others_finish(jobs: int, tmp_path: Path) -> None:
    report = _run(["colocated", "greedy", "static-optimal", "+elastic"], jobs, tmp_path)
    assert [r.policy for r in report.results] == ["colocated"]
    assert report.results[0].tokens_per_s > 0 and len(report.results[0].iteration_s) == 3
    reasons = {f.policy: f.reason for f in report.failures}
    assert sorted(reasons) == ["+elastic", "greedy", "static-optimal"]
    assert reasons["greedy"].startswith("greedy, iteration 2's update: the training layout TP4")
    assert "no layout on 4 GPUs fits" in reasons["greedy"]
    table = format_table(report)
    assert "| greedy | could not run (below) |" in table
    assert f"greedy could not run: {reasons['greedy']}" in table
    assert format_verdicts(report) == [
        "paper ordering not compared: +elastic, static-optimal, greedy could not run"
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdicts"] == {"ordering": None, "ablation": None}
    assert {f["policy"]: f["reason"] for f in summary["failures"]} == reasons


def test_when_every_policy_fails_the_reasons_are_the_error() -> None:
    with pytest.raises(ValueError, match=r"greedy could not run: greedy, iteration 2's update"):
        _run(["greedy"])


def test_a_claim_not_asked_for_is_not_said_to_be_uncompared() -> None:
    report = _run(["colocated", "greedy"])
    assert [f.policy for f in report.failures] == ["greedy"]
    assert format_verdicts(report) == []  # neither claim's policies were all asked for
