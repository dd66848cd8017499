"""Checks of a valid config against this machine, before any work: what `libra config validate`
and `libra run` refuse up front rather than in the prepare-policy task, after a run folder exists.

Called by the CLI before Prefect is imported; cheap (a package-metadata lookup and file tests; torch
is imported only when `training.device` is `cuda`, to ask whether it sees one; no vLLM import).
The create-run task calls `check_before_run` too: a deployment started from the Prefect UI, the
API or a schedule (`libra serve`) never goes through the CLI's checks.
"""

from __future__ import annotations

from pathlib import Path

from libra_core.config.models import HFLocalModelConfig, LibraConfig, TinyModelConfig
from libra_core.config.pretrained import SmolLM2ModelConfig
from libra_core.envs.datasets import resolve_data_path
from libra_core.model.policy import check_servable_head_dim, hf_folder_problem


def machine_problems(cfg: LibraConfig) -> list[str]:
    """One line per setting this machine cannot run (empty: none found). Until 2026-12-06 both
    passed `libra config validate`, and `libra run` failed with Prefect tracebacks (exit 1)."""
    problems: list[str] = []
    if isinstance(cfg.model, TinyModelConfig):
        try:
            check_servable_head_dim(cfg.model)
        except ValueError as err:
            problems.append(str(err))
    if isinstance(cfg.model, HFLocalModelConfig):
        problem = hf_folder_problem(cfg.model.path)
        if problem:
            problems.append(problem)
    if isinstance(cfg.model, SmolLM2ModelConfig):  # the prepare task failed on it, folder made
        problems += _gguf_problems(cfg.model)
    if cfg.training.device == "cuda":  # passed validate, then failed in the prepare task
        problems += _cuda_problems()
    env = cfg.environment
    data_dir = getattr(env, "data_dir", None)
    for file in env.data_files() if hasattr(env, "data_files") else ():
        try:
            resolve_data_path(data_dir or "", file)
        except FileNotFoundError as err:
            problems.append(f"environment: {err}")
    return problems


def _cuda_problems() -> list[str]:
    try:
        from libra_core.model.policy import resolve_training_device

        resolve_training_device("cuda")
    except (ValueError, ImportError) as err:
        return [str(err)]
    return []


def _gguf_problems(model: SmolLM2ModelConfig) -> list[str]:
    from libra_core.model.smollm2 import INSTALL_HINT, missing_readers, packaged_gguf

    problems = []
    missing = missing_readers()
    if missing:  # `make run` installs no extra: the prepare task failed on it, folder made
        problems.append(
            f"model: type smollm2 reads its GGUF file with {', '.join(missing)}, not installed: "
            + INSTALL_HINT
        )
    if model.gguf_path is not None:
        if not Path(model.gguf_path).expanduser().is_file():
            problems.append(f"model.gguf_path {model.gguf_path!r} is not a file")
        return problems
    try:
        packaged_gguf()
    except FileNotFoundError as err:
        problems.append(f"model: {err}")
    return problems


def check_before_run(cfg: LibraConfig) -> None:
    """Raise a ValueError listing, one per line, what stops `cfg` from running here: the planner's
    model, hardware and workload names (Libra planner) and `machine_problems`. The create-run task
    calls it before it makes or changes a run folder, for a new run and for a resume (whose
    `--set`/UI overrides may name another spec), as `libra run` checks before Prefect starts."""
    problems: list[str] = []
    if cfg.planner.type == "libra":
        from libra_core.planner.service import LibraPlanner

        try:
            LibraPlanner.resolve_specs(cfg)
        except ValueError as err:
            problems += str(err).splitlines()
    problems += machine_problems(cfg)
    if problems:
        raise ValueError("\n".join(problems))
