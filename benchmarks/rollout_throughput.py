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
import sys
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import comma_list, folder_problem, non_negative_float, positive_int  # noqa: E402

# name -> (extra server arguments, OpenMP threads of the engine; 0 lets vLLM bind all cores)
VARIANTS: dict[str, tuple[tuple[str, ...], int]] = {
    "default": ((), 0),
    "eager": (("--enforce-eager",), 0),
    "one-thread": ((), 1),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", type=Path, help="a policy folder (e.g. runs/<run>/policy)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed batches per window")
    parser.add_argument(
        "--windows",
        type=comma_list(non_negative_float),
        default="0,0.003",
        help="client coalescing windows in seconds, comma-separated",
    )
    args = parser.parse_args(argv)
    problem = folder_problem(args.policy, ["config.json"], "policy folder")
    if problem:
        parser.error(problem)
    logging.basicConfig(level=logging.WARNING)
    cfg = LibraConfig()
    env = ArithmeticEnv(cfg.environment)
    tok = load_tokenizer(str(args.policy))
    for name in args.variant or sorted(VARIANTS):
        extra, threads = VARIANTS[name]
        engine = VllmEngineConfig(extra_args=extra, cpu_threads=threads)
        with tempfile.TemporaryDirectory() as logs:
            try:  # an interrupt or a failed start must not leave the engine running
                start = time.perf_counter()
                info = ensure_rollout_pool(
                    f"bench-{name}",
                    args.policy,
                    engine,
                    Path(logs),
                    size=1,
                    max_model_len=512,
                    dtype="float32",
                )
                startup_s = time.perf_counter() - start
                windows = list(dict.fromkeys(args.windows))  # each window once
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
            finally:
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
