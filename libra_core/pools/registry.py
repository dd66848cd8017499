"""Pool backends by the name in `pools.type`; the one place a pool is built from config.

Backends register a factory taking the full PoolsConfig (each reads its own section). Modules are
imported only when their backend is built, so `ray` is never imported for a local pool.
"""

from __future__ import annotations

from collections.abc import Callable

from libra_core.config.pools import PoolsConfig
from libra_core.pools.base import WorkerPool

PoolFactory = Callable[[PoolsConfig], WorkerPool]

_REGISTRY: dict[str, PoolFactory] = {}


def register_pool(name: str, factory: PoolFactory) -> None:
    """Add a backend; a duplicate name is an error (two backends must not shadow each other)."""
    if name in _REGISTRY:
        raise ValueError(f"pool backend {name!r} is already registered")
    _REGISTRY[name] = factory


def pool_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def build_pool(cfg: PoolsConfig, name: str | None = None) -> WorkerPool:
    """Build (not start) the pool named `name`, by default `cfg.type`."""
    key = name or cfg.type
    factory = _REGISTRY.get(key)
    if factory is None:
        raise ValueError(f"unknown pool backend {key!r}; valid names: {', '.join(pool_names())}")
    return factory(cfg)


def _local(cfg: PoolsConfig) -> WorkerPool:
    from libra_core.pools.local import LocalPool

    return LocalPool(cfg.local)


def _ray(cfg: PoolsConfig) -> WorkerPool:
    from libra_core.pools.ray_pool import RayPool

    return RayPool(cfg.ray)


register_pool("local", _local)
register_pool("ray", _ray)
