"""`benchmarks/sim_table.py --seeds`: the per-seed summary it prints under the tables."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from libra_core.sim import simulate
from libra_core.sim.report import verdicts

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_table.py"
POLICIES = ["colocated", "greedy", "static-optimal", "+elastic"]


def _format_seed_summary():  # the script is not a package module: load it from its file
    spec = importlib.util.spec_from_file_location("sim_table", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.format_seed_summary


def test_seed_summary_lists_each_policy_by_seed_with_its_range_and_the_verdicts() -> None:
    seeds = [0, 1, 2]
    reports = [simulate("tiny", "8xA800", 2, POLICIES, seed=s) for s in seeds]
    lines = _format_seed_summary()("tiny", seeds, reports).splitlines()
    assert lines[0] == "tiny: 3 seeds"
    assert lines[1] == "| policy | seed 0 | seed 1 | seed 2 | min | max |"
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines[3:]}
    assert list(rows) == [*POLICIES, "ordering verdict"]  # no ablation row: its policies did not run
    for name in POLICIES:
        tok = [r.result(name).tokens_per_s for r in reports]
        cells = rows[name].strip("| ").split(" | ")[1:]
        assert cells == [f"{t:,.0f}" for t in [*tok, min(tok), max(tok)]]
    held = sum(bool(verdicts(r).ordering) for r in reports)
    assert rows["ordering verdict"].endswith(f"| {held} of 3 hold | |")
