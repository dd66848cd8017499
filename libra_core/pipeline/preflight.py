"""Checks of a valid config against this machine, before any work: what `libra config validate`
and `libra run` refuse up front rather than in the prepare-policy task, after a run folder exists.

Called by the CLI before Prefect is imported; cheap (a package-metadata lookup and file tests, no
torch or vLLM import). The tasks keep their own checks: a served deployment reaches them directly.
"""

from __future__ import annotations

from libra_core.config.models import LibraConfig, TinyModelConfig
from libra_core.envs.datasets import resolve_data_path
from libra_core.model.policy import check_servable_head_dim


def machine_problems(cfg: LibraConfig) -> list[str]:
    """One line per setting this machine cannot run (empty: none found). Until 2026-12-06 both
    passed `libra config validate`, and `libra run` failed with Prefect tracebacks (exit 1)."""
    problems: list[str] = []
    if isinstance(cfg.model, TinyModelConfig):
        try:
            check_servable_head_dim(cfg.model)
        except ValueError as err:
            problems.append(str(err))
    env = cfg.environment
    data_dir = getattr(env, "data_dir", None)
    for file in env.data_files() if hasattr(env, "data_files") else ():
        try:
            resolve_data_path(data_dir or "", file)
        except FileNotFoundError as err:
            problems.append(f"environment: {err}")
    return problems
