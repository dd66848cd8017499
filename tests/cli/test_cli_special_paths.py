"""Paths that are not plain files or folders: an empty argument is refused where it is parsed (it
meant the current folder), and an output that is a FIFO, a socket or a device (or a link to one) is
refused before the work, since the atomic write would replace it with a regular file."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from flows import cli
from flows.cli_common import output_problem

EMPTY_PATH_ARGS = [
    ["run", "--resume", ""],
    ["run", "--resume", "  "],
    ["report", ""],
    ["trace", "export", "", "-o", "t.parquet"],
    ["trace-eval", "--trace", "", "--buckets", "1000"],
    ["plan", "--hardware", "8xA800", "--model", "qwen3-14b", "--workload", " "],
]


@pytest.mark.parametrize("argv", EMPTY_PATH_ARGS, ids=[" ".join(a[:2]) for a in EMPTY_PATH_ARGS])
def test_an_empty_path_argument_is_refused_when_parsed(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # parsing only: before the fix `run --resume ''` started a fresh run and `report ''` read the cwd
    with pytest.raises(SystemExit) as exited:
        cli._parser().parse_args(argv)
    assert exited.value.code == 2
    assert "empty path" in capsys.readouterr().err


def test_an_output_that_is_a_fifo_or_a_socket_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert output_problem(fifo) == f"{fifo}: is a FIFO, not a regular file; give a file path"
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert (
        output_problem(link) == f"{link}: is a link to {fifo}, a FIFO, not a regular file; give a file path"
    )
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert output_problem(sock_path) == f"{sock_path}: is a socket, not a regular file; give a file path"
    # a regular file, and a link to one, are still fine
    (tmp_path / "f").write_text("x")
    (tmp_path / "to-f").symlink_to(tmp_path / "f")
    assert output_problem(tmp_path / "f") is None and output_problem(tmp_path / "to-f") is None


def test_trace_synth_to_a_fifo_exits_2_and_leaves_the_fifo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert cli.main(["trace", "synth", "-o", str(fifo)]) == 2
    assert "is a FIFO, not a regular file" in capsys.readouterr().err.replace("\n", "")
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["pipe"]  # not replaced, no temp file


def test_trace_synth_through_a_link_writes_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real.parquet"
    target.write_text("old")
    link = tmp_path / "link.parquet"
    link.symlink_to(target)
    assert cli.main(["trace", "synth", "-o", str(link)]) == 0
    assert link.is_symlink() and target.read_bytes()[:4] == b"PAR1"
