"""Simulator scripts: the price they print is the planner's (two-phase critical path by default),
`sim_table.py` checks everything before it simulates, `sim_diag.py --help` works, and the trace
table's percentiles follow one definition."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from libra_core.sim.settings import SimSettings
from tests.benchmarks.support import call_main, load_script, run_script


def _record_two_phase(module, monkeypatch) -> list[bool]:
    seen: list[bool] = []
    real = module.build_segment_table

    def spy(*a, **k):  # noqa: ANN202
        seen.append(k.get("two_phase", False))
        return real(*a, **k)

    monkeypatch.setattr(module, "build_segment_table", spy)
    return seen


@pytest.mark.parametrize(
    ("flags", "two_phase"), [([], True), (["--two-phase"], True), (["--capped-path"], False)]
)
def test_homogeneous_price_uses_the_planners_two_phase_path_by_default(
    monkeypatch, capsys, flags, two_phase
) -> None:
    assert SimSettings().two_phase_path is True  # the planner's and simulator's default
    module = load_script("sim_homogeneous_price")
    seen = _record_two_phase(module, monkeypatch)
    call_main(module, monkeypatch, "--scenario", "tiny", "--rollout-gpus", "2", *flags)
    assert seen and set(seen) == {two_phase}
    assert ("two-phase path" if two_phase else "capped path") in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "two_phase"), [([], True), (["--capped-path"], False)])
def test_crit_path_prices_the_table_as_the_planner_does(monkeypatch, capsys, flags, two_phase) -> None:
    module = load_script("sim_crit_path")
    seen = _record_two_phase(module, monkeypatch)
    call_main(module, monkeypatch, "--scenario", "tiny", *flags)
    assert seen == [two_phase]


def test_sim_table_checks_its_out_folder_before_simulating(tmp_path, monkeypatch, capsys) -> None:
    sim_table = load_script("sim_table")
    monkeypatch.setattr(sim_table, "simulate", lambda *a, **k: pytest.fail("simulated"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        call_main(sim_table, monkeypatch, "--scenarios", "tiny", "--out", str(tmp_path / "file" / "out"))
    assert exc.value.code == 2
    assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenarios", "tiny", "nope"], "unknown scenario 'nope'"),
        (["--scenarios", "tiny", "--policies", "nope"], "unknown policy 'nope'"),
        (["--scenarios", "tiny", "--spec", "group_size=x"], "'x' is not"),
        (["--scenarios", "tiny", "--setting", "no_such_field=1"], "--setting"),
        (["--scenarios", "tiny", "--hardware", "many"], "COUNTxGPU"),
    ],
)
def test_sim_table_bad_values_exit_2_before_simulating(monkeypatch, capsys, argv, message) -> None:
    sim_table = load_script("sim_table")
    monkeypatch.setattr(sim_table, "simulate", lambda *a, **k: pytest.fail("simulated"))
    with pytest.raises(SystemExit) as exc:
        call_main(sim_table, monkeypatch, *argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("sim_table.py: error: ") and message in err


def test_sim_table_docstring_points_at_where_sim_settings_lives() -> None:
    doc = load_script("sim_table").__doc__
    assert "libra_core/sim/settings.py" in doc and "engine.py" not in doc
    assert inspect.getsourcefile(SimSettings).endswith("libra_core/sim/settings.py")


def test_sim_diag_help_exits_0_and_reads_positionals_after_a_flag() -> None:
    out = run_script("sim_diag.py", "--help")
    assert out.returncode == 0 and "SCENARIO ITERATIONS POLICY" in out.stdout
    out = run_script("sim_diag.py", "--seed=1", "tiny", "2", "greedy")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("greedy ")


def test_elastic_join_help_says_the_whole_first_paragraph() -> None:
    out = run_script("elastic_join.py", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "step time with and without a join in progress (the join must not stall the core)." in text


def test_trace_table_header_percentiles_are_the_bucket_bounds(monkeypatch, capsys) -> None:
    """Ten sizes 1..10: nearest rank puts p50 at 5 and p90 at 9 (the bucket bounds); `sizes[n // 2]`
    and `sizes[int(0.9 n)]` said 6 and 10."""
    module = load_script("trace_eval_table")
    trace = [SimpleNamespace(size=s, iteration=0, prompt_id=f"p{s}") for s in range(10, 0, -1)]
    metrics = SimpleNamespace(class_accuracy=0.0, migration_token_ratio=0.0, score=0.0)
    monkeypatch.setattr(module, "read_trace", lambda path: trace)
    monkeypatch.setattr(module, "evaluate_schedulers", lambda *a: [])
    monkeypatch.setattr(module, "format_plain", lambda rows: "")
    monkeypatch.setattr(module, "replay", lambda *a, **k: metrics)
    monkeypatch.setattr(module, "CMLFQScheduler", lambda cfg: SimpleNamespace(counters={}))
    module.table_for("t", "t.parquet")
    out = capsys.readouterr().out
    assert "size p50/p90/max 5/9/10" in out
    assert "--buckets 5,9" in out
