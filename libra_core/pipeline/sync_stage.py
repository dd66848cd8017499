"""Sync stage: push the updated policy to every rollout instance.

For each instance: pause (keeping in-flight requests), reload weights in place from the policy
folder, drop the prefix cache (its KV was computed with the old weights), resume. In-flight
requests are not drained or discarded: they continue on the new weights after the resume (the
interruptible rollout of the async pipeline), and the pool's served version advances, so turns
that start afterwards are labelled with the new version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from libra_core.pools.rollout import live_pool, set_served_version
from libra_core.rollout.client import EngineClient


@dataclass(frozen=True)
class SyncResult:
    instances: int
    wall_s: float


def sync_weights(urls: tuple[str, ...], policy_dir: str, *, timeout_s: float = 120.0) -> SyncResult:
    start = time.perf_counter()
    for url in urls:
        EngineClient(url, timeout_s=timeout_s).swap_weights(policy_dir)
    return SyncResult(len(urls), time.perf_counter() - start)


def sync_pool(pool_id: str, policy_dir: str, version: int, *, timeout_s: float = 120.0) -> SyncResult:
    """Sync every live instance of a rollout pool to the policy folder, which holds `version`."""
    result = sync_weights(live_pool(pool_id).urls, policy_dir, timeout_s=timeout_s)
    set_served_version(pool_id, version)
    return result
