"""Rich progress bars while an experiment runs, and the summary table at the end."""

from __future__ import annotations

import logging
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from libra_core.data.history import STAGES, read_history
from libra_core.observability import progress

console = Console()


def run_with_progress(config_path: str | None, overrides: list[str], resume: str | None) -> int:
    from flows.rl_experiment import rl_experiment

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-update "Loading weights" bars would break ours
    bars = Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def listener(stage: str, advance: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        task_id = tasks[stage]
        if stage in ("rollout", "eval") and advance == 0:
            bars.reset(task_id, total=total)  # one bar reused by every iteration
        else:
            bars.update(task_id, advance=advance, total=total)

    progress.add_listener(listener)
    start = time.perf_counter()
    try:
        with bars:
            run_dir = rl_experiment(config_path, overrides, resume)
    finally:
        progress.remove_listener(listener)
    print_summary(run_dir, time.perf_counter() - start)
    return 0


def print_summary(run_dir: str, wall_s: float) -> None:
    rows = read_history(run_dir)
    table = Table(title="Per-iteration stage timings (s) and reward")
    for col in ("iter", *STAGES, "total", "tokens", "reward", "acc", "eval acc"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["iteration"]),
            *(f"{r[f'{s}_s']:.2f}" for s in STAGES),
            f"{r['iteration_s']:.2f}",
            str(r["tokens_generated"]),
            f"{r['reward_mean']:.3f}",
            f"{r['accuracy']:.2f}",
            "" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.2f}",
        )
    console.print(table)
    if rows:
        totals = {s: sum(r[f"{s}_s"] for r in rows) for s in STAGES}
        share = ", ".join(f"{s} {totals[s]:.1f}s" for s in STAGES)
        k = min(3, len(rows))
        first = sum(r["reward_mean"] for r in rows[:k]) / k
        last = sum(r["reward_mean"] for r in rows[-k:]) / k
        console.print(f"stage totals: {share}")
        console.print(
            f"mean reward, first {k} iterations: {first:.3f}; last {k}: {last:.3f} "
            f"(change {last - first:+.3f})"
        )
    # the path as text, not markup: an output_dir like `runs[red]` or `serve[/x]` is shown as it is
    console.print(Text.assemble("run folder: ", (run_dir, "bold"), f"  (wall {wall_s:.0f}s)"))
