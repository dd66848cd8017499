"""A worker process that checks math answers under a hard wall-clock deadline.

`answer_check.math_equivalent` runs sympy on model text. Its lexical screen (`refusal`) turns away
the answer shapes known to build huge numbers, but it is a heuristic: a shape it misses could keep
the reward stage busy for minutes, and neither a signal nor a thread can stop sympy's big-integer C
code. So the math environment sends each check to a separate Python process (this module run with
`-m`), reading JSON lines from its stdin and writing one verdict line per request. A check that
takes longer than the deadline kills the process; the answer counts as well formed but wrong (as a
refused one does) and the next check starts a fresh process (about 0.6 s). The process also runs
under an address-space limit, so an answer that would exhaust memory ends the worker, not the host.

Called from the reward stage and the greedy evaluations, possibly from worker threads: one process
per (Python process, deadline), shared by every environment, its requests serialised by a lock
(the checks are CPU-bound under the GIL anyway). It exits when its stdin closes, so it never
outlives the process that started it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import resource
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0  # importing sympy and math-verify takes about 0.6 s here
MEMORY_LIMIT_BYTES = 2 * 1024**3  # the worker's address space (about 63 MB after imports)
_READY = "ready"


class AnswerCheckTimeout(Exception):
    """The worker did not answer within the deadline (it has been stopped)."""


class AnswerCheckWorker:
    """One worker process and the pipes to it; restarted after a timeout or a crash."""

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"answer check timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.restarts = 0  # workers stopped for a timeout or found dead (for tests and logs)
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def math_equivalent(self, reference: str, answer: str) -> bool | None:
        """`answer_check.math_equivalent(reference, answer)`, or False when it did not finish within
        `timeout_s` or the worker died while checking (the answer could not be read as equal)."""
        request = json.dumps({"reference": reference, "answer": answer}).encode() + b"\n"
        with self._lock:
            self._ensure_started()
            try:
                self._send(request)
                reply = json.loads(self._read_line(time.monotonic() + self.timeout_s))
            except (AnswerCheckTimeout, BrokenPipeError, EOFError) as exc:
                self._stop()
                self.restarts += 1
                logger.warning(
                    "math answer %r not checked (%s); counted as wrong, worker restarted", answer[:80], exc
                )
                return False
        if "error" in reply:
            raise RuntimeError(f"math answer check failed for answer {answer[:80]!r}: {reply['error']}")
        verdict = reply["verdict"]
        assert verdict is None or isinstance(verdict, bool), f"bad worker reply {reply!r}"
        return verdict

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- the process -------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "libra_core.envs.answer_worker"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buffer = b""
        try:
            line = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        except (AnswerCheckTimeout, EOFError) as exc:
            self._stop()
            raise RuntimeError(
                f"the math answer-check worker did not start ({exc}); run "
                f"`{sys.executable} -m libra_core.envs.answer_worker` to see why"
            ) from exc
        assert line == _READY.encode(), f"unexpected first line from the answer-check worker: {line!r}"

    def _send(self, data: bytes) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def _read_line(self, deadline: float) -> bytes:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise AnswerCheckTimeout(f"no answer within {self.timeout_s:g} s")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError(f"worker exited with code {self._process.wait()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


_WORKERS: dict[float, AnswerCheckWorker] = {}
_WORKERS_LOCK = threading.Lock()


def shared_worker(timeout_s: float) -> AnswerCheckWorker:
    """The process-wide worker for this deadline, started on first use, stopped at exit."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(timeout_s)
        if worker is None:
            worker = _WORKERS[timeout_s] = AnswerCheckWorker(timeout_s)
            atexit.register(worker.close)
        return worker


# -- the worker side --------------------------------------------------------------------------------
def _serve() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    from libra_core.envs.answer_check import math_equivalent

    out = sys.stdout
    out.write(_READY + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            reply = {"verdict": math_equivalent(request["reference"], request["answer"])}
        except MemoryError:
            os._exit(3)  # the parent sees the pipe close: the answer counts as wrong, a new worker starts
        except Exception as exc:  # a fault boundary: the parent raises it with the answer named
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
