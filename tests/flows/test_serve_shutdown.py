"""`libra serve` stopped by SIGTERM (a service manager, `docker stop`) while an experiment runs: the
run ends its own way first. Prefect's runner exited at once and its teardown killed the flow-run
process, so the run's folder said `running` and its Prefect run stayed RUNNING for good (until
2026-12-07)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support import TEST_OVERRIDES, start_serve

pytestmark = pytest.mark.slow


def _wait(what: str, ready, timeout_s: float, log: Path):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"{what} not within {timeout_s} s; serve log:\n{log.read_text()[-4000:]}")


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_stopping_serve_lets_the_run_in_progress_end_cancelled(tmp_path: Path, how: str) -> None:
    from flows.prefect_server import free_port

    out = tmp_path / "runs"
    out.mkdir()
    home = tmp_path / "prefect-home"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_MEMO_STORE_PATH": str(home / "memo.toml"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    overrides = [*TEST_OVERRIDES, f"experiment.output_dir={out}", "schedule.active=false"]
    log = tmp_path / "serve.log"
    proc = start_serve(["--port", str(port)], overrides, log, env)
    try:

        def deployment() -> dict | None:
            try:
                resp = httpx.get(f"{api}/deployments/name/rl-experiment/experiment", timeout=5)
            except httpx.HTTPError:
                return None
            return resp.json() if resp.status_code == 200 else None

        dep = _wait("the experiment deployment", deployment, 180, log)

        def created() -> bool:  # a server still busy starting answers 503 (seen once in CI)
            resp = httpx.post(
                f"{api}/deployments/{dep['id']}/create_flow_run",
                json={"parameters": dep["parameters"]},
                timeout=30,
            )
            if resp.status_code == 503:
                return False
            resp.raise_for_status()
            return True

        _wait("a flow run of the deployment", created, 120, log)

        def run_folder() -> Path | None:  # the run has started: its SFT warm-up is under way
            started = [p.parent for p in out.glob("*/state.json")]
            return started[0] if started else None

        run_dir = _wait("the run's folder", run_folder, 180, log)
        time.sleep(2)
        if how == "sigterm":  # a service manager signals the main process only
            proc.send_signal(signal.SIGTERM)
        else:  # a terminal's Ctrl-C signals the whole foreground group, the flow-run process too
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
        state = json.loads((run_dir / "state.json").read_text())
        assert state["status"] == "cancelled", log.read_text()[-4000:]
        assert "stopping: 1 flow run(s) in progress end their runs" in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
