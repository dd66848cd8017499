"""What every `libra` subcommand shares: the exit code of a user error, its one-line message, the
parsing of an output path and its check before any work is done.

An error message is printed as text, never as Rich markup (a path like `runs/[x]` is shown as it
is, and a `[/x]` in it cannot crash the printer), and is not wrapped, so a log keeps it on one line.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
from collections.abc import Iterable
from pathlib import Path

EXIT_INPUT_ERROR = 2


EXIT_INTERRUPTED = 130  # like a shell after Ctrl-C


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt, and caught wherever it is.

    A subclass, not KeyboardInterrupt itself: CPython 3.11 records a KeyboardInterrupt (the exact
    type) that passes through code run by `exec`/`eval` of a string (dataclass and namedtuple
    creation while a module imports) as unhandled even when it is caught later, and
    `python -m flows.cli` then ends by SIGINT (exit -2) instead of returning its code. CI saw
    `libra serve` stopped by SIGTERM exit -2 that way (2026-12-06).
    """


def raise_interrupted(signum: int, frame: object) -> None:
    """Signal handler of SIGTERM and SIGHUP: end the command as Ctrl-C would."""
    raise Interrupted(signal.Signals(signum).name)


def output_path(value: str) -> str:
    """argparse `type=` of an output path (`-o`, `--out`, `--json`): `~` expanded once, here.

    A shell leaves `--out=~/x` alone, so the command must expand it; doing it where the argument
    is parsed makes `output_problem` and the writer see the same path (the writers take it as it
    is, and wrote `./~/x`).
    """
    return os.path.expanduser(value)


def input_path(value: str) -> str:
    """argparse `type=` of a path to read, or a name that may be one (`--resume`, `--trace`,
    `--workload`): `~` expanded, as `output_path` does (a shell leaves `--x=~/y` alone, and the
    commands looked for a folder named `~`).

    A blank value is refused here: `Path("")` is the current folder, so `report ''` read the cwd as
    a run folder and `trace-eval --trace ''` said "is a folder" (until 2026-12-07).
    """
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"empty path {value!r}; give a file or folder path (`.` for the current folder)"
        )
    return os.path.expanduser(value)


def fail(message: str, code: int = EXIT_INPUT_ERROR) -> int:
    """Print `error: MESSAGE` on stderr and return `code` (default: the input-error exit code)."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error", "bold red"), ": ", message))
    return code


def output_problem(
    path: str | Path,
    *,
    folder: bool = False,
    inputs: Iterable[str | Path] = (),
    run_dir: str | Path | None = None,
) -> str | None:
    """Why `path` cannot be written (None: it can), checked before a command does its work.

    `folder`: the output is a folder (created if missing) rather than a file. `inputs`: files the
    command reads, which its output must not replace. `run_dir`: a run folder the command reads;
    the output must not land on the files it is made of (its history, lake, config, state:
    `pipeline.run_dir.is_run_file`); other files there (a trace, a report) are fine.
    """
    text = str(path)
    if not text.strip():
        return "the output path is empty"
    out = Path(text).expanduser()
    if out.is_symlink() and not out.exists():  # `mkdir` fails on it after the work is done
        return f"{text}: is a link to {os.readlink(out)}, which does not exist"
    if folder:
        if out.exists() and not out.is_dir():
            return f"{text}: exists and is not a folder"
    elif out.is_dir() or text.endswith(("/", "\\")):
        return f"{text}: is a folder; give a file name"
    elif out.exists() and not out.is_file():
        # the write renames a temp file over the path: /dev/null or a FIFO would be replaced by a
        # regular file, not written to (until 2026-12-07)
        return f"{text}: is {_special_kind(out)}, not a regular file; give a file path"
    resolved = out.resolve()
    problem = _name_too_long(resolved, folder)
    if problem:
        return f"{text}: {problem}"
    # where the first file is created: in the output folder itself, once it exists, else in the
    # nearest existing folder above it (a writable mount under a read-only root is fine)
    for parent in [resolved, *resolved.parents] if folder else resolved.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{text}: {parent} is a file, not a folder"
            problem = _cannot_write_in(parent)
            if problem:
                return f"{text}: cannot write in {parent} ({problem})"
            break
    for source in inputs:
        if Path(source).expanduser().resolve() == resolved:
            return f"{text}: is an input of this command; writing it would replace what it reads"
    if run_dir is not None:
        from libra_core.pipeline.run_dir import is_run_file

        if is_run_file(Path(run_dir).expanduser(), resolved):
            return f"{text}: is part of the run folder {run_dir}; write it elsewhere"
    return None


def _special_kind(path: Path) -> str:
    """What existing non-file, non-folder `path` (links followed) is, for a message."""
    mode = path.stat().st_mode
    kinds = [
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"a link to {os.readlink(path)}, {kind}" if path.is_symlink() else kind


# What atomic_path adds to a file's name for its temp file: `.NAME.tmp-PID-` + 12 hex digits.
TEMP_NAME_EXTRA = len(".") + len(".tmp-") + 7 + len("-") + 12


def _name_too_long(path: Path, folder: bool) -> str | None:
    """Why `path`'s last name is too long for its file system (None: it fits), the temp name a
    file is first written under included: that write failed after the command's work was done."""
    existing = next((p for p in path.parents if p.is_dir()), Path("/"))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    room = limit if folder else limit - TEMP_NAME_EXTRA
    size = len(os.fsencode(path.name))
    if size > room:
        return f"the name is {size} bytes; at most {room} fit here (the file system allows {limit})"
    return None


def _cannot_write_in(folder: Path) -> str | None:
    """Why a file cannot be created in existing `folder` (None: it can), found by creating and
    deleting one temp file: permission bits say little when the process runs as root, and a
    read-only mount or a virtual file system says it only on a write."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def folder_write_problem(path: str | Path) -> str | None:
    """Why files cannot be written in folder `path` (None: they can): `output_problem` (which tries
    a file in it, or in the nearest folder above it), then the folder is created, as the command
    would."""
    problem = output_problem(path, folder=True)
    if problem:
        return problem
    try:
        Path(path).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot write in {path}: {err.strerror or err}"
    return None
