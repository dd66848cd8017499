"""`libra serve` killed outright (SIGKILL, a machine crash) left its flow runs RUNNING in the
server for good, and their run folders `running` (until 2026-12-07). The next `libra serve` marks
them Crashed when it starts, and their folders `failed`; a run whose process still lives, and runs
of other deployments, are left alone. A real server (the tests' ephemeral one) and a real `libra
serve` process, which finds the runs as a killed serve would have left them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import ROOT, TEST_OVERRIDES, start_serve, stop_serve

_HOLD_LOCK = (
    "import sys, time\nfrom libra_core.pipeline.run_lock import lock_run\n"
    "lock_run(sys.argv[1]); print('locked', flush=True); time.sleep(120)"
)


def _running_run(client: Any, deployment_id: Any, state: Any, **parameters: Any) -> Any:
    """A flow run of the deployment moved to `state`, as a serve that is gone left it."""
    run = client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
    client.set_flow_run_state(run.id, state, force=True)
    return client.read_flow_run(run.id)


@contextmanager
def alive_and_held(alive_id: Any, held_dir: Path) -> Iterator[None]:
    """For the block: a flow-run process of run `alive_id` as the runner starts one (`python -m
    prefect.engine`, the run's id in its environment), outliving the serve that started it, and
    `held_dir`'s lock held by another process (a `libra run --resume` of it started since)."""
    live = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "prefect.engine"],
        env={**os.environ, "PREFECT__FLOW_RUN_ID": str(alive_id)},
    )
    locker = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(held_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        yield
    finally:
        live.kill()
        locker.kill()


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
    serve = start_serve(["--api-url", api_url], overrides, log, env)
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        while client.read_deployment(deployment_id).last_polled == polled:
            if serve.poll() is not None or time.monotonic() > deadline:
                stop_serve(serve)
                raise AssertionError(log.read_text()[-4000:])
            time.sleep(0.5)
    return serve, log


def test_serve_marks_runs_left_by_a_killed_serve_crashed(prefect_quiet, test_config, tmp_path: Path) -> None:
    from prefect import get_client, task
    from prefect.client.schemas.objects import StateType
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.states import Completed, Pending, Running

    from flows.rl_experiment import rl_experiment
    from flows.rl_iteration import rl_iteration
    from flows.serve import build_deployments
    from flows.serve_orphans import ORPHAN_MESSAGE
    from libra_core.config import load_config
    from libra_core.pipeline.run_dir import RunState, new_run_dir, read_state, write_state
    from tasks.setup import create_run_task

    # The deployments as an earlier `libra serve` registered them, and one more of the same flow.
    for deployment in build_deployments(None, [], test_config):
        deployment.apply()
    rl_experiment.to_deployment(name="other").apply()
    new_dir, resumed_dir, held_dir = (tmp_path / "runs" / name for name in ("new", "resumed", "held"))
    for folder in (new_dir, resumed_dir, held_dir):
        folder.mkdir(parents=True)
        write_state(folder, RunState(3, 3, "running"))

    @task
    def iteration_call() -> None: ...

    with get_client(sync_client=True) as client:
        experiment = client.read_deployment_by_name("rl-experiment/experiment").id
        simulate = client.read_deployment_by_name("simulate/simulate").id
        other = client.read_deployment_by_name("rl-experiment/other").id
        # A new run killed in its fourth iteration: its folder is in the iteration's parameters.
        new = _running_run(client, experiment, Running())
        call = client.create_task_run(iteration_call, flow_run_id=new.id, dynamic_key="4")
        iteration = client.create_flow_run(
            rl_iteration,
            parameters={"run_dir": str(new_dir), "iteration": 4, "version": 3},
            parent_task_run_id=call.id,
            state=Running(),
        )
        # A new run killed in its warm-up: its folder is named by when its create-run task ran.
        out = tmp_path / "out"
        warming = _running_run(client, experiment, Running(), overrides=[f"experiment.output_dir={out}"])
        made = client.create_task_run(  # named as Prefect's task engine names it
            create_run_task, flow_run_id=warming.id, dynamic_key="0", name="create-run-0", state=Running()
        )
        warming_dir = new_run_dir(load_config(None, [f"experiment.output_dir={out}"]))
        write_state(warming_dir, RunState(status="running"))
        client.set_task_run_state(made.id, Completed(), force=True)
        # A resume never started (PENDING): its folder, relative to base_dir, is its parameter.
        resumed = _running_run(client, experiment, Pending(), resume="runs/resumed", base_dir=str(tmp_path))
        sim = _running_run(client, simulate, Running())
        alive = _running_run(client, experiment, Running())
        elsewhere = _running_run(client, other, Running())
        held = _running_run(client, experiment, Running(), resume=str(held_dir))
    api_url = SubprocessASGIServer().api_url  # the server the client above started
    with alive_and_held(alive.id, held_dir):
        serve, log = _serve_until_polled(api_url, experiment, tmp_path)
        try:
            with get_client(sync_client=True) as client:
                runs = (new, iteration, warming, resumed, sim, alive, held, elsewhere)
                states = {r.id: client.read_flow_run(r.id).state for r in runs}
        finally:
            stop_serve(serve)
    output = log.read_text()
    for run in (new, iteration, warming, resumed, sim):
        state = states[run.id]
        assert state is not None and state.type is StateType.CRASHED, (run.name, state, output[-4000:])
        assert state.message == f"{ORPHAN_MESSAGE}."
    for run in (alive, held, elsewhere):  # a live process; a folder in use; another deployment
        state = states[run.id]
        assert state is not None and state.type is StateType.RUNNING, (run.name, state)
    assert read_state(new_dir) == RunState(3, 3, "failed")
    assert read_state(resumed_dir) == RunState(3, 3, "failed")
    assert read_state(warming_dir) == RunState(0, 0, "failed")
    assert read_state(held_dir) == RunState(3, 3, "running")
    marked = [line for line in output.splitlines() if "marked flow run" in line]
    for run in (new, warming, resumed, sim):  # one line each, a subflow run counted in its run's
        assert sum(f"({run.id}) of " in line for line in marked) == 1, output[-4000:]
    assert f"its run folder {new_dir} now says failed; 1 subflow run(s) too" in output
    assert f"its run folder {warming_dir} now says failed" in output
    assert not any(str(run.id) in output for run in (iteration, alive, held, elsewhere))
