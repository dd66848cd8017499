"""A list flag given twice keeps both values (`--spec a=1 --spec b=2`), and a list flag with a
default replaces it on first use rather than adding to it."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from tests.benchmarks.support import call_main, load_script, run_script


def test_repeated_spec_flags_accumulate_in_sim_workload_shape() -> None:
    out = run_script(
        "sim_workload_shape.py",
        *("--scenario", "tiny", "--spec", "prompts_per_iteration=8", "--spec", "group_size=2"),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("tiny: 8 prompts x 2,")  # both --spec values held


def test_sim_table_gathers_every_spec_setting_scenario_and_policy_flag(monkeypatch) -> None:
    sim_table = load_script("sim_table")
    calls: list[tuple] = []

    def simulate(scenario, hardware, iterations, names, **kw):  # noqa: ANN001, ANN202
        calls.append((scenario, names, kw["settings"], kw["spec_overrides"]))
        return SimpleNamespace(results=[])

    monkeypatch.setattr(sim_table, "simulate", simulate)
    monkeypatch.setattr(sim_table, "format_table", lambda report: "")
    monkeypatch.setattr(sim_table, "format_verdicts", lambda report: [])
    call_main(
        sim_table,
        monkeypatch,
        *("--scenarios", "tiny", "--scenarios", "dapo-math", "--iterations", "1"),
        *("--spec", "group_size=2", "--spec", "mean_subtasks=2"),
        *("--setting", "spill_factor=1", "--setting", "move_reprefill=false"),
        *("--policies", "greedy", "--policies", "colocated"),
    )
    assert [c[0] for c in calls] == ["tiny", "dapo-math"]  # the default list replaced, not extended
    for _, names, settings, spec in calls:
        assert names == ["greedy", "colocated"]
        assert spec == {"group_size": 2, "mean_subtasks": 2}
        assert settings.spill_factor == 1 and settings.move_reprefill is False


def test_sim_diag_flags_and_positionals_mix_in_any_order() -> None:
    out = run_script("sim_diag.py", "--seed=1", "tiny", "--slowest=2", "1", "greedy", "spill_factor=1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("greedy ") and out.stdout.count("slowest:") == 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], ["a", "b"]), (["--x", "c"], ["c"]), (["--x", "c", "d", "--x", "e"], ["c", "d", "e"])],
)
def test_extend_list_replaces_the_default_then_gathers(argv: list[str], expected: list[str]) -> None:
    args_mod = load_script("_args")
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", nargs="+", action=args_mod.ExtendList, default=["a", "b"])
    assert ap.parse_args(argv).x == expected
    assert ap.parse_args([]).x == ["a", "b"]  # the default list itself was not changed
