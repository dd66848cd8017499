"""Serving the deployments until interrupted, and ending the flow runs in progress cleanly then.

Prefect's `serve()` replaces the SIGTERM handler with its runner's, which (Prefect 3.7) leaves its
stop coroutine unawaited and exits at once: the runner's teardown then killed the flow-run processes
outright, so a run in progress never ran its own cancel path (its `state.json` stayed `running`, its
Prefect run RUNNING for good; until 2026-12-07). Here the runner is built as `serve()` builds it,
and on SIGTERM each flow-run process gets SIGTERM (what a cancel from the UI sends; the experiment
flow then records `cancelled` and stops its engines) and is waited for, up to
`SHUTDOWN_GRACE_S`, before the runner is torn down. On Ctrl-C the terminal has sent SIGINT to the
flow-run processes as well (they share its process group), so they are only waited for. A second
Ctrl-C stops waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SHUTDOWN_GRACE_S = 90.0  # a run's cancel path stops its vLLM engines (up to 30 s each, in parallel)


def serve_until_interrupted(deployments: list[Any], limit: int) -> None:
    """Register `deployments` and execute their runs here; returns (KeyboardInterrupt) once a
    SIGTERM or Ctrl-C has ended the runs in progress, or the grace period has passed."""
    from prefect.runner import Runner

    class _Runner(Runner):
        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not re-enter
            end_flow_runs(self, signal.SIGTERM)
            raise KeyboardInterrupt

    runner = _Runner(pause_on_shutdown=True, limit=limit)
    for deployment in deployments:
        runner.add_deployment(deployment)

    def on_sigint(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops waiting
        end_flow_runs(runner, None)
        raise KeyboardInterrupt

    # Not the default handler, so asyncio.run leaves it in place (it would cancel the main task).
    signal.signal(signal.SIGINT, on_sigint)
    asyncio.run(runner.start())


def end_flow_runs(runner: Any, sig: signal.Signals | None, grace_s: float = SHUTDOWN_GRACE_S) -> list[int]:
    """Send `sig` (None: none) to each flow-run process of `runner` and wait until they have all
    exited or `grace_s` has passed; returns the pids still running then. Runs in a signal handler
    on the event loop's thread: the loop is blocked meanwhile, which the runs do not need."""
    pids = _flow_run_pids(runner)
    if not pids:
        return []
    print(
        f"stopping: {len(pids)} flow run(s) in progress end their runs (up to {grace_s:.0f} s; "
        "Ctrl-C again to stop waiting)",
        file=sys.stderr,
        flush=True,
    )
    if sig is not None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def _flow_run_pids(runner: Any) -> list[int]:
    """The pids of the runner's flow-run processes (Prefect 3.7 keeps them in its process manager;
    earlier 3.x releases in `_flow_run_process_map`)."""
    manager = getattr(runner, "_process_manager", None)
    if manager is not None and hasattr(manager, "flow_run_ids"):
        handles = [manager.get(run_id) for run_id in manager.flow_run_ids()]
        return [int(h.pid) for h in handles if h is not None and h.pid]
    entries = list(getattr(runner, "_flow_run_process_map", {}).values())
    return [int(e["pid"]) for e in entries if e.get("pid")]


def _running(pid: int) -> bool:
    """Whether `pid` is running: not gone and not a zombie (this process, its parent, reaps it
    only once the loop runs again)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel, which counts a zombie as alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
