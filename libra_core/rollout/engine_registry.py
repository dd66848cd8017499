"""Pid files of the engine processes a run started, so a later process can stop the orphans.

Each vLLM server runs in its own session (vllm_server.py), so stopping the flow process does not
stop its engines; the rollout pool stops them on every normal exit, on cancellation and at
interpreter exit. A process killed outright (Prefect's runner sends SIGKILL 30 s after SIGTERM; an
out-of-memory kill) runs none of that, and its engines keep their ports, memory and CPU cores.

Who calls it: the rollout pool (pools/rollout.py). When it starts an instance it calls
`record(folder, instance_id, pid)`; when it stops one, `forget(folder, instance_id)`; when a
process creates the pool of a run, `reap_orphans(folder)` first, which stops every recorded engine
whose owner (the process that started it) is gone. A pid file names both processes with their start
times (`/proc/<pid>/stat`), so a recycled pid is never taken for the process it once was, and the
engines of a live owner (another process serving the same run folder) are left alone.

One file per engine, `<folder>/<instance_id>.pid`, JSON: {"instance_id", "pid", "pid_start",
"owner", "owner_start"}; written atomically. Linux only: where `/proc` is missing, `record` writes
nothing and `reap_orphans` stops nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from libra_core.data.atomic import atomic_path

log = logging.getLogger(__name__)

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None if there is no such process. The
    command name (field 2) may hold spaces and parentheses, so fields start after its last ')'."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat),
    or None if it does not exist or has exited (a zombie: only its table entry is left)."""
    fields = _stat_fields(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that have not exited."""
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _running(pid: int, start: int) -> bool:
    """The engine started as session leader `pid` at `start`, or a process of its group, still runs.

    If the leader exited, its children (vLLM's engine core) may still run in its group; Linux does
    not give a pid to a new process while a group of that id exists, so a pid found with another
    start time means the group is gone."""
    now = process_start(pid)
    if now is not None:
        return now == start
    return bool(group_members(pid))


def record(folder: Path, instance_id: str, pid: int) -> Path | None:
    """Note that this process started engine `instance_id` as process (group) `pid`."""
    pid_start, owner_start = process_start(pid), process_start(os.getpid())
    if pid_start is None or owner_start is None:
        return None  # no /proc (or the engine already exited): nothing a reaper could check
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{instance_id}.pid"
    entry = {
        "instance_id": instance_id,
        "pid": pid,
        "pid_start": pid_start,
        "owner": os.getpid(),
        "owner_start": owner_start,
    }
    # A temp file of its own (`atomic_path`): two processes recording one instance id (a second
    # process serving the run folder) would otherwise write, and rename away, each other's.
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(entry))
    return path


def forget(folder: Path, instance_id: str) -> None:
    """The engine `instance_id` was stopped by its owner."""
    with contextlib.suppress(FileNotFoundError):
        (folder / f"{instance_id}.pid").unlink()


def reap_orphans(folder: Path, timeout_s: float = 10.0) -> list[str]:
    """Stop the recorded engines whose owner is gone (SIGTERM to the group, SIGKILL after
    `timeout_s`) and remove their pid files; returns their instance ids. Files of engines that have
    exited are removed; files of a live owner's engines are kept. An unreadable file is removed with
    a warning (it could only name a process this module cannot check)."""
    if not folder.is_dir():
        return []
    orphans: list[tuple[str, int, int]] = []
    for path in sorted(folder.glob("*.pid")):
        try:
            entry = json.loads(path.read_text())
            iid, pid, start = str(entry["instance_id"]), int(entry["pid"]), int(entry["pid_start"])
            owner, owner_start = int(entry["owner"]), int(entry["owner_start"])
        except (ValueError, KeyError, TypeError) as e:
            log.warning("removing unreadable engine pid file %s (%s)", path, e)
            path.unlink(missing_ok=True)
            continue
        if process_start(owner) == owner_start:
            continue  # its owner still runs it (and stops it)
        if _running(pid, start):
            orphans.append((iid, pid, start))
        else:
            path.unlink(missing_ok=True)
    for iid, pid, _ in orphans:
        log.warning("stopping engine %s (pid %d): the process that started it is gone", iid, pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_running(pid, start) for _, pid, start in orphans) and time.monotonic() < deadline:
        time.sleep(0.1)
    for iid, pid, start in orphans:
        if _running(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        (folder / f"{iid}.pid").unlink(missing_ok=True)
    return [iid for iid, _, _ in orphans]
