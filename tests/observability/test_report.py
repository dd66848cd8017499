from __future__ import annotations

import base64
import json
import math
import random
import statistics
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flows.cli import main
from libra_core.config import load_config, write_resolved_config
from libra_core.data.history import HISTORY_SCHEMA, append_history, read_history
from libra_core.observability.plots import curves_png, gantt_png
from libra_core.observability.report import (
    STAGE_TIMING_COLUMNS,
    build_report,
    markdown_table,
    planner_rows,
    stage_timing_rows,
    stage_timing_summary,
)
from libra_core.observability.timeline import Span, timeline_dir, write_perfetto, write_timeline
from libra_core.pipeline.plan_stage import decisions_path
from libra_core.pipeline.run_dir import RunState, new_run_dir, write_state
from libra_core.planner.replan import ReplanDecision

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ITERATIONS = (1, 2, 3, 4)
STAGE_COLS = STAGE_TIMING_COLUMNS[1:]


def history_row(iteration: int, rng: random.Random) -> dict[str, Any]:
    """A full history row: every schema column, distinct non-round values per iteration."""
    row: dict[str, Any] = {}
    for f in HISTORY_SCHEMA:
        row[f.name] = rng.randint(1, 5000) if pa.types.is_integer(f.type) else rng.uniform(0.01, 40.0)
    row.update(
        iteration=iteration,
        policy_version=iteration,
        reward_mean=rng.uniform(0.0, 1.0),
        accuracy=rng.uniform(0.0, 1.0),
        eval_s=rng.uniform(1.0, 3.0) if iteration % 2 == 0 else None,  # eval every 2 iterations
        eval_accuracy=rng.uniform(0.0, 1.0) if iteration % 2 == 0 else None,
        predicted_iteration_s=None,
    )
    return row


def make_run(root: Path, *, history: bool = True, timeline: bool = True) -> Path:
    cfg = load_config(None, [f"experiment.output_dir={root}", "experiment.name=report-test"])
    run = new_run_dir(cfg)
    write_resolved_config(cfg, run)
    if not history:
        return run
    rng = random.Random(11)
    t = 1_700_000_000.0
    for it in ITERATIONS:
        row = history_row(it, rng)
        append_history(run, row)
        if timeline:
            spans = [Span(it, "plan", t, t + 0.01), Span(it, "rollout", t + 0.01, t + row["rollout_s"])]
            spans += [Span(it, "instance/vllm-0", t + 0.02, t + row["rollout_s"] - 0.1)]
            spans += [Span(it, "instance/vllm-1", t + 0.05, t + row["rollout_s"] / 2)]
            t += row["rollout_s"]
            spans += [
                Span(it, "update", t, t + row["update_s"]),
                Span(it, "sync", t + row["update_s"], t + 40.0),
            ]
            write_timeline(run, it, spans)
            t += 40.0
    if timeline:
        write_perfetto(run)
    write_state(run, RunState(len(ITERATIONS), len(ITERATIONS), "finished"))
    return run


class _Cells(HTMLParser):
    """Collects the report's data-* cells, tables and images."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[str] = []
        self.cells: dict[tuple[str, str, str], tuple[str, str]] = {}  # (table, iteration, col)
        self.summary: dict[str, tuple[str, str]] = {}  # key -> (value attr, text)
        self.images: dict[str, str] = {}
        self._open: dict[str, str] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self.tables.append(a["data-table"])
        elif tag == "td":
            self._open, self._text = a, ""
        elif tag == "img":
            self.images[a["data-figure"]] = a["src"]

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag != "td" or self._open is None:
            return
        a, self._open = self._open, None
        if "data-key" in a:
            self.summary[a["data-key"]] = (a["data-value"], self._text)
        else:
            self.cells[(self.tables[-1], a["data-iteration"], a["data-col"])] = (a["data-value"], self._text)


def parse(path: Path) -> _Cells:
    parser = _Cells()
    parser.feed(path.read_text())
    return parser


def test_html_stage_timings_match_history_and_median(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    history = read_history(run)
    path = build_report(run)
    assert path == run / "report.html"
    cells = parse(path)

    for h in history:
        for col in STAGE_COLS:
            value, text = cells.cells[("stage_timing", str(h["iteration"]), col)]
            if h[col] is None:
                assert (value, text) == ("", "-")
            else:
                assert text == f"{h[col]:.3f}"
                assert float(value) == h[col]
    for col in STAGE_COLS:
        expected = statistics.median(h[col] for h in history if h[col] is not None)
        value, text = cells.cells[("stage_timing", "median", col)]
        assert float(value) == pytest.approx(expected)
        assert text == f"{expected:.3f}"
    # eval ran in iterations 2 and 4 only: the median is theirs, not skewed by missing values.
    assert float(cells.cells[("stage_timing", "median", "eval_s")][0]) == pytest.approx(
        (history[1]["eval_s"] + history[3]["eval_s"]) / 2
    )
    for h in history:
        for col in ("routing_moves", "routing_migrations", "migrated_tokens", "rollout_instances"):
            assert cells.cells[("scheduler", str(h["iteration"]), col)] == (str(h[col]), str(h[col]))


def test_html_summary_figures_and_static_plan(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    history = read_history(run)
    cells = parse(build_report(run))
    walls = [h["iteration_s"] for h in history]
    summary = cells.summary
    assert summary["name"][1] == "report-test"
    assert summary["status"][1] == "finished"
    assert summary["iterations_done"][1] == "4" and summary["policy_version"][1] == "4"
    assert float(summary["total_iteration_s"][0]) == pytest.approx(sum(walls))
    assert float(summary["median_iteration_s"][0]) == pytest.approx(statistics.median(walls))
    assert summary["first_reward_mean"][1] == f"{history[0]['reward_mean']:.3f}"
    assert summary["last_reward_mean"][1] == f"{history[-1]['reward_mean']:.3f}"
    assert float(summary["last_eval_accuracy"][0]) == history[3]["eval_accuracy"]

    assert set(cells.images) == {"timeline_last", "timeline_run", "curves"}
    for src in cells.images.values():
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix) :]).startswith(PNG_MAGIC)
    text = (run / "report.html").read_text()
    assert "planner" not in cells.tables and "static plan" in text
    assert str(timeline_dir(run) / "trace.json") in text
    assert "Timeline of the whole run (iterations 1-4)" in text


def test_planner_decisions_table(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    decision = ReplanDecision(
        iteration=3,
        action="apply",
        reason="saving beats the move",
        current_t_iter_s=120.5,
        proposed_t_iter_s=98.25,
        saving_per_iter_s=22.25,
        expected_iterations=50,
        move_cost_s=30.0,
        amortised_gain_s=1082.5,
        min_gain_fraction=0.05,
        window_trajectories=64,
        window_mean_len=812.4,
        window_p90_len=2048.0,
        current_split="train 4 | rollout 4",
        proposed_split="train 2 | rollout 6",
    )
    decisions_path(run).parent.mkdir(parents=True)
    decisions_path(run).write_text(json.dumps(decision.as_record()) + "\n\n")
    assert planner_rows(run) == [decision.as_record()]
    cells = parse(build_report(run))
    assert "planner" in cells.tables
    assert cells.cells[("planner", "3", "action")] == ("apply", "apply")
    assert cells.cells[("planner", "3", "proposed_t_iter_s")] == ("98.25", "98.250")
    assert cells.cells[("planner", "3", "proposed_split")][1] == "train 2 | rollout 6"


def test_malformed_planner_line_names_file_and_line(tmp_path: Path) -> None:
    decisions_path(tmp_path).parent.mkdir(parents=True)
    first = '{"iteration": 1, "action": "initial"}\n'
    # a torn last line is what a killed run leaves: skipped, as the plan stage skips it
    decisions_path(tmp_path).write_text(first + '{"iteration": 2,\n')
    assert planner_rows(tmp_path) == [{"iteration": 1, "action": "initial"}]
    decisions_path(tmp_path).write_text('{"iteration": 2,\n' + first)
    with pytest.raises(ValueError, match=r"decisions\.jsonl: line 1 "):
        planner_rows(tmp_path)
    decisions_path(tmp_path).write_text("[1, 2]\n" + first)
    with pytest.raises(ValueError, match=r"decisions\.jsonl: line 1 .*not an object"):
        planner_rows(tmp_path)
    assert planner_rows(tmp_path / "elsewhere") == []


def test_markdown_report_writes_pngs_next_to_it(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    history = read_history(run)
    out = tmp_path / "reports" / "my run.md"  # a space: each image link must stay one link
    assert build_report(run, out, fmt="md") == out
    text = out.read_text()
    for name in ("my run_timeline_last.png", "my run_timeline_run.png", "my run_curves.png"):
        assert (out.parent / name).read_bytes().startswith(PNG_MAGIC)
        assert f"](<{name}>)" in text
    median = stage_timing_summary(history)
    median_line = next(line for line in text.splitlines() if line.startswith("| median |"))
    assert median_line == "| median | " + " | ".join(f"{median[c]:.3f}" for c in STAGE_COLS) + " |"
    assert f"| 1 | {history[0]['plan_s']:.3f} |" in text
    assert "static plan" in text


def test_a_nan_iteration_time_is_left_out_of_the_total_as_of_the_median(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the median skipped it, the total read "nan" (a foreign or hand-edited history)
    real = history_row
    monkeypatch.setitem(  # this module's own globals, however pytest imported it
        make_run.__globals__,
        "history_row",
        lambda it, rng: real(it, rng) | ({"iteration_s": math.nan} if it == 2 else {}),
    )
    run = make_run(tmp_path, timeline=False)
    walls = [h["iteration_s"] for h in read_history(run) if h["iteration"] != 2]
    summary = parse(build_report(run)).summary
    assert float(summary["total_iteration_s"][0]) == pytest.approx(sum(walls))
    assert float(summary["median_iteration_s"][0]) == pytest.approx(statistics.median(walls))


def test_report_without_timeline_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path, timeline=False)
    path = build_report(run)
    cells = parse(path)
    assert set(cells.images) == {"curves"}
    assert "No timeline was recorded" in path.read_text()
    assert "trace.json" not in path.read_text()


def test_a_damaged_span_file_is_left_out_of_the_report_and_named(tmp_path: Path) -> None:
    # one damaged timeline/iteration=N.json stopped the whole report (exit 2, no report.html)
    run = make_run(tmp_path)
    (timeline_dir(run) / "iteration=2.json").write_text("[{")
    path = build_report(run)
    cells = parse(path)
    assert {"timeline_last", "timeline_run", "curves"} <= set(cells.images)
    text = path.read_text()
    assert "Left out, damaged: " in text and "iteration=2.json: not a timeline file" in text
    assert "Left out, damaged: " in build_report(run, fmt="md").read_text()


def test_long_run_timeline_shows_last_five_iterations(tmp_path: Path) -> None:
    run = make_run(tmp_path, timeline=False)
    for it in range(1, 26):
        write_timeline(
            run,
            it,
            [Span(it, "rollout", 10.0 * it, 10.0 * it + 6), Span(it, "update", 10.0 * it + 6, 10.0 * it + 9)],
        )
    text = build_report(run).read_text()
    assert "Timeline of the last 5 iterations (iterations 21-25)" in text
    assert "Timeline of iteration 25" in text


def test_run_without_history_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path, history=False)
    with pytest.raises(ValueError, match="has no iterations recorded yet"):
        build_report(run)
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        build_report(run, fmt="pdf")


def test_stage_timing_rows_keep_exact_values() -> None:
    rng = random.Random(3)
    history = [history_row(it, rng) for it in (1, 2, 3)]
    rows = stage_timing_rows(history)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert rows[2]["update_s"] == history[2]["update_s"]  # not rounded
    assert rows[0]["eval_s"] is None and list(rows[0]) == list(STAGE_TIMING_COLUMNS)
    no_eval = [dict(h, eval_s=None) for h in history]
    assert stage_timing_summary(no_eval)["eval_s"] is None
    assert stage_timing_summary(history)["sync_s"] == statistics.median(h["sync_s"] for h in history)


def test_a_nan_timing_does_not_move_the_median() -> None:
    # statistics.median does not order NaN: [nan, 12.6, 8.5, 25.2] gave 10.57, [12.6, nan, ...] nan
    rng = random.Random(3)
    values = [12.618, 8.522, 25.163]
    for at in range(4):
        column = [*values[:at], math.nan, *values[at:]]
        history = [dict(history_row(i + 1, rng), rollout_s=v) for i, v in enumerate(column)]
        assert stage_timing_summary(history)["rollout_s"] == 12.618, at
    all_nan = [dict(history_row(1, rng), rollout_s=math.nan)]
    assert stage_timing_summary(all_nan)["rollout_s"] is None


def test_markdown_table_formats_values() -> None:
    rows = [{"name": "a|b", "x": 1.23456, "n": 7}, {"name": "c", "x": None}]
    assert markdown_table(rows, ["name", "x", "n"]) == (
        "| name | x | n |\n|---|---|---|\n| a\\|b | 1.235 | 7 |\n| c | - | - |\n"
    )
    assert markdown_table(rows[:1], ["x"], floats="{:.1f}") == "| x |\n|---|\n| 1.2 |\n"
    # a line break (a planner reason) ended the table mid-row
    assert (
        markdown_table([{"reason": "keep:\nno saving"}], ["reason"])
        == "| reason |\n|---|\n| keep: no saving |\n"
    )


def test_plots_refuse_empty_input_and_write_pngs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no spans"):
        gantt_png([], tmp_path / "g.png")
    with pytest.raises(ValueError, match="history is empty"):
        curves_png([], tmp_path / "c.png")
    path = gantt_png([Span(1, "rollout", 5.0, 7.0), Span(1, "instance/vllm-0", 5.0, 6.0)], tmp_path / "g.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_cli_report_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path, timeline=False)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(run / "report.html") and (run / "report.html").is_file()
    assert main(["report", str(run), "--format", "md", "--out", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").is_file() and (tmp_path / "r_curves.png").is_file()


@pytest.mark.parametrize("case", ["missing", "not-a-run", "no-history"])
def test_cli_report_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    if case == "missing":
        target, needle = tmp_path / "nowhere", "no such folder"
    elif case == "not-a-run":
        target, needle = tmp_path, "not a run folder (no config.resolved.yaml)"
    else:
        target, needle = make_run(tmp_path, history=False), "has no iterations recorded yet"
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(target) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_one_iteration_run_has_one_reward_row(tmp_path: Path) -> None:
    # its first iteration is its last: the summary printed the same reward row twice (until 2026-12-07)
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}", "experiment.name=one"])
    run = new_run_dir(cfg)
    write_resolved_config(cfg, run)
    append_history(run, history_row(1, random.Random(3)))
    summary = parse(build_report(run)).summary
    assert "first_reward_mean" in summary and "last_reward_mean" not in summary
