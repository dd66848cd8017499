"""Argument checks the benchmark scripts share: counts, lists, input folders, output files.

A script imports it as `_args`: `python benchmarks/NAME.py` puts the script's folder first on
sys.path, and each script also inserts its folder there itself, so a test that loads the script
from its file (`importlib.util.spec_from_file_location`) finds it too. Standard library only:
`gpu_decode_step.py` imports it on a CUDA machine that has torch and pyyaml and nothing else.

A bad value is a one-line `error:` and exit 2 (argparse's `ap.error`), before any work is done.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn


def summary(doc: str | None) -> str:
    """A docstring's first paragraph on one line: `--help`'s description, never cut mid-sentence."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type=`: an integer of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def non_negative_float(text: str) -> float:
    """An argparse `type=`: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse `type=`: a finite number > 0."""
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def comma_list(item: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse `type=`: comma-separated values, each parsed by `item` (an argparse type)."""

    def parse(text: str) -> list[Any]:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        out = []
        for p in parts:
            try:
                out.append(item(p))
            except (argparse.ArgumentTypeError, ValueError) as err:
                where = f" (in {text!r})" if len(parts) > 1 else ""
                raise argparse.ArgumentTypeError(f"{err}{where}") from None
        return out

    parse.__name__ = "comma-separated list"
    return parse


class ExtendList(argparse.Action):
    """`nargs="+"` that gathers every use of the flag (`--x a --x b` is `[a, b]`), and whose first
    use replaces a non-empty default instead of adding to it (argparse's own `action="extend"`
    appends to the default list)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        items.extend(values if isinstance(values, list | tuple) else [values])
        setattr(namespace, self.dest, items)


def folder_problem(path: Path, needs: Iterable[str] = (), what: str = "folder") -> str | None:
    """Why `path` is not a usable input folder (None: it is): it must exist, be a folder and hold
    every entry of `needs` (names relative to it, e.g. `lake`, `policy/config.json`)."""
    if not path.exists():
        return f"{path}: no such {what}"
    if not path.is_dir():
        return f"{path}: not a folder (expected a {what})"
    missing = [n for n in needs if not (path / n).exists()]
    if missing:
        return f"{path}: not a {what} (missing {', '.join(missing)})"
    return None


def run_folder_problem(run_dir: Path, needs: Iterable[str] = ("policy",)) -> str | None:
    """Why `run_dir` is not a run folder with a trajectory lake (None: it is): it holds
    `lake/iteration=*.parquet` files and every entry of `needs` (by default the policy folder, whose
    tokenizer decodes the lake)."""
    problem = folder_problem(run_dir, ["lake", *needs], "run folder")
    if problem is None and not any((run_dir / "lake").glob("iteration=*.parquet")):
        problem = f"{run_dir}: its trajectory lake {run_dir / 'lake'} holds no iteration"
    return problem


def output_file_problem(path: Path) -> str | None:
    """Why a file cannot be written at `path` (None: it can), checked before the work: not a folder,
    its folder exists and a file can be created in it."""
    text = str(path)
    if not text.strip():
        return "the output path is empty"
    if path.is_dir() or text.endswith(("/", os.sep)):
        return f"{path}: is a folder; give a file name"
    parent = path.resolve().parent
    if not parent.is_dir():
        what = "is a file, not a folder" if parent.exists() else "does not exist"
        return f"{path}: {parent} {what}"
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        return f"{path}: cannot write in {parent} ({err.strerror or err})"
    return None


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`: a reader
    (or a run cut short) sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would leave it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_overrides(ap: argparse.ArgumentParser, *, spec: bool = True) -> None:
    """`--setting FIELD=VALUE ...` (SimSettings) and, with `spec`, `--spec FIELD=VALUE ...` (the
    scenario's generator); repeated flags accumulate, as in `libra simulate`."""
    ap.add_argument(
        "--setting",
        nargs="+",
        action="extend",
        default=[],
        metavar="FIELD=VALUE",
        help="changes to SimSettings",
    )
    if spec:
        ap.add_argument(
            "--spec",
            nargs="+",
            action="extend",
            default=[],
            metavar="FIELD=VALUE",
            help="changes to the scenario's generator",
        )


def or_stop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, or `stop` with its ValueError: `simulate` raises one, before any
    policy runs, for a policy that cannot deploy on the cluster (a model too big for it)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as err:
        stop(str(err))


def stop(message: str) -> NoReturn:
    """A problem found only once the work began (a cluster too small to train the model: the
    simulator's deployment says so): argparse's one `error:` line and exit 2, not a traceback."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)
