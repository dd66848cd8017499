"""A run cancelled from the UI (CANCELLING) whose `libra serve` was killed before the runner ended
it stayed CANCELLING for good, its folder `running` (until 2026-12-07): the runner only cancels
runs whose process it started itself. The next `libra serve` marks it Cancelled when it starts, its
unfinished subflow runs too, and its folder `cancelled`; one whose flow-run process still lives, or
whose folder another process holds, is left alone. A real server (the tests' ephemeral one) and a
real `libra serve` process, as in test_serve_orphans.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.flows.test_serve_orphans import _HOLD_LOCK, ROOT, _running_run
from tests.support import TEST_OVERRIDES


def _cancelling_run(client: Any, deployment_id: Any, **parameters: Any) -> Any:
    """A RUNNING flow run of the deployment that the user cancelled, as a serve that is gone left it
    (RUNNING first: the server turns a SCHEDULED run asked to cancel Cancelled straight away)."""
    from prefect.states import Cancelling, Running

    run = _running_run(client, deployment_id, Running(), **parameters)
    client.set_flow_run_state(run.id, Cancelling(), force=True)
    run = client.read_flow_run(run.id)
    assert run.state is not None and run.state.is_cancelling(), run.state
    return run


def _serve_until_polled(api_url: str, deployment_id: Any, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """Start `libra serve` against `api_url`; return once its runner has polled the deployment,
    which it does only after the start-up check (the caller stops the process)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        polled = client.read_deployment(deployment_id).last_polled
    home = tmp_path / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_MEMO_STORE_PATH": str(home / "memo.toml")}
    overrides = [*TEST_OVERRIDES, f"experiment.output_dir={tmp_path / 'out'}", "schedule.active=false"]
    log = tmp_path / "serve.log"
    with log.open("w") as fh:
        serve = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", "--api-url", api_url]
            + [x for o in overrides for x in ("--set", o)],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        while client.read_deployment(deployment_id).last_polled == polled:
            if serve.poll() is not None or time.monotonic() > deadline:
                if serve.poll() is None:
                    os.killpg(serve.pid, signal.SIGTERM)
                    serve.wait(timeout=60)
                raise AssertionError(log.read_text()[-4000:])
            time.sleep(0.5)
    return serve, log


def test_serve_marks_cancelling_runs_left_by_a_killed_serve_cancelled(
    prefect_quiet, test_config, tmp_path: Path
) -> None:
    from prefect import get_client, task
    from prefect.client.schemas.objects import StateType
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.states import Running

    from flows.rl_iteration import rl_iteration
    from flows.serve import build_deployments
    from flows.serve_orphans import CANCELLED_MESSAGE
    from libra_core.pipeline.run_dir import RunState, read_state, write_state

    for deployment in build_deployments(None, [], test_config):
        deployment.apply()
    cancel_dir, alive_dir, held_dir = (tmp_path / "runs" / name for name in ("cancel", "alive", "held"))
    for folder in (cancel_dir, alive_dir, held_dir):
        folder.mkdir(parents=True)
        write_state(folder, RunState(2, 2, "running"))

    @task
    def iteration_call() -> None: ...

    with get_client(sync_client=True) as client:
        experiment = client.read_deployment_by_name("rl-experiment/experiment").id
        simulate = client.read_deployment_by_name("simulate/simulate").id
        # Cancelled from the UI in its third iteration, the serve killed before the run ended.
        cancelling = _cancelling_run(client, experiment)
        call = client.create_task_run(iteration_call, flow_run_id=cancelling.id, dynamic_key="3")
        iteration = client.create_flow_run(
            rl_iteration,
            parameters={"run_dir": str(cancel_dir), "iteration": 3, "version": 2},
            parent_task_run_id=call.id,
            state=Running(),
        )
        sim = _cancelling_run(client, simulate)
        alive = _cancelling_run(client, experiment, resume=str(alive_dir))
        held = _cancelling_run(client, experiment, resume=str(held_dir))
    api_url = SubprocessASGIServer().api_url  # the server the client above started
    # `alive`'s flow-run process, still stopping, outliving the serve that started it.
    live = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "prefect.engine"],
        env={**os.environ, "PREFECT__FLOW_RUN_ID": str(alive.id)},
    )
    # `held`'s folder in use by another process (a `libra run --resume` of it started since).
    locker = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(held_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    serve = None
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        serve, log = _serve_until_polled(api_url, experiment, tmp_path)
        with get_client(sync_client=True) as client:
            runs = (cancelling, iteration, sim, alive, held)
            states = {r.id: client.read_flow_run(r.id).state for r in runs}
    finally:
        live.kill()
        locker.kill()
        if serve is not None and serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=60)
    output = log.read_text()
    for run in (cancelling, iteration, sim):
        state = states[run.id]
        assert state is not None and state.type is StateType.CANCELLED, (run.name, state, output[-4000:])
        assert state.message == f"{CANCELLED_MESSAGE}."
    for run in (alive, held):  # a live flow-run process; a folder in use
        state = states[run.id]
        assert state is not None and state.type is StateType.CANCELLING, (run.name, state)
    assert read_state(cancel_dir) == RunState(2, 2, "cancelled")
    assert read_state(alive_dir) == RunState(2, 2, "running")
    assert read_state(held_dir) == RunState(2, 2, "running")
    marked = [line for line in output.splitlines() if "marked flow run" in line]
    (line,) = [line for line in marked if f"({cancelling.id}) of " in line]
    assert " of rl-experiment/experiment Cancelled: cancel requested; " in line, line
    assert f"its run folder {cancel_dir} now says cancelled; 1 subflow run(s) too" in line, line
    assert sum(f"({sim.id}) of simulate/simulate Cancelled: " in line for line in marked) == 1, output[-4000:]
    # Other tests' runs left in the session's server may be counted as Crashed; these two are ours.
    assert re.search(r": \d+ marked Crashed, 2 cancelling marked Cancelled$", output, re.M), output[-4000:]
    assert not any(str(run.id) in output for run in (iteration, alive, held))
