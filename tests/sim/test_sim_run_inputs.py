"""What a `simulate` call checks before it simulates, and how it delivers: the policy list, the
seed, every policy's first deployment and the output folder up front; the table before the files
(`libra simulate`); the `simulate` flow's inputs and its default output folder."""

from __future__ import annotations

import errno
import json
from datetime import datetime
from pathlib import Path

import pytest

import flows.simulate_flow as simulate_flow_module
from flows.simulate_flow import simulate_flow
from libra_core.scheduling.base import Turn
from libra_core.sim import POLICIES, format_table, resolve_policies, simulate
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import CALIBRATION
from libra_core.sim.report import SimReport
from libra_core.traces.schema import TraceTrajectory, trace_table, write_trace

ALL = [p for p in POLICIES if p not in CALIBRATION]


def _names(names: list[str]) -> list[str]:
    return [p.name for p in resolve_policies(names)]


def test_policies_are_resolved_each_once_in_order() -> None:
    assert _names(["greedy", "greedy", "libra", "+elastic"]) == ["greedy", "+elastic"]
    assert _names(["static-optimal", "all"]) == ["static-optimal", *[p for p in ALL if p != "static-optimal"]]
    assert _names(["oracle-routing", "all", "greedy"]) == ["oracle-routing", *ALL]
    assert _names(["all"]) == ALL
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        resolve_policies(["all", "nope"])


def test_a_policy_named_twice_runs_once(tmp_path: Path) -> None:
    report = simulate("tiny", "8xA800", 1, ["greedy", "greedy"], out_dir=tmp_path)
    assert [r.policy for r in report.results] == ["greedy"]
    assert (tmp_path / "iterations.csv").read_text().splitlines()[0] == "iteration,greedy"


def test_a_negative_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        simulate("tiny", "8xA800", 1, ["greedy"], seed=-1)


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    run = Simulator.run

    def counted(self: Simulator) -> object:
        ran.append(self.p.name)
        return run(self)

    monkeypatch.setattr(Simulator, "run", counted)
    return ran


def test_a_policy_that_cannot_deploy_stops_the_run_before_any_policy_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 14B model trains on 4 A800s (colocated) but not on the fixed split's 2: before 2026-12-06
    # colocated ran its whole simulation first.
    ran = _count_runs(monkeypatch)
    with pytest.raises(
        ValueError, match="policy static-uniform cannot deploy: qwen3-14b does not train on 2"
    ):
        simulate("tiny", "4xA800", 2, ["colocated", "static-uniform"], model="qwen3-14b")
    assert ran == []


def test_an_output_file_in_a_folders_place_is_refused_before_simulating(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = _count_runs(monkeypatch)
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(ValueError, match=r"summary.json: is a folder"):
        simulate("tiny", "8xA800", 1, ["greedy"], out_dir=tmp_path)
    assert ran == []


def test_a_trace_replay_is_labelled_without_a_seed(tmp_path: Path) -> None:
    turns = (Turn(30, "calc", 5, "success"), Turn(20, None, 0, None))
    rows = [TraceTrajectory(f"t{g}", "p0", 0, 50, turns, (0.5, None)) for g in range(4)]
    trace = write_trace(trace_table(rows), tmp_path / "t.parquet")
    report = simulate(trace, "8xA800", 1, ["greedy"], seed=3, out_dir=tmp_path / "out")
    assert report.seed is None
    assert format_table(report).splitlines()[0].endswith("1 iterations, trace replay (no seed)")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["seed"] is None
    generated = simulate("tiny", "8xA800", 1, ["greedy"], seed=3)
    assert format_table(generated).splitlines()[0].endswith("1 iterations, seed 3")


def _cli(tmp_path: Path, *extra: str) -> int:
    from flows.cli import main

    argv = ["simulate", "--scenario", "tiny", "--hardware", "8xA800", "--iterations", "1"]
    return main([*argv, "--policies", "greedy", "--out", str(tmp_path / "out"), *extra])


def test_the_cli_prints_the_table_before_a_write_that_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A full disk while writing: before 2026-12-06 the run ended in a traceback and no table.
    def full(self: SimReport, out_dir: Path) -> list[Path]:
        raise OSError(errno.ENOSPC, "No space left on device", str(out_dir / "summary.json"))

    monkeypatch.setattr(SimReport, "write", full)
    assert _cli(tmp_path) == 2
    out = capsys.readouterr()
    assert "| greedy |" in out.out
    assert f"not saved: cannot write {tmp_path / 'out' / 'summary.json'}: No space left on device" in out.err


def test_the_cli_refuses_an_output_file_in_a_folders_place_before_simulating(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = _count_runs(monkeypatch)
    (tmp_path / "out" / "policies.csv").mkdir(parents=True)
    assert _cli(tmp_path) == 2
    assert "policies.csv: is a folder" in capsys.readouterr().err and ran == []


class _Stop(Exception):
    """Raised by the stand-in task: what the flow passed it is recorded, nothing is simulated."""


def _stub_task(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """The flow's task replaced by a recorder that stops the flow; the calls it got."""
    calls: list[tuple[object, ...]] = []

    def task(*args: object) -> None:
        calls.append(args)
        raise _Stop

    monkeypatch.setattr(simulate_flow_module, "simulate_task", task)
    return calls


def test_the_flow_strips_policy_names_as_the_cli_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stub_task(monkeypatch)
    with pytest.raises(_Stop):
        simulate_flow.fn("tiny", "8xA800", 1, "greedy, +elastic ,", out_dir=str(tmp_path))
    assert calls[0][3] == ["greedy", "+elastic"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"iterations": 0}, "iterations must be >= 1, got 0"),
        ({"scenario": "nope"}, "unknown scenario 'nope'"),
        ({"scenario": "/nowhere/t.parquet"}, "no such trace file"),
        ({"spec": ["tool_latency_s=1e7"]}, r"tool_latency_s must be in \(0, 86,400\]"),
        ({"spec": ["prompt_latency_sigma=10"]}, r"prompt_latency_sigma must be in \[0, 2\], got 10"),
        ({"settings": ["num_bins=100000"]}, r"num_bins must be in \[1, 128\], got 100000"),
        ({"settings": ["cmlfq_cost_ratio=1e308"]}, r"cmlfq_cost_ratio must be in \[0, 100\]"),
        ({"policies": " , "}, "names no policy"),
        ({"hardware": "1xA800"}, "greedy: each splits the cluster into training and rollout GPUs"),
        ({"scenario": "junk.parquet"}, "cannot be read as a Parquet trace"),
    ],
)
def test_the_flow_checks_its_inputs_before_the_task(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    calls = _stub_task(monkeypatch)
    args: dict[str, object] = {
        "scenario": "tiny",
        "hardware": "8xA800",
        "iterations": 1,
        "policies": "greedy",
    }
    if kwargs.get("scenario") == "junk.parquet":  # no trace (read only in the task until 2026-12-07)
        junk = tmp_path / "junk.parquet"
        junk.write_text("not parquet")
        kwargs = {"scenario": str(junk)}
    with pytest.raises(ValueError, match=message):
        simulate_flow.fn(**{**args, "base_dir": str(tmp_path), **kwargs})
    assert calls == [] and not (tmp_path / "runs").exists()


def test_the_flows_default_folder_is_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Named after the second the flow ended: two runs ending in one second wrote into one folder.
    class Clock:
        @staticmethod
        def now() -> datetime:
            return datetime(2026, 12, 6, 12, 0, 0)

    monkeypatch.setattr(simulate_flow_module, "datetime", Clock)
    parent = tmp_path / "runs" / "simulate"
    first = simulate_flow_module._claim_run_folder(parent, "tiny")
    second = simulate_flow_module._claim_run_folder(parent, "tiny")
    assert (first.name, second.name) == ("tiny-20261206-120000", "tiny-20261206-120000-2")
    assert first.is_dir() and second.is_dir()

    claimed: list[Path] = []

    def task(*args: object) -> None:  # the folder exists while the simulation runs
        claimed.extend(p for p in parent.iterdir() if p not in (first, second))
        raise _Stop

    monkeypatch.setattr(simulate_flow_module, "simulate_task", task)
    with pytest.raises(_Stop):
        simulate_flow.fn("tiny", "8xA800", 1, "greedy", base_dir=str(tmp_path))
    assert [p.name for p in claimed] == ["tiny-20261206-120000-3"]
    assert sorted(parent.iterdir()) == [first, second]  # the failed run's empty folder is removed
