"""Worker-pool and Elastic Hybrid Pool settings (the `pools:` section of stages.yaml).

`pools.type` picks the pool backend that libra_core/pools/registry.py `build_pool` builds for code
(`local` subprocesses on this machine, or `ray` actors on a Ray cluster); `pools.local` and
`pools.ray` hold each backend's settings. A run reads neither by `pools.type`: it refuses
`pools.type: ray` and any `pools.ray` value but the defaults (no flow builds a Ray pool yet), and
uses `pools.local` only in the async pipeline, for its trainer process (libra_core/pools/trainer.py;
the sync pipeline updates in the flow's process). `pools.elastic` describes how hybrid workers join
core training (libra_core/elastic; the rules are in docs/elastic.md); no flow builds the gateway
from it yet, so a run refuses any value but the defaults (config/cross_field.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from libra_core.config.base import Frozen

PoolType = Literal["local", "ray"]


class LocalPoolConfig(Frozen):
    """Subprocess workers on this machine, each addressable by id (the embedded default).

    A run reads it only in the async pipeline, for the trainer process its update runs in
    (libra_core/pools/trainer.py); the sync pipeline updates in the flow's process and starts no
    such pool. Code that builds a pool with libra_core.pools.registry.build_pool reads it too."""

    start_method: Literal["spawn", "forkserver"] = Field(
        "spawn", description="multiprocessing start method; spawn never inherits threads or locks."
    )
    threads_per_worker: int = Field(
        1,
        ge=1,
        description="torch/OMP intra-op threads set in each worker before it runs anything. Not the "
        "run's trainer process: that one uses training.threads (0 in the async pipeline: half the "
        "cores), which the update also sets in it; this applies to pools built from the config in "
        "code (libra_core.pools.registry.build_pool).",
    )
    start_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Give up if a worker has not answered by then (in a run: the async pipeline's "
        "trainer process).",
    )


class RayPoolConfig(Frozen):
    """Ray actors, one per worker, with explicit resource requests (multi-node pools).

    Read only by code that builds a pool with libra_core.pools.registry.build_pool: a run refuses
    `pools.type: ray`, and any value here but these defaults rather than ignore it."""

    address: str | None = Field(
        None, description="Ray cluster address (e.g. `auto`); null starts a local cluster in-process."
    )
    num_cpus_per_worker: float = Field(1.0, ge=0, description="CPU resource request of each actor.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPU resource request of each actor.")
    local_num_cpus: int = Field(
        2, ge=1, description="CPUs given to a local cluster started when `address` is null."
    )
    namespace: str = Field("libra", min_length=1, description="Ray namespace the actors live in.")
    start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long a resize waits for new actors to answer; an actor the cluster cannot "
        "place (e.g. a GPU request on a CPU cluster) fails the resize instead of waiting forever.",
    )


class ElasticConfig(Frozen):
    """Elastic Hybrid Pool: hybrid replicas that join and leave data-parallel training.

    Not read by the experiment flow yet (code passes the matching `Gateway` constructor arguments:
    `deadline_s`, `host`, `port`, `max_frame_bytes`, `update_log_steps`), so a run refuses any value
    but these defaults rather than ignore it."""

    payload_deadline_s: float = Field(
        5.0,
        gt=0,
        description="How long core rank 0 waits for an active hybrid's gradient after its own is ready; "
        "a hybrid that misses it is left out of that step (and of the divisor) and evicted.",
    )
    host: str = Field("127.0.0.1", description="Interface the side-channel gateway on core rank 0 binds to.")
    port: int = Field(0, ge=0, le=65535, description="Side-channel port; 0 picks a free port.")
    max_frame_mib: int = Field(
        1024,
        ge=1,
        description="Largest side-channel frame accepted, in MiB. A hybrid's gradient and each "
        "published update travel as one frame, so this must exceed 4 B (float32) or 8 B (float64) "
        "per parameter; the join snapshot is sent in parts and is not limited by it.",
    )
    update_log_steps: int = Field(
        64,
        ge=2,
        description="Averaged updates kept on rank 0 so a joining hybrid can replay from its snapshot; "
        "a join is served only a snapshot taken within the last update_log_steps // 2 steps (so at "
        "least 2: with 1 no snapshot is ever fresh and no join can succeed). Kept in host memory "
        "while a hybrid is joining, training or leaving: update_log_steps x the gradient's bytes.",
    )


class PoolsConfig(Frozen):
    """Worker-pool backends and the Elastic Hybrid Pool (the `pools:` section)."""

    type: PoolType = Field(
        "local",
        description="Worker-pool backend build_pool builds: local | ray. A run refuses ray (its flow "
        "runs the trainer in a local pool).",
    )
    local: LocalPoolConfig = Field(
        default_factory=LocalPoolConfig,
        description="Local subprocess pool; in a run, the async pipeline's trainer process only.",
    )
    ray: RayPoolConfig = Field(
        default_factory=RayPoolConfig,
        description="Ray actor pool, for code; a run refuses any value but the defaults.",
    )
    elastic: ElasticConfig = Field(
        default_factory=ElasticConfig,
        description="Elastic Hybrid Pool gateway; a run refuses any value but the defaults.",
    )
