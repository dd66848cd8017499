"""Training backends by the name in `training.backend`.

`build_backend` builds one replica's backend (modules imported only when built); the data-parallel
backends run inside trainer-pool workers and the elastic pool, one backend per rank. The GRPO update
stage runs `training.update.run_grpo_update` in one process (pipeline/update_stage.py): config
validation refuses `ddp` and `deepspeed` in an experiment until the stage launches ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from libra_core.training.backends.base import DistSpec, TrainingBackend

if TYPE_CHECKING:
    pass

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
