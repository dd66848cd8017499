"""Helpers of the benchmark-script tests: load a script from its file, or run it as a subprocess."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """`benchmarks/NAME.py` as a module (a fresh copy: a test may patch its globals)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/SCRIPT ARGS...` as a user runs it (cwd: the repository root)."""
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=BENCH.parent,
    )


def call_main(module: ModuleType, monkeypatch, *args: str) -> object:
    """`module.main()` as the script's command line would call it (`sys.argv` set, as for a run)."""
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *args])
    return module.main()
