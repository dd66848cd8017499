"""Shared test settings and helpers (importable from tests as `tests.support`)."""

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A small but learnable setup: short SFT so tests start from a policy that sometimes succeeds.
TEST_OVERRIDES = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.head_dim=32",
    "model.intermediate_size=128",
    "training.warmup.steps=150",
    "training.warmup.batch_size=32",
    "training.warmup.lr=0.003",
    "environment.max_ops=3",
    "environment.warmup_early_answer_rate=0",  # full demonstrations: tests need successes early
    "rollout.prompts_per_iteration=4",
    "training.grpo.group_size=4",
    "eval.num_prompts=8",
    "eval.every=2",
]


@contextmanager
def fake_prefect_api() -> Iterator[str]:
    """An `/api` URL whose `/health` answers 200, as a running Prefect server's does (and nothing
    else: what a test needs to get past `api_healthy`)."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: object) -> None:
            pass

    with serving(Health) as url:
        yield f"{url}/api"


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`http://127.0.0.1:PORT` of a threaded server running `handler` until the block ends."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


# Engine flags for tests about an engine's lifecycle (starts, kills, replacements), not its speed:
# an eager engine starts in about half the time on this CPU (no torch.compile warm-up; 24.6 s vs
# 51.6 s in docs/results.md's "Rollout throughput") and generates about half as fast.
EAGER_ENGINE = {"extra_args": ("--enforce-eager",)}


def start_serve(
    args: Sequence[str], overrides: Sequence[str], log: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """`libra serve ARGS --set OVERRIDE...` started from the repository root in its own session
    (so a test can signal its whole process group), its output (stdout and stderr) into `log`."""
    sets = [x for override in overrides for x in ("--set", override)]
    with log.open("w") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", *args, *sets],
            cwd=ROOT,
            env=dict(env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_serve(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM a `start_serve` process group; SIGKILL it if it has not exited within `timeout_s`.
    For tests whose subject is not the shutdown (tests/flows/test_serve_shutdown.py's is): a serve
    left running after a slow shutdown (CI once saw one outlast 60 s while the session's SQLite API
    answered "database is locked") kept polling the shared deployment, and the next test took its
    poll for its own serve's and read the runs before that serve had checked them."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
