"""Tables of trace-evaluation records (evaluate.py) for the CLI and the docs.

`format_plain` gives a Markdown table (docs, logs, `--json`-less scripts); `format_rich` a rich
Table for the terminal. Rows keep the order given; the best non-oracle score is marked with `*`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from libra_core.traces.evaluate import METRICS

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
