"""The policy a rollout pool serves, kept so that an engine started later loads the same weights.

All instances of a pool serve one version (`RolloutPool.served_version`), and the agent loop labels
every turn's tokens with it. The policy folder does not always hold that version: in the async
pipeline the update of iteration i rewrites it while the rollout of i+1 still runs on the old
weights, and only the sync after the update advances the served version. An engine started in that
window (the replacement of one that crashed or hung, on the rollout task's retry) loaded the newer
weights, and its tokens were labelled with the older version, beside instances that really served
it (until 2026-12-06).

So each time the served version is set (the pool is created, a sync finishes) the pool records the
folder as it is (`record`): hard links to its files, taken in `store`. The trainer and a resume
replace the folder's files by renaming new ones over them, never in place, so a link keeps the
weights it was taken of. An engine starts from the folder while the folder still holds what was
recorded (same files: names, inodes, sizes, times), and from the record once it does not
(`start_dir`). Cost: the recorded weights stay on disk until the next record, at most one model
size, and only while the folder holds newer ones. Where links are not possible (another file
system), files are copied.

Called by the rollout pool (pools/rollout.py) under its per-pool lock, so no engine is starting
from a record while another replaces it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from libra_core.rollout.engine_registry import process_start

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int, int], ...]

_PREFIX = "served-policy-"


def fingerprint(folder: Path) -> Fingerprint:
    """(relative path, inode, size, mtime_ns) of every file under `folder`, hidden files (a temp
    file being written) left out; () for a folder that does not exist."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(root) / name
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                out.append((str(path.relative_to(folder)), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


class ServedPolicy:
    def __init__(self, folder: Path, store: Path) -> None:
        self.folder, self.store = folder, store
        self.version: int | None = None
        self._recorded: Fingerprint = ()
        self._copy: Path | None = None

    def record(self, version: int) -> None:
        """The pool's engines serve `version`, which the folder holds now: keep a copy of it (and
        drop the previous one). A copy that cannot be made is logged, not raised: the sync it
        follows did succeed, and only an engine started while the folder is ahead needs it."""
        previous = self._copy
        self.version, self._recorded, self._copy = version, fingerprint(self.folder), None
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        if not self._recorded:
            return
        owner = f"{os.getpid()}-{process_start(os.getpid())}"
        dst = self.store / f"{_PREFIX}{owner}-v{version}-{os.urandom(4).hex()}"
        try:
            self.store.mkdir(parents=True, exist_ok=True)
            hidden = shutil.ignore_patterns(".*")  # a temp file being written
            shutil.copytree(self.folder, dst, copy_function=_link_or_copy, ignore=hidden)
        except (OSError, shutil.Error) as err:
            shutil.rmtree(dst, ignore_errors=True)
            log.warning("could not keep the served policy (version %d) in %s: %s", version, dst, err)
            return
        self._copy = dst

    def start_dir(self) -> Path:
        """The folder an engine starting now should load: the policy folder while it still holds
        the served version, else the copy taken of it. Raises RuntimeError when the folder is ahead
        and there is no copy (it could not be made): the engine would serve weights its tokens are
        not labelled with; the next sync records the folder again."""
        if self.version is None or fingerprint(self.folder) == self._recorded:
            return self.folder
        if self._copy is None:
            raise RuntimeError(
                f"the policy folder {self.folder} holds weights newer than the version the rollout "
                f"pool serves ({self.version}), and no copy of that version could be kept (see the "
                "warning logged at the last weight sync); an engine started now would serve weights "
                "its tokens are not labelled with. It can start after the next weight sync."
            )
        log.info("the policy folder is ahead of the served version %d: starting from its copy", self.version)
        return self._copy

    def discard(self) -> None:
        """The pool stopped: remove the copy."""
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None


def remove_stale(store: Path) -> list[Path]:
    """Remove the copies in `store` whose pool's process is gone (killed before it could discard
    them); called when a pool is created on a run folder, next to the engine reaper."""
    removed = []
    for path in store.glob(f"{_PREFIX}*") if store.is_dir() else []:
        parts = path.name[len(_PREFIX) :].split("-")
        with contextlib.suppress(ValueError, IndexError):
            if process_start(int(parts[0])) == int(parts[1]):
                continue  # a live pool's
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
