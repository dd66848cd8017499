"""Atomic file writes: write a temp file beside the target, fsync it, then rename it over the target.

The writers of files another stage or command reads (trajectory IPC files, the lake, the run
history and state, timelines and trace.json, plots, traces, reports, the C-MLFQ tree) go through
`atomic_path`, so a reader never sees half a file, a crash (or a power loss: the data is synced
before the rename, the folder after it) leaves the old file whole or the new one, and a failed
write leaves no temp file behind.
Folders are copied beside their target and renamed the same way: a restored policy by
`pipeline/run_dir.copy_tree_atomic`, a checkpoint from its `.iter_N.staging` copy
(`pipeline/run_dir.save_checkpoint`); a failed copy deletes its partial copy.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield the temp path to write; on leaving the block rename it to `path` (parents created),
    or, if the block or the rename raised, delete it and re-raise.

    A `path` that is a symlink has its target replaced and stays a link: renaming over the link
    itself turned it into a regular file and left the target stale (until 2026-12-07).
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    # One temp file per call, not per process: two threads writing the same target would otherwise
    # write (and rename, and delete) one file. `.NAME.tmp-*` is what a resume clears away
    # (pipeline/resume.py); the pid tells which process left one.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        yield tmp
        # the data reaches the disk before the name does: after a power loss the target holds
        # the old or the new content, not a renamed empty file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (itself included): a folder copied beside its
    target is on disk before the rename that publishes it (checkpoints, the policy)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_folder(Path(root))


def sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable: the new name is folder data, which a power loss after
    `os.replace` could otherwise lose (the old content back, or, for a new file, none)."""
    if os.name != "posix":  # Windows cannot open a folder for fsync; NTFS journals renames
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # EINVAL: a file system that cannot sync folders
            raise
    finally:
        os.close(fd)
