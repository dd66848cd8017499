"""The simulate flow (what `libra serve` deploys) gives the same numbers as `libra simulate`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from libra_core.sim import simulate


def test_simulate_flow_matches_the_library_and_writes_outputs(prefect_quiet, tmp_path: Path) -> None:
    from flows.simulate_flow import simulate_flow

    # Two jobs: the policies run in worker processes spawned from the task, with the same numbers.
    out = Path(
        simulate_flow("tiny", "8xA800", 2, "greedy,+cmlfq", seed=3, out_dir=str(tmp_path / "sim"), jobs=2)
    )
    assert out == (tmp_path / "sim").resolve()
    summary = json.loads((out / "summary.json").read_text())
    direct = simulate("tiny", "8xA800", 2, ["greedy", "+cmlfq"], seed=3)
    assert [r["policy"] for r in summary["results"]] == [r.policy for r in direct.results]
    assert [r["makespan_s"] for r in summary["results"]] == [r.makespan_s for r in direct.results]
    assert (out / "iterations.csv").read_text().count("\n") == 3  # header + 2 iterations
    assert sorted(p.name for p in out.glob("*.png")) == ["iterations.png", "throughput.png"]


def test_simulate_flow_shows_its_progress_as_an_artifact(prefect_quiet, tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    from flows.simulate_flow import simulate_flow

    state = simulate_flow("tiny", "8xA800", 2, "greedy", out_dir=str(tmp_path / "sim"), return_state=True)
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]), type=ArtifactFilterType(any_=["progress"])
            )
        )
    assert [a.data for a in found] == [100.0]  # one artifact, at 100% once every stage is done
    assert found[0].description is not None and "tiny on 8xA800" in found[0].description


def test_simulate_flow_rejects_unknown_policy(prefect_quiet) -> None:
    from flows.simulate_flow import simulate_flow

    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        simulate_flow("tiny", "8xA800", 2, "nope")


def test_simulate_flow_checks_its_output_folder_before_simulating(
    prefect_quiet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flows.simulate_flow as module

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before the output folder was checked")

    monkeypatch.setattr(module, "simulate_task", must_not_run)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"out_dir: .*afile.* not a folder"):
        module.simulate_flow("tiny", "8xA800", 2, "greedy", out_dir=str(tmp_path / "afile" / "out"))


def test_simulate_flow_what_ifs_match_the_library(prefect_quiet, tmp_path: Path) -> None:
    from flows.simulate_flow import simulate_flow
    from libra_core.sim import SimSettings

    out = Path(
        simulate_flow(
            "tiny", "8xA800", 2, "+cmlfq", out_dir=str(tmp_path / "sim"),
            settings=["spill_factor=1"], spec=["prompts_per_iteration=6"],
        )
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    direct = simulate(
        "tiny", "8xA800", 2, ["+cmlfq"], settings=SimSettings(spill_factor=1.0),
        spec_overrides={"prompts_per_iteration": 6},
    )  # fmt: skip
    plain = simulate("tiny", "8xA800", 2, ["+cmlfq"])
    assert summary["results"][0]["makespan_s"] == direct.results[0].makespan_s != plain.results[0].makespan_s
    with pytest.raises(ValueError, match="spill_factor must be > 0"):
        simulate_flow("tiny", "8xA800", 2, "greedy", settings=["spill_factor=-1"])


def test_simulate_flow_replays_a_trace_with_its_what_ifs(
    prefect_quiet, tmp_path: Path, monkeypatch, caplog
) -> None:
    # A trace path as the scenario (what a user types in the UI): `spec` is the replay's TraceSpec.
    # Given with `~`: the check expanded it and the task did not ("does not exist", until 2026-12-06).
    monkeypatch.setenv("HOME", str(tmp_path))
    import random

    from flows.simulate_flow import simulate_flow
    from libra_core.traces.schema import write_trace
    from libra_core.traces.synthetic import SyntheticTraceConfig, synthetic_trace

    cfg = SyntheticTraceConfig(num_iterations=2, prompts_per_iteration=4, group_size=4, prompt_pool=8)
    trace = write_trace(synthetic_trace(random.Random(0), cfg), tmp_path / "synth.parquet")
    out = Path(
        simulate_flow(
            "~/synth.parquet", "8xA800", 2, "greedy", out_dir=str(tmp_path / "sim"), spec=["latency_scale=2"]
        )
    )
    summary = json.loads((out / "summary.json").read_text())
    direct = simulate(trace, "8xA800", 2, ["greedy"], spec_overrides={"latency_scale": 2.0})
    plain = simulate(trace, "8xA800", 2, ["greedy"])
    assert summary["results"][0]["makespan_s"] == direct.results[0].makespan_s > plain.results[0].makespan_s
    assert (
        summary["workload"].startswith("trace replay of synth: 32 trajectories")
        and "x2" in summary["workload"]
    )
    with pytest.raises(ValueError, match="spec 'group_size=4'.*latency_scale"):
        simulate_flow(str(trace), "8xA800", 2, "greedy", spec=["group_size=4"])
    # A seed draws nothing in a replay: the flow says so in its log, as `libra simulate --seed` does.
    run_log = logging.getLogger("prefect.flow_runs")  # Prefect's run loggers do not propagate
    run_log.addHandler(caplog.handler)
    try:
        simulate_flow(str(trace), "8xA800", 2, "greedy", seed=5, out_dir=str(tmp_path / "seeded"))
    finally:
        run_log.removeHandler(caplog.handler)
    assert "seed 5 has no effect on a trace replay" in caplog.text
    seeded = json.loads((tmp_path / "seeded" / "summary.json").read_text())
    assert seeded["results"][0]["makespan_s"] == plain.results[0].makespan_s


def test_simulate_flow_takes_your_own_model_and_gpu(prefect_quiet, tmp_path: Path) -> None:
    # The UI's `model` and `hardware` parameters take spec files, as `libra simulate` does.
    from flows.simulate_flow import simulate_flow

    specs = Path(__file__).resolve().parents[2] / "examples" / "specs"
    model, hardware = str(specs / "llama-3.1-70b" / "config.json"), f"32x{specs / 'h800.yaml'}"
    out = Path(
        simulate_flow("tiny", hardware, 2, "static-optimal", out_dir=str(tmp_path / "sim"), model=model)
    )
    summary = json.loads((out / "summary.json").read_text())
    direct = simulate("tiny", hardware, 2, ["static-optimal"], model=model)
    assert summary["model"] == "llama-3.1-70b-instruct" and summary["hardware"] == "32xh800"
    assert summary["results"][0]["makespan_s"] == direct.results[0].makespan_s
    assert (
        direct.results[0].makespan_s
        != simulate("tiny", "32xH100", 2, ["static-optimal"], model=model).results[0].makespan_s
    )
    with pytest.raises(ValueError, match="neither a built-in model name nor an existing file"):
        simulate_flow("tiny", hardware, 2, "greedy", model="nope/config.json")
