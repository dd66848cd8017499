"""Sync stage: push the updated policy to every rollout instance.

For each instance: pause (keeping in-flight requests), reload weights in place from the policy
folder, drop the prefix cache (its KV was computed with the old weights), resume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from libra_core.rollout.client import EngineClient


@dataclass(frozen=True)
class SyncResult:
    instances: int
    wall_s: float


def sync_weights(urls: tuple[str, ...], policy_dir: str, *, timeout_s: float = 120.0) -> SyncResult:
    start = time.perf_counter()
    for url in urls:
        client = EngineClient(url, timeout_s=timeout_s)
        client.pause(mode="keep")
        try:
            client.reload_weights(policy_dir)
            client.reset_prefix_cache()
        finally:
            client.resume()
    return SyncResult(len(urls), time.perf_counter() - start)
