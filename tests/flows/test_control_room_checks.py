"""What a run started from the Prefect UI is checked for, and the per-iteration stage table it publishes."""

from __future__ import annotations

from typing import Any

import pytest

import tasks.artifacts as artifacts
from libra_core.data.history import STAGES
from tests.support import fake_prefect_api


def _row(eval_s: float | None) -> dict[str, Any]:
    return {
        "iteration": 2,
        "iteration_s": 4.0,
        **{f"{s}_s": 0.5 for s in STAGES},
        "eval_s": eval_s,
        "reward_mean": 0.3,
        "accuracy": 0.2,
        "tokens_generated": 100,
        "rollout_tokens_per_s": 50.0,
        "policy_version": 2,
        "routing_moves": 0,
        "routing_migrations": 0,
        "migrated_tokens": 0,
        "rollout_instances": 1,
        "routing_class_accuracy": None,
        "migration_token_ratio": 0.125,
    }


@pytest.mark.parametrize(
    ("eval_s", "eval_rows"), [(None, []), (1.0, [{"stage": "eval", "seconds": 1.0, "share": "25%"}])]
)
def test_the_stage_table_shows_eval_only_when_it_ran(monkeypatch, eval_s, eval_rows) -> None:
    # An iteration without an evaluation used to show "eval 0.0 s, 0%", as if it had run for nothing.
    tables: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(artifacts, "read_history", lambda run_dir: [_row(eval_s)])
    monkeypatch.setattr(artifacts, "read_timeline", lambda run_dir, damaged=None: [])
    monkeypatch.setattr(artifacts, "planner_rows", lambda run_dir: [])
    monkeypatch.setattr(artifacts, "create_table_artifact", lambda table, **kw: tables.append(table))
    markdowns: list[str] = []
    monkeypatch.setattr(artifacts, "create_markdown_artifact", lambda **kw: markdowns.append(kw["markdown"]))
    artifacts._iteration_artifacts("unused", 2)
    assert "(0 tokens re-prefilled, migration token ratio 0.125)" in markdowns[0]
    (table,) = tables
    assert [r for r in table if r["stage"] == "eval"] == eval_rows
    assert [r["stage"] for r in table] == [*STAGES, *(["eval"] if eval_rows else []), "iteration"]


def test_a_run_started_from_the_ui_checks_the_planners_specs_before_making_its_folder(tmp_path) -> None:
    # The deployment's path: `libra run` checked these, the flow's first task did not, so a wrong
    # spec failed only at the first plan stage, after the warm-up.
    from tasks.setup import create_run_task

    overrides = [
        f"experiment.output_dir={tmp_path / 'runs'}",
        "planner.type=libra",
        f"planner.model_spec={tmp_path / 'nope' / 'config.json'}",
    ]
    with pytest.raises(
        ValueError, match=r"planner.model_spec: .*neither a built-in model name nor an existing file"
    ):
        create_run_task.fn(None, overrides, None)
    assert not (tmp_path / "runs").exists()


def test_a_run_started_from_the_ui_checks_this_machine_before_making_its_folder(tmp_path) -> None:
    # A served deployment's run with a missing data file made its folder and failed in prepare-policy.
    from tasks.setup import create_run_task

    overrides = [
        f"experiment.output_dir={tmp_path / 'runs'}",
        "environment={type: code, files: [code/x.jsonl]}",
    ]
    with pytest.raises(ValueError, match=r"dataset file 'code/x.jsonl' not found under data_dir"):
        create_run_task.fn(None, overrides, None)
    assert not (tmp_path / "runs").exists()


def test_a_resume_from_the_ui_checks_its_overrides_before_changing_the_folder(tmp_path) -> None:
    # Only `libra run --resume` checked them: from the UI a wrong hardware name was written into the
    # run's config.resolved.yaml, and every later resume of that run was refused.
    from libra_core.pipeline.run_dir import RunState, write_state
    from tasks.setup import create_run_task, release_run

    start = create_run_task.fn(None, [f"experiment.output_dir={tmp_path}"], None)
    release_run.fn(start.run_dir)
    write_state(start.run_dir, RunState(0, 0, "failed"))
    resolved = tmp_path / start.run_dir / "config.resolved.yaml"
    before = resolved.read_bytes()
    bad = ["planner.type=libra", "planner.hardware=8xBOGUS"]
    with pytest.raises(ValueError, match=r"planner.hardware: .*BOGUS"):
        create_run_task.fn(None, bad, start.run_dir)
    assert resolved.read_bytes() == before
    resumed = create_run_task.fn(None, [], start.run_dir)  # the folder is unlocked and resumes
    release_run.fn(start.run_dir)
    assert resumed.resumed and resumed.start_iteration == 1


def test_serve_refuses_a_cron_prefect_cannot_schedule_with_exit_2(tmp_path) -> None:
    # `5L` (last Friday) passed the config's cron check but not Prefect's: it escaped as a traceback
    # with exit 1 once the server was up, then (2026-12-06) exited 2 only after the server check.
    # Now the config refuses it with Prefect's spelling, before any server is contacted.
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "serve", "--api-url", "http://127.0.0.1:9/api"]
        + ["--set", "schedule.cron=0 2 * * 5L", "--set", f"experiment.output_dir={tmp_path / 'runs'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "schedule.cron: '0 2 * * 5L'" in done.stderr and "'L5' for the last Friday" in done.stderr
    assert "no Prefect server" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_serve_turns_prefects_refusal_of_a_schedule_into_exit_2(
    tmp_path, monkeypatch, signal_handlers
) -> None:
    # The config now refuses what Prefect 3.7 refuses (tests/config/test_cron_parity.py); a later
    # Prefect may refuse more, and that still ends as a config error, not a traceback.
    import flows.serve
    from flows.cli import main

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError('Invalid cron string: "0 2 * * 1"')

    monkeypatch.setattr(flows.serve, "build_deployments", refuse)
    # serve exports the server's URL for Prefect: restored afterwards (the fake server is gone then)
    monkeypatch.setenv("PREFECT_API_URL", "")
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with fake_prefect_api() as api_url:
        code = main(
            ["serve", "--api-url", api_url, "--set", "schedule.cron=0 2 * * 1"]
            + ["--set", f"experiment.output_dir={tmp_path / 'runs'}"]
        )
    assert code == 2


def test_serve_names_prefect_api_url_when_the_server_it_names_does_not_answer(
    tmp_path, monkeypatch, capsys, signal_handlers
) -> None:
    # A stale PREFECT_API_URL exported in the shell was reported only as "no Prefect server answers
    # at <url>", with nothing saying where the URL came from (or how to serve without it).
    from flows.cli import main

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    code = main(["serve", "--set", f"experiment.output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code != 0
    assert "no Prefect server answers at http://127.0.0.1:9/api" in err
    assert "PREFECT_API_URL" in err and "unset it" in err
