"""The report's verdicts on the paper's claims: strict (a tie is not a gain), None when a compared
policy did not run; and what `libra simulate` prints under its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.sim.report import PolicyResult, SimReport, format_table, format_verdicts, verdicts
from libra_core.sim.stats import IterationRecord, RunStats


def _report(tok_s: dict[str, float]) -> SimReport:
    results = [
        PolicyResult(name, v, 1.0, 1.0, 0.0, 0.0, 0, 0, 0.0, 0.0, "", "", 0, 0.0) for name, v in tok_s.items()
    ]
    return SimReport("tiny", "8xH100", "m", 1, 0, 1.0, 1.0, results)


PAPER_LIKE = {
    "colocated": 423.0,
    "static-uniform": 430.0,
    "greedy": 450.0,
    "static-optimal": 510.0,
    "+planning": 510.5,
    "+hetero-tp": 551.0,
    "+cmlfq": 666.0,
    "+elastic": 763.0,
}


def test_paper_like_numbers_reproduce_both_claims() -> None:
    v = verdicts(_report(PAPER_LIKE))
    assert v.ordering is True and v.ablation is True
    lines = format_verdicts(_report(PAPER_LIKE))
    assert "450 -> 510 -> 551 -> 666 -> 763" in lines[0]
    assert lines[1].endswith("True") and lines[2].endswith("True")


def test_a_tie_is_not_a_gain() -> None:
    tied = {**PAPER_LIKE, "+cmlfq": 551.0}  # C-MLFQ adds nothing
    v = verdicts(_report(tied))
    assert v.ablation is False and v.ordering is True
    assert format_verdicts(_report(tied))[2] == (
        "ablation steps that add nothing: +cmlfq ties +hetero-tp (the same deployments)"
    )
    tied_top = {**PAPER_LIKE, "static-optimal": 763.0}  # Libra only ties static-optimal
    v = verdicts(_report(tied_top))
    assert v.ordering is False and v.ablation is True


def test_a_baseline_above_libra_breaks_the_ordering_only() -> None:
    v = verdicts(_report({**PAPER_LIKE, "colocated": 460.0}))  # colocated beats greedy
    assert v.ordering is False and v.ablation is True


def test_missing_policies_give_no_verdict() -> None:
    v = verdicts(_report({"greedy": 1.0, "+cmlfq": 2.0}))
    assert v.ordering is None and v.ablation is None
    assert format_verdicts(_report({"greedy": 1.0})) == []


def test_summary_json_carries_the_verdicts(tmp_path: Path) -> None:
    report = _report({**PAPER_LIKE, "colocated": 460.0})
    report.iterations = 0  # no per-iteration rows to write
    report.write(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdicts"] == {"ordering": False, "ablation": True}
    assert [r["policy"] for r in summary["results"]] == list(PAPER_LIKE)


def test_a_step_that_loses_is_named_with_its_share() -> None:
    lines = format_verdicts(_report({**PAPER_LIKE, "+hetero-tp": 500.0, "+cmlfq": 500.0}))
    assert lines[2] == (
        "ablation steps that add nothing: +hetero-tp -2.1% against +planning; "
        "+cmlfq ties +hetero-tp (the same deployments)"
    )
    assert len(format_verdicts(_report(PAPER_LIKE))) == 3  # every step gains: no such line


def test_each_gain_says_how_much_of_it_is_the_last_iteration() -> None:
    base = [100.0, 100.0, 100.0]
    periods = {
        "greedy": base,
        "+planning": [90.0, 95.0, 100.0],  # 15 s sooner, none of it in the last iteration
        "+hetero-tp": [90.0, 95.0, 100.0],  # ties
        "+cmlfq": [90.0, 95.0, 100.0],
        "+elastic": [90.0, 95.0, 60.0],  # the last update on every GPU: 40 s, all in the last
    }
    report = _report({p: 3000.0 / sum(v) for p, v in periods.items()})
    for r in report.results:
        r.iteration_s = periods[r.policy]
    lines = format_verdicts(report)
    assert lines[-1] == (
        "where the ablation's gains come from: +planning +5.3% over greedy (15.0 s sooner: 0.0 s in "
        "the last iteration, 15.0 s before it); +elastic +16.3% over +cmlfq (40.0 s sooner: all in "
        "the last iteration)"
    )
    for r in report.results:  # without per-iteration times there is nothing to split
        r.iteration_s = []
    assert not any(line.startswith("where the ablation's gains") for line in format_verdicts(report))


def test_the_table_tells_request_moves_from_plan_moves() -> None:
    result = PolicyResult("+cmlfq", 500.0, 1.0, 1.0, 0.0, 0.0, 37, 2, 0.0, 0.0, "", "", 0, 0.0)
    head, columns, _, row, *_ = format_table(
        SimReport("tiny", "8xH100", "m", 1, 0, 1.0, 1.0, [result])
    ).splitlines()
    names = [c.strip() for c in columns.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "tiny on 8xH100" in head
    assert cells[names.index("request moves")] == "37"  # the router's migrations
    assert cells[names.index("plan moves")] == "2"  # applied replans and reverts


def test_a_deployment_label_stays_in_its_cell() -> None:
    # deployment labels join their halves with " | ": the row had 11 cells under a 10-column head
    label = "train 24 (TP8 PP1 DP3 ZeRO-1 mb1) | rollout 24 (3xTP8)"
    result = PolicyResult("greedy", 500.0, 1.0, 1.0, 0.0, 0.0, 0, 0, 0.0, 0.0, label, label, 0, 0.0)
    _, columns, _, row, *_ = format_table(
        SimReport("tiny", "8xH100", "m", 1, 0, 1.0, 1.0, [result])
    ).splitlines()
    names = [c.strip() for c in columns.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == len(names)
    assert cells[names.index("deployment (last)")] == "train 24 (TP8 PP1 DP3 ZeRO-1 mb1); rollout 24 (3xTP8)"


def test_run_throughput_is_every_iterations_tokens_over_the_last_update_end() -> None:
    st = RunStats()
    assert (st.makespan_s, st.tokens_per_s) == (0.0, 0.0)  # nothing finished yet
    st.records += [
        IterationRecord(0, train_end_s=40.0, tokens=1_000),
        IterationRecord(1, train_end_s=100.0, tokens=3_000),
    ]
    assert st.makespan_s == 100.0
    assert st.tokens_per_s == 40.0  # (1,000 + 3,000) / 100 s, not the last iteration's 3,000 / 60 s


def test_a_tie_on_the_same_deployments_says_how_the_planner_priced_the_mixed_layout() -> None:
    report = _report({**PAPER_LIKE, "+hetero-tp": 510.5, "+cmlfq": 510.5})
    report.result("+hetero-tp").mixed_gap = 0.073
    report.result("+cmlfq").mixed_gap = -0.012
    misses = next(line for line in format_verdicts(report) if "add nothing" in line)
    assert (
        "+hetero-tp ties +planning (the same deployments: at iteration 0 its planner priced the best"
        " mixed-TP layout 7.3% slower than one degree)" in misses
    )
    assert (
        "+cmlfq ties +hetero-tp (the same deployments: at iteration 0 its planner priced the best"
        " mixed-TP layout only 1.2% faster than one degree, inside the mixed-layout margin)" in misses
    )
    report.result("+cmlfq").mixed_gap = None  # a policy that priced no mixed layout says nothing more
    assert "+cmlfq ties +hetero-tp (the same deployments)" in "".join(format_verdicts(report))


def test_an_elastic_tie_says_whether_the_pool_lent_not_the_mixed_gap() -> None:
    report = _report({**PAPER_LIKE, "+elastic": PAPER_LIKE["+cmlfq"]})
    report.result("+elastic").mixed_gap = 0.2  # the heterogeneous search's figure: not the pool's cause
    misses = next(line for line in format_verdicts(report) if "add nothing" in line)
    pool_idle = "the elastic pool moved no GPU between training and rollout"
    assert f"+elastic ties +cmlfq (the same deployments: {pool_idle})" in misses
    assert "mixed-TP" not in misses
    report.result("+elastic").lent_joins = 3
    misses = next(line for line in format_verdicts(report) if "add nothing" in line)
    assert "its 3 loans to training and 0 hybrid rollouts gained nothing" in misses


def test_a_heterogeneous_policy_carries_its_first_plans_mixed_gap() -> None:
    from libra_core.sim import SimSettings, simulate

    report = simulate("r2e-gym", "48xA800", 1, ["+planning", "+hetero-tp"])
    planning, hetero = report.results
    assert planning.mixed_gap is None  # a one-degree search prices no mixed layout
    assert hetero.mixed_gap is not None
    # It kept one degree (the same deployment as +planning) only if no mixed layout was priced
    # more than the margin faster.
    kept_one = hetero.first_deployment == planning.first_deployment
    assert kept_one == (hetero.mixed_gap > -SimSettings().mixed_margin)


def test_a_failed_rewrite_leaves_the_earlier_files_whole(tmp_path: Path, monkeypatch) -> None:
    report = _report(PAPER_LIKE)
    report.iterations = 0
    report.write(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {"summary.json", "policies.csv", "throughput.png", "iterations.png"} <= set(before)

    class Breaking:
        def __init__(self, fh) -> None:
            self.rows = 0

        def writerow(self, row) -> None:
            self.rows += 1
            if self.rows > 1:
                raise OSError("disk full")

    monkeypatch.setattr("libra_core.sim.report.csv.writer", Breaking)
    with pytest.raises(OSError, match="disk full"):
        _report({**PAPER_LIKE, "colocated": 1.0}).write(tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after.keys() == before.keys()  # no temp file left
    assert after["policies.csv"] == before["policies.csv"]  # not truncated to a header
    # all or none: the new summary and CSVs are not left beside the earlier run's plots
    assert after == before


def test_a_full_disk_names_the_file_it_was_writing(tmp_path: Path, monkeypatch) -> None:
    import errno

    def full(self, *args, **kwargs) -> None:  # noqa: ANN001
        raise OSError(errno.ENOSPC, "No space left on device")  # as the kernel says it: no file

    monkeypatch.setattr("libra_core.sim.report.SimReport._write_policies", full)
    with pytest.raises(OSError) as err:
        _report(PAPER_LIKE).write(tmp_path)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "policies.csv")
    assert not list(tmp_path.iterdir())  # nothing written, no temp file left


def test_a_one_iteration_run_plots_its_points() -> None:
    # A one-point line drawn without a marker showed nothing but the legend (until 2026-12-07).
    from libra_core.sim.plots import figures

    report = _report(PAPER_LIKE)
    for r in report.results:
        r.iteration_s = [100.0]
    lines = figures(report)["iterations.png"].axes[0].lines
    assert len(lines) == len(report.results) and all(line.get_marker() == "o" for line in lines)
    for r in report.results:
        r.iteration_s = [100.0, 90.0]
    lines = figures(report)["iterations.png"].axes[0].lines
    assert all(line.get_marker() in (None, "None", "") for line in lines)  # lines alone, as before
