"""Rollout throughput of the real agent loop against one vLLM instance, for engine-flag variants.

    .venv/bin/python benchmarks/rollout_throughput.py POLICY_DIR [--variant NAME ...] [--repeats 3]
        [--windows 0,0.003]

POLICY_DIR is a policy folder (e.g. `runs/<run>/policy`). Each variant starts its own engine,
runs the default iteration workload (16 problems x 8 samples, multi-turn with the calculator)
`--repeats` times per client coalescing window (0: one HTTP request per model turn), interleaved,
after one warm-up batch, and prints start-up seconds, policy tokens/s and HTTP requests per batch.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

from libra_core.config.models import LibraConfig, VllmEngineConfig
from libra_core.envs.arithmetic import ArithmeticEnv
from libra_core.pipeline.rollout_stage import load_tokenizer
from libra_core.pools.rollout import ensure_rollout_pool, stop_rollout_pool
from libra_core.rollout.agent_loop import AgentLoop, make_requests
from libra_core.rollout.client import EngineClient
from libra_core.rollout.router import static_router

# name -> (extra server arguments, OpenMP threads of the engine; 0 lets vLLM bind all cores)
VARIANTS: dict[str, tuple[tuple[str, ...], int]] = {
    "default": ((), 0),
    "eager": (("--enforce-eager",), 0),
    "one-thread": ((), 1),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("policy", type=Path)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--windows", default="0,0.003", help="client coalescing windows in seconds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cfg = LibraConfig()
    env = ArithmeticEnv(cfg.environment)
    tok = load_tokenizer(str(args.policy))
    for name in args.variant or sorted(VARIANTS):
        extra, threads = VARIANTS[name]
        engine = VllmEngineConfig(extra_args=extra, cpu_threads=threads)
        with tempfile.TemporaryDirectory() as logs:
            start = time.perf_counter()
            info = ensure_rollout_pool(
                f"bench-{name}", args.policy, engine, Path(logs), size=1, max_model_len=512, dtype="float32"
            )
            startup_s = time.perf_counter() - start
            windows = [float(w) for w in args.windows.split(",")]
            rates: dict[float, list[float]] = {w: [] for w in windows}
            posts: dict[float, list[int]] = {w: [] for w in windows}
            for rep in range(args.repeats + 1):
                for window in windows:
                    clients = [EngineClient(u, coalesce_window_s=window) for u in info.urls]
                    loop = AgentLoop(env, tok, clients, cfg.rollout, policy_version=0, iteration=1)
                    requests = make_requests(env.sample_problems(16, rep), 8, 1)
                    t0 = time.perf_counter()
                    rows = loop.run(requests, static_router())
                    wall = time.perf_counter() - t0
                    if rep:  # the first batch warms caches
                        rates[window].append(sum(sum(r["loss_mask"]) for r in rows) / wall)
                        posts[window].append(sum(c.http_requests for c in clients))
            stop_rollout_pool(f"bench-{name}")
        for window in windows:
            r = rates[window]
            print(
                f"{name:>8} window {window * 1000:4.1f} ms: startup {startup_s:5.1f}s  policy tokens/s "
                f"{statistics.mean(r):7.1f} (min {min(r):.1f}, max {max(r):.1f}, {args.repeats} batches of "
                f"128 trajectories, {statistics.mean(posts[window]):.0f} HTTP requests per batch)"
            )


if __name__ == "__main__":
    main()
