"""Inside half of the sandbox: a stdlib-only script that confines itself, then runs untrusted code.

Run by `libra_core.envs.sandbox.Sandbox` as `python -I -S sandbox_launcher.py SPEC_JSON`, either
under `unshare --net --mount --pid --ipc --uts --fork --kill-child --mount-proc` ("namespaces"
isolation, needs root) or directly ("rlimits" isolation). It must not import libra_core: it runs
with no site-packages and (in namespace mode) with the project folder hidden.

Namespace mode, as root inside fresh namespaces: hide folders behind empty tmpfs mounts, bind the
interpreter's prefix back read-only, mount the working folder as a size-limited tmpfs holding the
inputs (total disk use and number of files), then fork. The child drops
to an unprivileged, per-run uid, applies resource limits and execs the interpreter on `main.py`;
the parent stays as pid 1 of the pid namespace, reaps, and exits with the child's status, which
tears down the namespace and kills anything the code left behind (fork-bomb remnants included).

The launcher reports how the run ended as one JSON line on the pipe `status_fd` the host passes
(`{"exit": n}`, `{"signal": n}`, `{"setup_failed": true}`; in rlimits mode `{"started": true}`
before the code runs). The code never holds that pipe, so its own exit status (137, 121) cannot
pass for a limit or a setup failure.

Rlimits mode (no namespaces): apply the resource limits, install an audit hook that refuses
sockets, subprocesses, ctypes, symlinks and opening files outside the working folder and the
interpreter's prefix, then run `main.py` in this process. Best effort only: see docs/environments.md.
"""

import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
EXIT_SETUP_FAILED = 121  # the launcher could not confine itself; nothing of the code ran


def _mount(libc, source, target, fstype, flags, data):
    rc = libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if rc != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source!r} on {target!r} failed: {os.strerror(errno)}")


def _confine_filesystem(spec):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    prefix, workdir = spec["python_prefix"], spec["workdir"]
    # The working folder becomes a tmpfs of `workdir_bytes`: RLIMIT_FSIZE bounds each file, this
    # bounds them all (a loop writing files could otherwise fill the host's disk). The host's copy
    # holds only the inputs, read here before anything is hidden.
    inputs = {}
    for name in os.listdir(workdir):
        with open(os.path.join(workdir, name), "rb") as f:
            inputs[name] = f.read()
    prefix_fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY)
    for folder in spec["hide"]:
        if os.path.isdir(folder) and not os.path.islink(folder):
            _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.makedirs(prefix, exist_ok=True)  # inside a tmpfs now, or already there
    _mount(libc, f"/proc/self/fd/{prefix_fd}", prefix, None, MS_BIND | MS_REC, None)
    _mount(libc, None, prefix, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, None)
    os.close(prefix_fd)
    os.makedirs(workdir, exist_ok=True)
    uid = spec["drop_to_uid"]
    # Empty files take no space but an inode (~1 KiB of kernel memory) each: without `nr_inodes` one
    # run created 258,951 of them (until 2026-12-07). The folder itself and the inputs take inodes
    # too, so the code may create exactly `workdir_files` more.
    inodes = spec["workdir_files"] + 1 + len(inputs)
    options = f"size={spec['workdir_bytes']},nr_inodes={inodes},mode=700,uid={uid},gid={uid}"
    _mount(libc, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for name, data in inputs.items():
        path = os.path.join(workdir, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chown(path, uid, uid)


def _limit(spec):
    cpu = int(spec["cpu_s"])
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_FSIZE, spec["output_bytes"], spec["output_bytes"]),
        (resource.RLIMIT_NOFILE, 64, 64),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if spec["drop_to_uid"] is not None or os.geteuid() != 0:
        # Counted per real uid, and ignored for root: only meaningful once privileges are dropped.
        limits.append((resource.RLIMIT_NPROC, spec["max_processes"], spec["max_processes"]))
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def _drop_privileges(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _environment(spec):
    return {
        "HOME": spec["workdir"],
        "TMPDIR": spec["workdir"],
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
    }


def _python_argv(spec):
    return [spec["python"], "-I", "-S", "-B", "main.py"]


def _report(spec, report):
    """Tell the host how the run ended, on the status pipe the host passed (`status_fd`). The code's
    own exit status cannot pass for one of these: a program may exit with 137 or 121 itself."""
    fd = spec.get("status_fd")
    if fd is not None:
        os.write(fd, json.dumps(report).encode() + b"\n")
        os.close(fd)


def _watch_host(spec):
    """Exit when the host is gone: it holds the write end of the pipe `lifeline_fd` and never
    writes, so end-of-file means it died, however (SIGKILL, the OOM killer). In namespace mode this
    runs in pid 1, whose exit tears the namespace down; in rlimits mode in the code's own process."""
    fd = spec.get("lifeline_fd")
    if fd is None:
        return
    import threading

    def watch():
        try:
            while os.read(fd, 1):
                pass
        except OSError:  # the code closed it (rlimits mode): it can only end itself this way
            pass
        os._exit(137)

    threading.Thread(target=watch, name="libra-sandbox-lifeline", daemon=True).start()


def _read_to_end(fd):
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk


def _run_namespaced(spec):
    _confine_filesystem(spec)
    # Closed in the child by a successful exec (os.pipe makes close-on-exec fds): a byte on it means
    # the child failed before running any of the code.
    exec_read, exec_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(exec_read)
            for name in ("status_fd", "lifeline_fd"):  # the code must not hold the host's pipes
                if spec.get(name) is not None:
                    os.close(spec[name])
            os.chdir(spec["workdir"])
            _drop_privileges(spec["drop_to_uid"])
            _limit(spec)
            os.execve(spec["python"], _python_argv(spec), _environment(spec))
        except BaseException as exc:  # the child must never return into the launcher
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
            os.write(exec_write, b"x")
            os._exit(EXIT_SETUP_FAILED)
    os.close(exec_write)
    _watch_host(spec)  # after the fork: the child execs at once and must not inherit the thread
    setup_failed = _read_to_end(exec_read) != b""
    os.close(exec_read)
    status = 0
    while True:  # pid 1: reap everything, return when the code's own process is gone
        try:
            done, code = os.wait()
        except ChildProcessError:
            break
        if done == pid:
            status = code
            break
    if setup_failed:
        _report(spec, {"setup_failed": True})
        os._exit(EXIT_SETUP_FAILED)
    if os.WIFSIGNALED(status):
        _report(spec, {"signal": os.WTERMSIG(status)})
        os._exit(128 + os.WTERMSIG(status))
    _report(spec, {"exit": os.WEXITSTATUS(status)})
    os._exit(os.WEXITSTATUS(status))


_BLOCKED_EVENTS = (
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.getaddrinfo",
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    # The hook checks a path, then the call resolves it again: a symlink swapped in by another thread
    # between the two led `open` outside the working folder (until 2026-12-07). With no symlinks in
    # it, a path checked there stays there.
    "os.symlink",
    "ctypes.dlopen",
    "ctypes.cdata",
    "ctypes.addressof",
    "sys.setprofile",
    "sys.settrace",
)


# Audit events that change the filesystem, with the positions of their path arguments: each path
# must lie in the working folder (symlinks are refused outright: `_BLOCKED_EVENTS`).
_PATH_EVENTS = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.chflags": (0,),
    "os.utime": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _audit_guard(spec):
    workdir = os.path.realpath(spec["workdir"])
    readable = tuple(os.path.realpath(p) for p in {spec["python_prefix"], sys.prefix, sys.base_prefix})

    def inside(path, roots):
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def resolved(target):
        """The real path of a path or of an open descriptor (through /proc), else None."""
        if isinstance(target, (str, bytes)):
            return os.path.realpath(os.fsdecode(target))
        if isinstance(target, int):
            try:
                return os.path.realpath(os.readlink(f"/proc/self/fd/{target}"))
            except OSError:
                return None
        return None

    def hook(event, args):
        if event in _BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in ("os.listdir", "os.scandir") and args and args[0] is not None:
            path = resolved(args[0])  # a descriptor too (`os.listdir(fd)`)
            if path is None or not inside(path, (workdir, *readable)):
                raise PermissionError(f"sandbox: listing {path!r} outside the working folder")
        if event == "os.chdir" and args:
            # Relative paths (and `listdir()` with none) are checked against the working folder
            # as the current one: leaving it made them reach anywhere (until 2026-12-06).
            path = resolved(args[0])
            if path is None or not inside(path, (workdir,)):
                raise PermissionError(f"sandbox: chdir to {path!r} outside the working folder")
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0  # os.open: mode None
            writing = any(c in mode for c in "wax+") or bool(flags & _WRITE_FLAGS)
            if not inside(path, (workdir,)) and (writing or not inside(path, readable)):
                raise PermissionError(f"sandbox: open({path!r}) outside the working folder")
            # No descriptor of a folder outside it: paths relative to one (`dir_fd=`, which this
            # event does not show) escaped the check above (until 2026-12-06).
            if not inside(path, (workdir,)) and os.path.isdir(path):
                raise PermissionError(f"sandbox: opening folder {path!r} outside the working folder")
        if event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and isinstance(args[i], (str, bytes)):
                    path = os.path.realpath(os.fsdecode(args[i]))
                    if not inside(path, (workdir,)):
                        raise PermissionError(f"sandbox: {event}({path!r}) outside the working folder")
        if event == "import" and args and args[0] == "_posixsubprocess":
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")

    # `subprocess` refuses through its audit event, but `_posixsubprocess.fork_exec` raises none: make
    # it unimportable (a fresh import is refused by the hook). A module already holding a reference
    # (subprocess._fork_exec) stays a gap of this mode; docs/environments.md says what it guards.
    sys.modules.pop("_posixsubprocess", None)
    sys.addaudithook(hook)


def _prepare_in_process(spec):
    os.chdir(spec["workdir"])
    os.environ.clear()
    os.environ.update(_environment(spec))
    _limit(spec)
    sys.argv = ["main.py"]
    sys.path.insert(0, spec["workdir"])


def main():
    spec = json.loads(sys.argv[1])
    try:
        if spec["isolation"] == "namespaces":
            _run_namespaced(spec)  # never returns
        _watch_host(spec)  # before the limits: a thread counts against max_processes
        _prepare_in_process(spec)
    except OSError as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        _report(spec, {"setup_failed": True})
        os._exit(EXIT_SETUP_FAILED)
    # The code runs in this process: report before it starts and close the pipe, so it can neither
    # write the report nor make its own exit status read as a setup failure.
    _report(spec, {"started": True})
    import runpy

    _audit_guard(spec)  # last: from here on the hook also constrains this script
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main()
