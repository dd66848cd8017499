"""Sandboxed execution of untrusted Python written by the policy (the Python and code tools).

Each call runs in its own short-lived process tree, started from a fresh temporary folder that is
removed afterwards. Called from tool implementations (`PythonTool`, the code environment's test
runner), possibly from several agent-loop threads at once; a `Sandbox` holds no per-run state.

Two isolation levels (`SandboxConfig.isolation`; "auto" picks the strongest that works here):
- "namespaces" (root + util-linux `unshare`): new network, mount, pid, ipc and uts namespaces; the
  project, data, home and temp folders hidden behind empty tmpfs mounts; a per-run unprivileged uid;
  the working folder a tmpfs of `max_workdir_mib` (total disk use) holding at most
  `max_workdir_files` files; CPU-time, address-space, file-size, open-file and process-count
  limits; the whole process tree is killed when the code's main process ends or the wall-clock
  limit passes.
- "rlimits": the same resource limits plus a Python audit hook (no sockets, subprocesses, ctypes or
  files outside the working folder). Stops accidents, not a determined attacker.
The inside half is `sandbox_launcher.py`; docs/environments.md lists what each level guarantees.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from libra_core.config.environments import SandboxConfig
from libra_core.envs.base import ToolStatus

logger = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
EXIT_SETUP_FAILED = 121  # mirrors sandbox_launcher.EXIT_SETUP_FAILED
UNSHARE_ARGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
# Always hidden in namespace mode (when they exist), besides the project folder and its parent.
HIDDEN_DIRS = (
    "/root",
    "/home",
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/mnt",
    "/media",
    "/opt",
    "/srv",
    "/run",
    "/work",
)
_FIRST_UID = 200_000  # per-run uids are drawn above the range real accounts use
_UID_SPAN = 100_000

# One sequence per process, not per `Sandbox`: two sandboxes (the code environment built for rollout
# and for evaluation, math_tools beside code) must not hand concurrent runs the same uid, whose
# RLIMIT_NPROC budget they would then share.
_UIDS = itertools.count()
_UIDS_LOCK = threading.Lock()

Isolation = Literal["namespaces", "rlimits"]
StopReason = Literal["exit", "cpu_limit", "wall_limit", "output_limit", "signal", "setup_failed"]


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sandboxed run.

    `status`: "success" (exit code 0), "timeout" (CPU or wall limit), "failure" (anything else).
    `stdout`/`stderr` hold at most `max_output_bytes` each (decoded, invalid bytes replaced);
    `reason` says why the run ended; `exit_code` is None when it was killed by a signal.
    """

    status: ToolStatus
    reason: StopReason
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: Isolation


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether this process may create the namespaces "namespaces" isolation needs (root + unshare)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return False
    try:
        probe = subprocess.run([unshare, *UNSHARE_ARGS, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def next_uid() -> int:
    """A per-run uid for namespace mode, distinct from every other run of this process until
    `_UID_SPAN` runs later (offset by the pid, so concurrent processes rarely meet)."""
    with _UIDS_LOCK:
        n = next(_UIDS)
    return _FIRST_UID + (os.getpid() * 7919 + n) % _UID_SPAN


def _project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def hidden_dirs() -> list[str]:
    """Folders hidden from the code in namespace mode: fixed system ones plus the project's."""
    root = _project_root()
    extra = [str(p) for p in (root, root.parent) if p != Path("/")]
    return list(dict.fromkeys([*HIDDEN_DIRS, *extra]))


class Sandbox:
    """Runs Python source in isolation. Thread-safe; each `run_python` call is independent."""

    def __init__(self, cfg: SandboxConfig | None = None) -> None:
        self.cfg = cfg or SandboxConfig()
        self.isolation: Isolation = self._resolve_isolation()
        # The base interpreter (outside any virtualenv): the venv is hidden in namespace mode and
        # untrusted code gets the standard library only.
        self.python = os.path.realpath(sys.executable)
        self.python_prefix = os.path.realpath(sys.base_prefix)

    def _resolve_isolation(self) -> Isolation:
        wanted = self.cfg.isolation
        if wanted == "rlimits":
            return "rlimits"
        if namespaces_available():
            return "namespaces"
        if wanted == "namespaces":
            raise RuntimeError(
                "sandbox.isolation is 'namespaces' but namespaces cannot be created here (needs root "
                "and util-linux unshare); set sandbox.isolation to 'auto' or 'rlimits'"
            )
        logger.warning("sandbox: namespaces unavailable, falling back to rlimits + audit hook isolation")
        return "rlimits"

    def _next_uid(self) -> int:
        return next_uid()

    def run_python(self, source: str, *, files: dict[str, str] | None = None) -> ExecutionResult:
        """Run `source` as `main.py` in a fresh folder (with `files` beside it) under the limits."""
        base = Path(tempfile.mkdtemp(prefix="libra-sbx-", dir=self.cfg.workdir_root))
        try:
            return self._run(base, source, files or {})
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def _run(self, base: Path, source: str, files: dict[str, str]) -> ExecutionResult:
        workdir = base / "work"
        workdir.mkdir()
        for name, text in {**files, "main.py": source}.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"sandbox file name {name!r} must be a plain name")
            (workdir / name).write_text(text, encoding="utf-8")
        uid = self._next_uid() if self.isolation == "namespaces" else None
        if uid is not None:
            os.chown(workdir, uid, uid)
            base.chmod(0o711)
        # The launcher reports how the run ended on this pipe, which the code never holds (see
        # sandbox_launcher._report): the exit status alone cannot tell the code's sys.exit(137)
        # from a SIGKILL, or its sys.exit(121) from a failed setup.
        status_read, status_write = os.pipe()
        # The lifeline: the launcher holds its read end and exits when it reads end-of-file, which
        # comes when this process dies, however it dies (the run's own session is out of reach of
        # our signals; until 2026-12-06 a host killed with SIGKILL left a sleeping run behind).
        life_read, life_write = os.pipe()
        spec = {
            "isolation": self.isolation,
            "workdir": str(workdir),
            "python": self.python,
            "python_prefix": self.python_prefix,
            "hide": hidden_dirs(),
            "drop_to_uid": uid,
            "cpu_s": self.cfg.cpu_time_s,
            "memory_bytes": self.cfg.memory_mib * 2**20,
            "output_bytes": self.cfg.max_output_bytes,
            "workdir_bytes": self.cfg.max_workdir_mib * 2**20,
            "workdir_files": self.cfg.max_workdir_files,
            "max_processes": self.cfg.max_processes,
            "status_fd": status_write,
            "lifeline_fd": life_read,
        }
        launcher = [self.python, "-I", "-S", "-B", str(LAUNCHER), json.dumps(spec)]
        argv = (
            [shutil.which("unshare") or "unshare", *UNSHARE_ARGS, *launcher] if uid is not None else launcher
        )
        out_path, err_path = base / "stdout", base / "stderr"
        start = time.perf_counter()
        try:
            with out_path.open("wb") as out, err_path.open("wb") as err:
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        cwd=base,
                        start_new_session=True,
                        pass_fds=(status_write, life_read),
                    )
                finally:
                    os.close(status_write)
                    os.close(life_read)
                wall_exceeded = False
                try:
                    proc.wait(timeout=self.cfg.wall_time_s)
                except subprocess.TimeoutExpired:
                    wall_exceeded = True
                    _kill_group(proc)
                except BaseException:
                    # Ctrl-C, or SIGTERM as `libra run` raises it: the run is in its own session,
                    # which no signal of ours reaches, so it outlived this process (until
                    # 2026-12-06) with only its CPU limit, which a sleeping program never meets.
                    _kill_group(proc)
                    raise
            report = _read_report(status_read)
        finally:
            os.close(status_read)
            os.close(life_write)
        wall_s = time.perf_counter() - start
        stdout, stderr = self._read(out_path), self._read(err_path)
        status, reason, code = _classify(proc.returncode, wall_exceeded, self.isolation, report)
        if reason == "setup_failed":
            logger.error("sandbox setup failed (isolation %s): %s", self.isolation, stderr.strip()[-500:])
        return ExecutionResult(status, reason, code, stdout, stderr, wall_s, self.isolation)

    def _read(self, path: Path) -> str:
        with path.open("rb") as f:
            data = f.read(self.cfg.max_output_bytes)
        return data.decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The session holds unshare (or the launcher); killing unshare also kills its pid namespace.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_report(fd: int) -> dict[str, object] | None:
    """The launcher's report, or None if it wrote none (killed at the wall limit, or it never ran).
    Non-blocking: the run is over, so whatever was written is in the pipe."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            data += chunk
    try:
        report = json.loads(data.splitlines()[0]) if data.strip() else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _classify(
    returncode: int, wall_exceeded: bool, isolation: Isolation, report: dict[str, object] | None = None
) -> tuple[ToolStatus, StopReason, int | None]:
    """Status, reason and exit code of a run. `report` (the launcher's, see `_read_report`) is
    believed over the exit status, which the code itself chooses; without one (the launcher never
    got to write it) the exit status is read as the launcher sets it."""
    if wall_exceeded:
        return "timeout", "wall_limit", None
    report = report or {}
    killed_by, exited_with = report.get("signal"), report.get("exit")
    if report.get("setup_failed") is True:
        return "failure", "setup_failed", EXIT_SETUP_FAILED
    if isinstance(killed_by, int):
        return _by_signal(killed_by)
    if isinstance(exited_with, int):
        return _by_exit_code(exited_with)
    if report.get("started") is True:  # rlimits: the code ran in the launcher's own process
        return _by_signal(-returncode) if returncode < 0 else _by_exit_code(returncode)
    if returncode == EXIT_SETUP_FAILED:
        return "failure", "setup_failed", returncode
    # Namespace mode reports a killed process as 128 + signal (pid 1 cannot re-raise it).
    sig = (
        -returncode
        if returncode < 0
        else returncode - 128
        if isolation == "namespaces" and returncode > 128
        else 0
    )
    return _by_signal(sig) if sig > 0 else _by_exit_code(returncode)


def _by_exit_code(code: int) -> tuple[ToolStatus, StopReason, int | None]:
    return ("success", "exit", 0) if code == 0 else ("failure", "exit", code)


def _by_signal(sig: int) -> tuple[ToolStatus, StopReason, int | None]:
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", "cpu_limit", None
    if sig == signal.SIGXFSZ:
        return "failure", "output_limit", None
    return "failure", "signal", None
