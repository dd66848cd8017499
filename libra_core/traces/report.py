"""Tables of trace-evaluation records (evaluate.py) for the CLI and the docs, and a one-line
summary of a trace (`trace_summary`, what `libra trace export|synth` print).

`format_plain` gives a Markdown table (docs, logs, `--json`-less scripts); `format_rich` a rich
Table for the terminal. Rows keep the order given; the best non-oracle score is marked with `*`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from libra_core.traces.evaluate import METRICS
from libra_core.traces.schema import TOOL_STATUSES, TraceTrajectory

if TYPE_CHECKING:
    from rich.table import Table

COLUMNS = ("scheduler", *METRICS, "moves")


def _best(records: Sequence[Mapping[str, Any]]) -> str | None:
    candidates = [r for r in records if r["scheduler"] != "oracle"]
    return max(candidates, key=lambda r: r["score"])["scheduler"] if candidates else None


def _cells(record: Mapping[str, Any], best: str | None) -> list[str]:
    name = record["scheduler"] + (" *" if record["scheduler"] == best else "")
    return [name, *(f"{record[m]:.3f}" for m in METRICS), str(record.get("moves", ""))]


def format_plain(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table, one row per record; `*` marks the best score among non-oracle schedulers."""
    best = _best(records)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cells(r, best)) + " |" for r in records]
    return "\n".join(lines)


def format_rich(records: Sequence[Mapping[str, Any]], title: str | None = None) -> Table:
    """The same table as a rich Table (rich is imported lazily)."""
    from rich.table import Table

    best = _best(records)
    table = Table(title=title)
    for i, col in enumerate(COLUMNS):
        table.add_column(col, justify="left" if i == 0 else "right")
    for r in records:
        table.add_row(*_cells(r, best), style="bold" if r["scheduler"] == best else None)
    return table


def trace_summary(trace: Sequence[TraceTrajectory]) -> str:
    """Trajectories, mean tokens, tool calls by status, and the recorded latencies' range and median."""
    calls = [(u, x) for t in trace for u, x in zip(t.turns, t.turn_latencies_s(), strict=True) if u.tool]
    statuses: Counter[str | None] = Counter(u.status for u, _ in calls)
    timed = sorted(x for _, x in calls if x is not None)
    mean = statistics.fmean(t.size for t in trace) if trace else 0.0
    parts = [f"{len(trace):,} trajectories of {mean:,.1f} tokens on average"]
    by_status = ", ".join(f"{statuses[s]:,} {s}" for s in TOOL_STATUSES if statuses[s])
    parts.append(f"{len(calls):,} tool calls" + (f" ({by_status})" if by_status else ""))
    if timed:
        parts.append(
            f"{len(timed):,} with their latency: {timed[0]:.3g}-{timed[-1]:.3g} s, "
            f"median {statistics.median(timed):.3g} s"
        )
    else:
        parts.append("none with its latency")
    return "; ".join(parts)
