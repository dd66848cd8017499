"""`benchmarks/sim_diag.py --slowest=N`: iteration 0's last trajectories to finish."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_diag.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_slowest_lists_the_last_finishers_and_the_first_ends_the_rollout() -> None:
    out = _run("tiny", "1", "+planning", "--slowest=3")
    assert out.returncode == 0, out.stderr
    rollout = float(re.search(r"rollout\s+([\d.]+) s", out.stdout).group(1))  # type: ignore[union-attr]
    rows = re.findall(r"slowest:\s+([\d.]+) s on TP(\d+) \| (\d+) turns, (\d+) generated", out.stdout)
    assert len(rows) == 3
    latencies = [float(r[0]) for r in rows]
    assert latencies == sorted(latencies, reverse=True)
    # One iteration, every trajectory admitted at the rollout's start: the last one ends it.
    assert abs(latencies[0] - rollout) <= 0.1
    assert all(int(r[1]) in (1, 2, 4, 8) and int(r[2]) >= 1 and int(r[3]) > 0 for r in rows)


def test_a_bad_flag_value_is_a_clear_error() -> None:
    out = _run("tiny", "1", "+planning", "--slowest=many")
    assert out.returncode != 0
    assert "--slowest=N takes a non-negative integer" in out.stderr


def test_missing_arguments_print_the_usage() -> None:
    out = _run("tiny", "+planning")
    assert out.returncode != 0
    assert "sim_diag.py SCENARIO ITERATIONS POLICY" in out.stderr
