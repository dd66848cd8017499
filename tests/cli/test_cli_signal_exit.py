"""A SIGTERM or SIGHUP handled by `libra` leaves the command's own exit code, however it is run.

CPython 3.11 records a KeyboardInterrupt of the exact type that passes through code run by `exec`
of a string as unhandled, even when it is caught later; `python -m flows.cli` then ends by SIGINT
(exit -2). CI saw `libra serve` end that way when its SIGTERM landed while a module was imported
(tests/flows/test_serve_addresses.py, 2026-12-06). The handler raises a subclass instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Installs the CLI's handler, then receives the signal inside exec'd code (as a dataclass or a
# namedtuple being created while a module imports would), catches it and returns 0.
MODULE = """
import os, signal, sys
from flows.cli_common import raise_interrupted

def main():
    signal.signal(signal.SIGNUM, raise_interrupted)
    try:
        exec("import os, signal\\nos.kill(os.getpid(), signal.SIGNUM)\\nfor _ in range(10**8): pass")
    except KeyboardInterrupt as err:
        print(type(err).__name__, err)
        return 0
    return 1

if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_caught_inside_exec_code_keeps_the_exit_code_under_python_m(
    tmp_path: Path, name: str
) -> None:
    (tmp_path / "signal_probe.py").write_text(MODULE.replace("SIGNUM", name))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "signal_probe"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # a bare KeyboardInterrupt gave -2 here (killed by SIGINT), and printed nothing else
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["Interrupted", name]
