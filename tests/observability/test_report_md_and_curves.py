"""The Markdown report's links and code spans name their files exactly, read as CommonMark (a `>` in
the report's name ended an image link early, a backtick in the run folder's path ended the trace's
code span); and the seconds-per-iteration bars stack every timed stage that `iteration_s` holds,
eval included."""

from __future__ import annotations

import random
from pathlib import Path
from urllib.parse import unquote

import pytest

from libra_core.data.history import STAGES
from libra_core.observability.plots import curves_figure
from libra_core.observability.report import build_report
from tests.observability.test_report import history_row, make_run


def _commonmark(text: str) -> tuple[list[str], list[str]]:
    """(image sources, code span texts) of `text` as a CommonMark renderer reads it."""
    markdown_it = pytest.importorskip("markdown_it")
    images, code = [], []
    for block in markdown_it.MarkdownIt("commonmark").parse(text):
        for tok in block.children or []:
            if tok.type == "image":
                images.append(unquote(str(tok.attrs["src"])))
            elif tok.type == "code_inline":
                code.append(tok.content)
    return images, code


@pytest.mark.parametrize("report_name", ["rep>x`y.md", "a <b> c.md", "back\\slash.md", "plain.md"])
def test_markdown_links_and_the_trace_path_read_back_exactly(tmp_path: Path, report_name: str) -> None:
    run = make_run(tmp_path / "runs `x` ``y")
    out = tmp_path / "out" / report_name
    text = build_report(run, out, fmt="md").read_text()
    images, code = _commonmark(text)
    stem = out.name.removesuffix(".md")
    assert images == [f"{stem}_timeline_last.png", f"{stem}_timeline_run.png", f"{stem}_curves.png"]
    assert all((out.parent / name).is_file() for name in images)
    assert code[0] == str(run / "timeline" / "trace.json")


def _stack_tops(history: list[dict]) -> list[float]:
    time_ax = curves_figure(history).axes[3]
    tops: dict[float, float] = {}
    for bar in time_ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    return [tops[it] for it in sorted(tops)]


def test_the_stacked_seconds_include_eval_where_it_ran() -> None:
    rng = random.Random(3)
    history = [history_row(it, rng) for it in (1, 2, 3, 4)]  # eval on 2 and 4
    assert [h["eval_s"] is None for h in history] == [True, False, True, False]
    expected = [sum(h[f"{s}_s"] for s in STAGES) + (h["eval_s"] or 0.0) for h in history]
    assert _stack_tops(history) == pytest.approx(expected)
    # without any eval the stack is the pipeline stages alone, with no empty eval series
    no_eval = [{**h, "eval_s": None, "eval_accuracy": None} for h in history]
    assert _stack_tops(no_eval) == pytest.approx([sum(h[f"{s}_s"] for s in STAGES) for h in no_eval])
    labels = curves_figure(no_eval).axes[3].get_legend_handles_labels()[1]
    assert (
        "eval_s" not in labels and "eval_s" in curves_figure(history).axes[3].get_legend_handles_labels()[1]
    )
