"""`pools.local.threads_per_worker` holds in a worker whose driver script imports torch at the top:
spawn re-imports that script in the worker before the call loop sets the thread variables, so
torch's thread pool was already sized (2 threads here where 1 was asked, until 2026-12-07)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

DRIVER = textwrap.dedent(
    """
    import torch  # at the top, as a training script has it

    from libra_core.config.pools import LocalPoolConfig
    from libra_core.pools.local import LocalPool


    def probe():
        import torch
        return torch.get_num_threads()


    if __name__ == "__main__":
        torch.set_num_threads(2)
        pool = LocalPool(LocalPoolConfig(threads_per_worker=1))
        pool.start(1)
        try:
            print("threads", pool.run(pool.worker_ids[0], probe))
        finally:
            pool.stop()
    """
)


def test_a_worker_of_a_driver_that_imports_torch_uses_threads_per_worker(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env_free = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no OMP_NUM_THREADS inherited
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env_free, check=True
    )
    assert out.stdout.split() == ["threads", "1"], out.stderr
