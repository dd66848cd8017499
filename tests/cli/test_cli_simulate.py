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
    # Progress bars go to stderr, one per policy and the lower bound, each at 2/2 at the end;
    # stdout stays a table a script can parse.
    bars = [line.split()[0:2] for line in out.stderr.splitlines() if "2/2" in line]
    assert [b[0] for b in bars] == ["greedy", "+cmlfq", "lower"], out.stderr
    assert out.stdout.splitlines()[1].startswith("| policy |") and "━" not in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    text = json.dumps(summary)
    assert "greedy" in text and "+cmlfq" in text


def test_simulate_jobs_print_the_same_table() -> None:
    args = ("simulate", "--scenario", "tiny", "--hardware", "8xH100", "--iterations", "2")
    args += ("--policies", "greedy,static-optimal,+cmlfq")
    one, two = libra(*args), libra(*args, "--jobs", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    assert one.stdout == two.stdout and "| +cmlfq |" in two.stdout


def test_simulate_bad_names_exit_2() -> None:
    for args, needle in [
        (("--scenario", "nowhere", "--hardware", "8xH100"), "nowhere"),
        (("--scenario", "tiny", "--hardware", "8xB300"), "B300"),
        (("--scenario", "tiny", "--hardware", "8xH100", "--policies", "magic"), "magic"),
        (("--scenario", "tiny", "--hardware", "8xH100", "--jobs", "0"), "--jobs must be >= 1, got 0"),
        (("--scenario", "tiny", "--hardware", "1xH100", "--policies", "greedy"), "needs at least 2 GPUs"),
    ]:
        out = libra("simulate", *args, "--iterations", "1")
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", "")


def test_simulate_what_if_flags_change_the_run() -> None:
    base = ("simulate", "--scenario", "tiny", "--hardware", "8xH100", "--iterations", "2")
    base += ("--policies", "greedy")

    def greedy_row(*extra: str) -> str:
        out = libra(*base, *extra)
        assert out.returncode == 0, out.stderr
        return next(line for line in out.stdout.splitlines() if line.startswith("| greedy"))

    plain = greedy_row()
    assert greedy_row("--spec", "prompts_per_iteration=8", "gen_median=200") != plain
    assert greedy_row("--setting", "max_num_seqs=2") != plain  # a smaller batch per instance
    assert greedy_row("--setting", "max_num_seqs=256") == plain  # the default, given explicitly


def test_simulate_bad_what_if_flags_exit_2() -> None:
    for args, needle in [
        (("--setting", "spill=1"), "spill_factor"),  # unknown field: the valid ones are listed
        (("--setting", "spill_factor=fast"), "not a number"),
        (("--setting", "sticky_turns=maybe"), "not true or false"),
        (("--setting", "spill_factor=0"), "spill_factor must be > 0"),
        (("--spec", "group_size=2.5"), "not a whole number"),
        (("--spec", "fail_prob=1.5"), "fail_prob must be in [0, 1]"),
        (("--spec", "model=qwen3-8b"), "expected FIELD=VALUE"),  # text fields are not editable
    ]:
        out = libra("simulate", "--scenario", "tiny", "--hardware", "8xH100", "--iterations", "1", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", ""), (args, out.stderr)
