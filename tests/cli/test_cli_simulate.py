"""`libra simulate` as a user runs it: a table and output files; clear errors for bad names."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import libra


def test_simulate_tiny_writes_summary(tmp_path: Path) -> None:
    out = libra(
        "simulate", "--scenario", "tiny", "--hardware", "8xH100", "--iterations", "2",
        "--policies", "greedy,+cmlfq", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "greedy" in out.stdout and "+cmlfq" in out.stdout and "lower bound" in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    text = json.dumps(summary)
    assert "greedy" in text and "+cmlfq" in text


def test_simulate_bad_names_exit_2() -> None:
    for args, needle in [
        (("--scenario", "nowhere", "--hardware", "8xH100"), "nowhere"),
        (("--scenario", "tiny", "--hardware", "8xB300"), "B300"),
        (("--scenario", "tiny", "--hardware", "8xH100", "--policies", "magic"), "magic"),
    ]:
        out = libra("simulate", *args, "--iterations", "1")
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", "")
