"""The sandbox on hostile programs: each ends with a clear status and leaves the host unaffected."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from libra_core.config.environments import SandboxConfig
from libra_core.envs.sandbox import Sandbox, namespaces_available

MODES = [
    pytest.param(
        "namespaces",
        marks=pytest.mark.skipif(not namespaces_available(), reason="needs root and util-linux unshare"),
    ),
    "rlimits",
]
LIMITS = {"cpu_time_s": 2, "wall_time_s": 5.0, "memory_mib": 256, "max_output_bytes": 4096}


@pytest.fixture(params=MODES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Sandbox:
    return Sandbox(SandboxConfig(isolation=request.param, workdir_root=str(tmp_path), **LIMITS))


def _sandbox_processes() -> list[str]:
    """Processes owned by the sandbox's per-run uids (namespace mode draws them from 200000+)."""
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if int(line.split()[0]) >= 200_000]


def test_clean_program_succeeds_and_its_folder_is_removed(sandbox: Sandbox, tmp_path: Path) -> None:
    result = sandbox.run_python("import os\nprint(6 * 7, os.environ['HOME'] == os.getcwd())")
    assert (result.status, result.reason, result.exit_code) == ("success", "exit", 0)
    assert result.stdout == "42 True\n"
    assert list(tmp_path.iterdir()) == []  # the temporary working folder is gone


def test_exception_is_a_failure_with_the_traceback(sandbox: Sandbox) -> None:
    result = sandbox.run_python("raise ValueError('boom')")
    assert (result.status, result.exit_code) == ("failure", 1)
    assert result.stderr.strip().endswith("ValueError: boom")


def test_infinite_loop_times_out(sandbox: Sandbox) -> None:
    result = sandbox.run_python("while True:\n    pass\n")
    assert result.status == "timeout"
    assert result.reason in ("cpu_limit", "wall_limit")
    assert result.wall_s < LIMITS["wall_time_s"] + 3


def test_sleeping_program_hits_the_wall_clock_limit(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import time\ntime.sleep(60)")
    assert (result.status, result.reason) == ("timeout", "wall_limit")


def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    bomb = "import os\nwhile True:\n    os.fork()\n"
    result = sandbox.run_python(bomb)
    assert result.status in ("failure", "timeout")
    if sandbox.isolation == "namespaces":
        assert "Resource temporarily unavailable" in result.stderr  # RLIMIT_NPROC stopped it
    else:
        assert "os.fork is not allowed" in result.stderr
    assert _sandbox_processes() == []  # nothing survives the run


def test_ten_gigabyte_allocation_fails_cleanly(sandbox: Sandbox) -> None:
    result = sandbox.run_python("block = bytearray(10 * 1024**3)\nprint('allocated')")
    assert result.status == "failure"
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_network_is_unreachable(sandbox: Sandbox) -> None:
    code = (
        "import socket\n"
        "for host in ('127.0.0.1', '1.1.1.1'):\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=1)\n"
        "        print('connected', host)\n"
        "    except OSError as exc:\n"
        "        print('refused', host, type(exc).__name__)\n"
        "socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
    )
    result = sandbox.run_python(code)
    assert result.status == "failure"
    assert "connected" not in result.stdout
    if sandbox.isolation == "namespaces":
        assert "Network is unreachable" in result.stderr  # no interface but a downed loopback
    else:
        assert "is not allowed" in result.stderr


def test_files_outside_the_working_folder_are_out_of_reach(sandbox: Sandbox) -> None:
    project_file = Path(__file__).resolve()
    result = sandbox.run_python(f"print(open({str(project_file)!r}).read()[:20])")
    assert result.status == "failure"
    assert result.stdout == ""
    assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr


def test_writes_outside_the_working_folder_fail(sandbox: Sandbox) -> None:
    target = "/etc/libra-sandbox-probe"
    result = sandbox.run_python(f"open({target!r}, 'w').write('x')")
    assert result.status == "failure"
    assert not os.path.exists(target)


@pytest.mark.parametrize(
    "change",
    [
        "os.remove(VICTIM)",
        "os.truncate(VICTIM, 0)",
        "os.chmod(VICTIM, 0o777)",
        "os.rename(VICTIM, VICTIM + '.moved')",
        "os.close(os.open(VICTIM, os.O_WRONLY | os.O_TRUNC))",  # os.open passes flags, not a mode
    ],
)
def test_no_file_outside_the_working_folder_changes(sandbox: Sandbox, tmp_path: Path, change: str) -> None:
    victim = tmp_path.parent / f"{tmp_path.name}-victim.txt"
    victim.write_text("keep")
    try:
        result = sandbox.run_python(f"import os\nVICTIM = {str(victim)!r}\n{change}\nprint('changed')")
        assert result.status == "failure" and "changed" not in result.stdout
        assert victim.read_text() == "keep" and oct(victim.stat().st_mode & 0o777) != "0o777"
    finally:
        victim.unlink(missing_ok=True)
        Path(f"{victim}.moved").unlink(missing_ok=True)
    ok = sandbox.run_python(
        "import os\nopen('a', 'w').write('x')\nos.rename('a', 'b')\nos.remove('b')\nprint('ok')"
    )
    assert ok.status == "success" and ok.stdout.strip() == "ok"  # its own folder stays writable


def test_rlimits_mode_refuses_the_fork_exec_that_raises_no_audit_event(tmp_path: Path) -> None:
    # A child started by _posixsubprocess.fork_exec in a new session outlived the run's kill.
    rlimits = Sandbox(SandboxConfig(isolation="rlimits", workdir_root=str(tmp_path), **LIMITS))
    result = rlimits.run_python("import _posixsubprocess\nprint('imported')")
    assert result.status == "failure" and "importing _posixsubprocess is not allowed" in result.stderr


def test_output_is_capped(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import sys\nsys.stdout.write('x' * 10_000_000)\nsys.stdout.flush()")
    assert len(result.stdout) <= LIMITS["max_output_bytes"]
    assert result.status == "failure"
    assert result.reason in ("output_limit", "exit")  # SIGXFSZ, or the write error raised in Python


def test_namespace_mode_hides_home_and_project(tmp_path: Path) -> None:
    if not namespaces_available():
        pytest.skip("needs root and util-linux unshare")
    sandbox = Sandbox(SandboxConfig(isolation="namespaces", workdir_root=str(tmp_path), **LIMITS))
    project = Path(__file__).resolve().parents[2]
    code = f"import os\nprint(os.getuid(), os.path.exists({str(project)!r}), os.listdir('/tmp'))"
    result = sandbox.run_python(code)
    assert result.status == "success", result.stderr
    uid, project_visible, tmp_listing = result.stdout.split(" ", 2)
    assert int(uid) >= 200_000  # an unprivileged per-run uid, not root
    assert project_visible == "False"
    if tmp_path.is_relative_to("/tmp"):  # only the path to its own folder, not the host's /tmp
        assert tmp_listing.strip() == repr([tmp_path.relative_to("/tmp").parts[0]])
