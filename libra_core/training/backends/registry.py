"""Training backends by the name in `training.backend`, and the one update call the stage makes.

`build_backend` builds one replica's backend (modules imported only when built). `run_update` is
what the update stage calls: with `torch` it is exactly `run_grpo_update` (one process); the
data-parallel backends run inside trainer-pool workers, one backend per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.training.backends.base import DistSpec, TrainingBackend

if TYPE_CHECKING:
    import pyarrow as pa

    from libra_core.config.training import TrainingConfig
    from libra_core.training.update import UpdateResult

BackendFactory = Callable[..., TrainingBackend]

_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    if name in _REGISTRY:
        raise ValueError(f"training backend {name!r} is already registered")
    _REGISTRY[name] = factory


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def build_backend(name: str, dist: DistSpec | None = None, **options: Any) -> TrainingBackend:
    """Build (not set up) backend `name` for one replica; `options` go to its constructor."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown training backend {name!r}; valid names: {', '.join(backend_names())}")
    return factory(dist, **options)


def _torch(dist: DistSpec | None, **options: Any) -> TrainingBackend:
    from libra_core.training.backends.torch_backend import TorchBackend

    return TorchBackend(dist, **options)


def _ddp(dist: DistSpec | None, **options: Any) -> TrainingBackend:
    from libra_core.training.backends.ddp import DDPBackend

    return DDPBackend(dist, **options)


def _deepspeed(dist: DistSpec | None, **options: Any) -> TrainingBackend:
    from libra_core.training.backends.deepspeed_backend import DeepSpeedBackend

    return DeepSpeedBackend(dist, **options)


register_backend("torch", _torch)
register_backend("ddp", _ddp)
register_backend("deepspeed", _deepspeed)


def run_update(
    policy_dir: Path,
    state_dir: Path,
    table: pa.Table,
    cfg: TrainingConfig,
    *,
    version: int,
    seed: int,
    reference_dir: Path | None = None,
) -> UpdateResult:
    """The update stage's entry point, selecting the path by `cfg.backend`.

    `torch` runs the existing single-process GRPO update unchanged. A multi-rank GRPO update needs a
    trainer pool launching one rank per worker; until the update stage does that, `ddp` and
    `deepspeed` raise a ValueError naming the remedy instead of silently running single-process.
    """
    if cfg.backend == "torch":
        from libra_core.training.update import run_grpo_update

        return run_grpo_update(
            policy_dir, state_dir, table, cfg, version=version, seed=seed, reference_dir=reference_dir
        )
    if cfg.backend not in _REGISTRY:
        raise ValueError(
            f"unknown training backend {cfg.backend!r}; valid names: {', '.join(backend_names())}"
        )
    raise ValueError(
        f"training.backend {cfg.backend!r} runs one rank per trainer-pool worker; the GRPO update stage "
        "does not launch ranks yet. Use training.backend=torch for the update stage (the data-parallel "
        "backends are used by the elastic pool and by build_backend in rank code)."
    )
