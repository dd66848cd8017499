"""The sandbox on hostile programs: each ends with a clear status and leaves the host unaffected."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_core.config.environments import SandboxConfig
from libra_core.envs import sandbox as sandbox_module
from libra_core.envs.sandbox import UNSHARE_ARGS, Sandbox, namespaces_available

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


def _processes_of(uids: set[int], wait_s: float = 2.0) -> list[str]:
    """Processes owned by `uids` (this test's own runs: other jobs on the machine run sandboxes
    too), polled until none is left or `wait_s` passes (the pid namespace's teardown is async)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(
            ["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True, check=True
        ).stdout
        left = [line for line in out.splitlines() if int(line.split()[0]) in uids]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def used_uids(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The per-run uids the sandbox hands out during the test."""
    uids: set[int] = set()
    real = sandbox_module.next_uid

    def recording() -> int:
        uid = real()
        uids.add(uid)
        return uid

    monkeypatch.setattr(sandbox_module, "next_uid", recording)
    return uids


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


def test_fork_bomb_is_contained(sandbox: Sandbox, used_uids: set[int]) -> None:
    bomb = "import os\nwhile True:\n    os.fork()\n"
    result = sandbox.run_python(bomb)
    assert result.status in ("failure", "timeout")
    if sandbox.isolation == "namespaces":
        assert "Resource temporarily unavailable" in result.stderr  # RLIMIT_NPROC stopped it
    else:
        assert "os.fork is not allowed" in result.stderr
    if sandbox.isolation == "namespaces":
        assert len(used_uids) == 1
    assert _processes_of(used_uids) == []  # nothing survives the run


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


@pytest.mark.parametrize(
    "escape",
    [
        # a descriptor of a folder outside (the interpreter's prefix is readable) made `dir_fd=`
        # opens land there: the hook sees only the relative path, resolved in the working folder
        "import os, sys\nfd = os.open(sys.prefix, os.O_RDONLY)\n"
        "os.close(os.open('libra-escape.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
        "import os\nos.chdir('/')\nprint(os.listdir())",  # listdir() with no path was not checked
        "import os\nfd = os.open('/', os.O_RDONLY)\nprint(os.listdir(fd))",
    ],
    ids=["dir-fd", "chdir", "listdir-fd"],
)
def test_rlimits_mode_confines_paths_relative_to_folders_outside(tmp_path: Path, escape: str) -> None:
    import sys

    rlimits = Sandbox(SandboxConfig(isolation="rlimits", workdir_root=str(tmp_path), **LIMITS))
    result = rlimits.run_python(escape)
    assert result.status == "failure" and "outside the working folder" in result.stderr, result.stderr
    leaked = [Path(p) / "libra-escape.txt" for p in {sys.prefix, sys.base_prefix}]
    assert not any(p.exists() for p in leaked), leaked
    ok = rlimits.run_python("import os, json\nos.mkdir('d')\nos.chdir('d')\nprint(os.listdir())")
    assert ok.status == "success" and ok.stdout.strip() == "[]"  # its own folders stay usable


def test_rlimits_mode_refuses_symlinks(tmp_path: Path) -> None:
    # The hook resolves a path, then `open` resolves it again: a thread that swapped a symlink in
    # the working folder between the two read and wrote files outside it (until 2026-12-07).
    rlimits = Sandbox(SandboxConfig(isolation="rlimits", workdir_root=str(tmp_path), **LIMITS))
    for code in ("import os\nos.symlink('a', 'l')", "import pathlib\npathlib.Path('l').symlink_to('a')"):
        result = rlimits.run_python(code)
        assert result.status == "failure" and "os.symlink is not allowed" in result.stderr, result.stderr
    ok = rlimits.run_python("import os\nopen('a', 'w').close()\nos.link('a', 'b')\nprint(os.listdir())")
    # hard links stay allowed (both paths are checked, and nothing in the folder leads outside it)
    assert ok.status == "success" and sorted(ast.literal_eval(ok.stdout)) == ["a", "b", "main.py"]


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_an_interrupted_host_takes_its_sandboxed_run_with_it(
    tmp_path: Path, sandbox: Sandbox, how: str
) -> None:
    # The run is in a session of its own: after Ctrl-C in the host, a sleeping program (no CPU,
    # so no RLIMIT_CPU) outlived it, past the wall limit nobody was left to enforce. A host killed
    # outright (SIGKILL, the OOM killer) runs no clean-up: the launcher's lifeline pipe ends the run.
    import signal
    import textwrap

    marker = str(tmp_path)  # in the launcher's arguments (its spec names the working folder)
    host = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from libra_core.config.environments import SandboxConfig
        from libra_core.envs.sandbox import Sandbox
        box = Sandbox(SandboxConfig(isolation={sandbox.isolation!r}, workdir_root={str(tmp_path)!r}))
        print("running", flush=True)
        box.run_python("import time\\ntime.sleep(600)")
    """)
    proc = subprocess.Popen([sys.executable, "-c", host], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"running"
    time.sleep(1.0)  # the program is sleeping in the sandbox
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (
        left := subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    ) and (time.monotonic() < deadline):
        time.sleep(0.1)  # the launcher reads end-of-file and exits; not instantly
    subprocess.run(["pkill", "-KILL", "-f", marker], check=False)  # clean up before failing
    assert left == []


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


def test_namespace_mode_bounds_the_working_folders_total_size(tmp_path: Path) -> None:
    # Every file stays under RLIMIT_FSIZE (4,096 bytes here), but a loop writing many of them filled
    # the host's disk: the working folder is now a 1 MiB tmpfs, and the inputs are still there.
    if not namespaces_available():
        pytest.skip("needs root and util-linux unshare")
    cfg = SandboxConfig(isolation="namespaces", workdir_root=str(tmp_path), max_workdir_mib=1, **LIMITS)
    code = (
        "import os\nprint(open('data.txt').read(), end=' ')\nn = 0\n"
        "try:\n    for i in range(1000):\n        with open(f'f{i}', 'w') as f:\n"
        "            f.write('x' * 4000)\n"
        "        n += 1\n"
        "except OSError as e:\n    print(n, e.errno)\nelse:\n    print(n, 0)"
    )
    result = Sandbox(cfg).run_python(code, files={"data.txt": "input"})
    assert result.status == "success", result.stderr
    given, written, errno = result.stdout.split()
    assert given == "input"
    assert 200 < int(written) < 1000 and int(errno) == 28  # ENOSPC at about 1 MiB, not 4 MB


def test_namespace_mode_bounds_the_number_of_files_in_the_working_folder(tmp_path: Path) -> None:
    # Empty files take no space, so the size bound let one run create 258,951 of them (~1 GiB of
    # kernel memory for 4 runs, until 2026-12-07): the tmpfs now has `max_workdir_files` inodes.
    if not namespaces_available():
        pytest.skip("needs root and util-linux unshare")
    cfg = SandboxConfig(isolation="namespaces", workdir_root=str(tmp_path), max_workdir_files=64, **LIMITS)
    code = (
        "import os\nn = 0\ntry:\n    for i in range(164):\n        open(f'f{i}', 'w').close()\n"
        "        n += 1\nexcept OSError as e:\n    print(n, e.errno)\nelse:\n    print(n, 0)"
    )
    result = Sandbox(cfg).run_python(code, files={"data.txt": "input"})
    assert result.status == "success", result.stderr
    assert result.stdout.split() == ["64", "28"]  # exactly the configured number, then ENOSPC


@pytest.mark.parametrize("code", [137, 121, 128 + 24, 128 + 25])
def test_the_programs_own_exit_code_is_not_read_as_a_limit_or_a_setup_failure(
    sandbox: Sandbox, code: int
) -> None:
    # 137 is how namespace mode reports SIGKILL (128 + 9), 152/153 SIGXCPU/SIGXFSZ, 121 a failed setup.
    result = sandbox.run_python(f"import sys\nprint('ran')\nsys.exit({code})")
    assert (result.status, result.reason, result.exit_code, result.stdout) == (
        "failure",
        "exit",
        code,
        "ran\n",
    )


def test_a_real_cpu_limit_is_still_a_timeout(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    if sandbox.isolation == "rlimits":
        assert "os.kill is not allowed" in result.stderr  # the audit hook refuses signals
    else:
        assert (result.status, result.reason) == ("timeout", "cpu_limit")


def test_uids_differ_across_sandboxes_of_one_process(tmp_path: Path) -> None:
    cfg = SandboxConfig(isolation="rlimits", workdir_root=str(tmp_path))
    first, second = Sandbox(cfg), Sandbox(cfg)
    uids = [sb._next_uid() for sb in (first, second, first, second)]
    assert len(set(uids)) == 4 and all(u >= 200_000 for u in uids)


def test_a_setup_failure_inside_the_namespace_is_reported(tmp_path: Path) -> None:
    # The launcher's child cannot exec the interpreter: the launcher reports a setup failure on its
    # status pipe (the child's exit code 121 alone would no longer be believed).
    if not namespaces_available():
        pytest.skip("needs root and util-linux unshare")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "main.py").write_text("print('never')")
    read_fd, write_fd = os.pipe()
    spec = {
        "isolation": "namespaces",
        "workdir": str(workdir),
        "python": "/nonexistent/python3",
        "python_prefix": os.path.realpath(sys.base_prefix),
        "hide": [],
        "drop_to_uid": sandbox_module.next_uid(),
        "cpu_s": 2,
        "memory_bytes": 256 * 2**20,
        "output_bytes": 4096,
        "workdir_bytes": 2**20,
        "workdir_files": 64,
        "max_processes": 4,
        "status_fd": write_fd,
    }
    python = os.path.realpath(sys.executable)
    argv = [shutil.which("unshare") or "unshare", *UNSHARE_ARGS, python, "-I", "-S", "-B"]
    argv += [str(sandbox_module.LAUNCHER), json.dumps(spec)]
    try:
        proc = subprocess.run(argv, pass_fds=(write_fd,), capture_output=True, timeout=30)
    finally:
        os.close(write_fd)
    report = sandbox_module._read_report(read_fd)
    os.close(read_fd)
    assert report == {"setup_failed": True}, proc.stderr
    assert b"sandbox setup failed" in proc.stderr
    status = sandbox_module._classify(proc.returncode, False, "namespaces", report)
    assert status == ("failure", "setup_failed", 121)
