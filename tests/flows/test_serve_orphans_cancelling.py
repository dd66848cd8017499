"""A run cancelled from the UI (CANCELLING) whose `libra serve` was killed before the runner ended
it stayed CANCELLING for good, its folder `running` (until 2026-12-07): the runner only cancels
runs whose process it started itself. The next `libra serve` marks it Cancelled when it starts, its
unfinished subflow runs too, and its folder `cancelled`; one whose flow-run process still lives, or
whose folder another process holds, is left alone. A real server (the tests' ephemeral one) and a
real `libra serve` process, as in test_serve_orphans.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.flows.test_serve_orphans import _running_run, _serve_until_polled, alive_and_held
from tests.support import stop_serve


def _cancelling_run(client: Any, deployment_id: Any, **parameters: Any) -> Any:
    """A RUNNING flow run of the deployment that the user cancelled, as a serve that is gone left it
    (RUNNING first: the server turns a SCHEDULED run asked to cancel Cancelled straight away)."""
    from prefect.states import Cancelling, Running

    run = _running_run(client, deployment_id, Running(), **parameters)
    client.set_flow_run_state(run.id, Cancelling(), force=True)
    run = client.read_flow_run(run.id)
    assert run.state is not None and run.state.is_cancelling(), run.state
    return run


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
    # `alive`'s flow-run process, still stopping; `held`'s folder in use by another process.
    with alive_and_held(alive.id, held_dir):
        serve, log = _serve_until_polled(api_url, experiment, tmp_path)
        try:
            with get_client(sync_client=True) as client:
                runs = (cancelling, iteration, sim, alive, held)
                states = {r.id: client.read_flow_run(r.id).state for r in runs}
        finally:
            stop_serve(serve)
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
