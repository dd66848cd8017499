"""Ctrl-C in a `libra` command that does not handle it itself: one line on stderr and exit 130,
not a traceback and exit -2 (in process: the handler is replaced by one that raises)."""

from __future__ import annotations

import pytest

from flows import cli, cli_plan, cli_report, cli_trace
from flows.cli_common import EXIT_INTERRUPTED

# argv, and the (module, name) of the handler `main` reaches with it
COMMANDS = [
    (["config", "validate"], (cli, "_cmd_config")),
    (["plan", "--hardware", "8xA800", "--model", "qwen3-14b", "--workload", "tiny"], (cli_plan, "cmd_plan")),
    (["report", "some-run"], (cli_report, "cmd_report")),
    (["trace", "synth", "-o", "t.parquet"], (cli_trace, "cmd_trace")),
    (["trace-eval", "--trace", "t.parquet", "--buckets", "1000"], (cli_trace, "cmd_trace_eval")),
]


@pytest.mark.parametrize(("argv", "handler"), COMMANDS, ids=[" ".join(a[:1]) for a, _ in COMMANDS])
def test_ctrl_c_prints_one_line_and_exits_130(
    argv: list[str],
    handler: tuple[object, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(*handler, interrupted)
    try:
        code = cli.main(argv)
    except KeyboardInterrupt:  # caught here, or pytest itself would stop
        pytest.fail("Ctrl-C escaped main(): Python prints a traceback and the process exits -2")
    assert code == EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err == f"libra {argv[0]}: interrupted; no file was left half-written\n"
