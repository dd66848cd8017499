"""One process per run folder: an exclusive lock on `RUN_DIR/.lock` while a run (or its resume) runs.

Two processes on one folder would serve and train the same policy and optimizer files and
overwrite each other's history. Who calls it: the create-run task takes the lock (`lock_run`) before
it changes anything; the experiment flow releases it when the run ends (`unlock_run`); `libra run
--resume` asks `run_holder` first, to refuse before Prefect starts. The lock is an advisory
`fcntl.flock`: the operating system drops it when the holding process dies, so a killed run never
leaves a folder locked. The file holds the holder's pid, for the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}  # run folder -> open descriptor holding its lock (this process)


class RunLockedError(RuntimeError):
    """Another process runs this run folder."""


def lock_run(run_dir: str | Path) -> None:
    """Take the folder's lock for this process (again: a no-op); RunLockedError if another has it."""
    root = Path(run_dir).resolve()
    if root in _held:
        return
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunLockedError(
            f"run folder {root} is in use by process {holder} (a run or a resume of it); "
            "wait for it to end or stop it first"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[root] = fd


def held_runs() -> list[Path]:
    """The run folders whose lock this process holds (resolved paths)."""
    return list(_held)


def unlock_run(run_dir: str | Path) -> None:
    """Release this process's lock on the folder (none held: a no-op)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def run_holder(run_dir: str | Path) -> str | None:
    """The pid of another process holding the folder's lock, or None when it is free."""
    root = Path(run_dir).resolve()
    if root in _held or not (root / LOCK_NAME).exists():
        return None
    try:
        lock_run(root)
    except RunLockedError:
        return (root / LOCK_NAME).read_text().strip() or "?"
    unlock_run(root)
    return None
