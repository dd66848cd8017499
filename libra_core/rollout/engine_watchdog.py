"""The parent of one vLLM server process: runs the server's command and ends it when the process
that started it (the owner: the run's flow process) is gone.

Each engine runs in a session of its own (vllm_server.py), so that one signal to its process group
stops the API server and its engine core together, and so that a terminal's Ctrl-C or hang-up does
not hit the engines before the pool can stop them in order. The other side of that: nothing ends
them when the owner dies without its clean-up (SIGKILL, an out-of-memory kill, a signal it does
not handle), and until this watchdog only a resume of the same run folder reaped them (pid files,
engine_registry.py). PR_SET_PDEATHSIG would not do: it fires when the *thread* that started the
child exits, and the pool starts engines from Prefect's worker threads.

Started by `VllmServer.start` as

    python -m libra_core.rollout.engine_watchdog OWNER_PID OWNER_START -- COMMAND...

as the leader of the engine's new session and process group. The command runs as its child in that
group, so `killpg(<watchdog pid>)` still reaches every engine process, and the watchdog's pid is the
instance's pid for the pool (`alive()`, `stop()`, the pid files). What it does:
- the owner is gone (its pid no longer runs with the start time `OWNER_START`, /proc field 22, or
  this process was re-parented): SIGTERM to the group, SIGKILL to what is left after `GRACE_S`;
- SIGTERM, SIGINT or SIGHUP sent to the watchdog: passed on to the group (once), as a stop;
- the command exits (a crash, or a stop): SIGTERM to what is left of the group (vLLM's engine core
  when the API server died alone), and the watchdog exits as the command did (same code, or killed
  by the same signal), so the pool sees the instance gone at once; its stop waits for the rest of
  the group. After the owner's death nobody else will: the watchdog waits, SIGKILL after `GRACE_S`.
It logs a line to the engine's log when it acts on its own. Standard library only (and /proc),
so it adds well under a second to an engine's start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

from libra_core.rollout.engine_registry import group_members, process_start

log = logging.getLogger("libra.engine_watchdog")

POLL_S = 0.5  # how often the owner is checked
GRACE_S = 10.0  # SIGTERM -> SIGKILL


def _others() -> list[int]:
    """Live processes of this group other than the watchdog."""
    me = os.getpid()
    return [pid for pid in group_members(os.getpgrp()) if pid != me]


def _kill_others() -> None:
    for pid in _others():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run(owner: int, owner_start: int, command: list[str]) -> int:
    """Run `command` under watch; return its exit status as `Popen.returncode` gives it."""
    parent = os.getppid()
    stopping_since: float | None = None  # when the group was sent SIGTERM
    owner_gone = False

    def term_group() -> None:
        nonlocal stopping_since
        if stopping_since is None:  # set first: the group's SIGTERM reaches this process too
            stopping_since = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgrp(), signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A caught signal is reset to its default in the child, so the engine keeps vLLM's own.
        signal.signal(sig, lambda signum, frame: term_group())
    child = subprocess.Popen(command)
    if stopping_since is not None:  # a stop that came before the command existed
        child.terminate()
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if not owner_gone and (os.getppid() != parent or process_start(owner) != owner_start):
            owner_gone = True
            log.warning("the process that started this engine (pid %d) is gone; stopping the engine", owner)
            term_group()
        if stopping_since is not None and time.monotonic() - stopping_since > GRACE_S:
            log.warning("the engine did not exit %g s after SIGTERM; killing it", GRACE_S)
            _kill_others()
    if _others():  # what outlives the command: an engine core whose API server exited
        term_group()
        if owner_gone:  # nobody else will stop them
            deadline = time.monotonic() + GRACE_S
            while _others() and time.monotonic() < deadline:
                time.sleep(0.05)
            _kill_others()
        # Otherwise exit now, as the command did: the owner sees the instance gone at once (and
        # replaces it), and its stop() waits for the rest of the group, SIGKILL after its timeout.
    return code


def main(argv: list[str]) -> int:
    # Its lines go to the engine's log (stderr), among vLLM's.
    logging.basicConfig(format="libra engine watchdog (pid %(process)d): %(message)s", stream=sys.stderr)
    if len(argv) < 4 or argv[2] != "--":
        log.error("usage: python -m libra_core.rollout.engine_watchdog OWNER_PID OWNER_START -- COMMAND...")
        return 2
    code = run(int(argv[0]), int(argv[1]), argv[3:])
    if code < 0:  # ended by a signal: end the same way, so the pool sees what the engine saw
        with contextlib.suppress(OSError, ValueError):  # SIGKILL cannot be (and need not be) reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
