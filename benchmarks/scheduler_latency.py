"""C-MLFQ routing-decision latency and tree memory at scale.

    .venv/bin/python benchmarks/scheduler_latency.py [--trajectories 100000] [--in-flight 10000] [--seed 0]

Builds a C-MLFQ tree from `--trajectories` finished synthetic trajectories (preset `causal`,
prompts drawn from a pool of 2,000, one policy version per iteration of 1,000 trajectories) and
measures its memory with tracemalloc (the tree's Python objects only). Then admits `--in-flight`
new requests (the next iteration) and replays their tool returns interleaved, all requests in
flight at once, timing every `admit` and `on_tool_return` call with perf_counter_ns, then finishes
them, timing every `on_finish` (an insert plus its share of the incremental pruning pass, both under
the tree lock, so the longest one bounds how long a decision can wait). Prints p50, p99 and max per
call, the `on_policy_version` time, and what one synchronous full pruning pass would cost. Target:
decision p99 under 100 microseconds.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, SchedRequest, ToolReturn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.traces.evaluate import quantile_buckets
from libra_core.traces.synthetic import PRESETS, synthetic_trajectories

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import int_at_least, positive_int  # noqa: E402

PER_ITERATION = 1000  # 125 prompts x 8 samples


def percentile(sorted_ns: list[int], q: float) -> float:
    """The `q` percentile of ascending nanoseconds, in microseconds, by nearest rank (the smallest
    sample with at least a `q` share of the samples at or below it: p99 of 100 is the 99th, not the max)."""
    rank = math.ceil(round(q * len(sorted_ns), 9))  # round: 0.07 * 100 is 7.000000000000001
    return sorted_ns[max(0, rank - 1)] / 1000.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trajectories",
        type=int_at_least(PER_ITERATION),
        default=100_000,
        help=f"finished trajectories the tree is built from (whole iterations of {PER_ITERATION:,})",
    )
    parser.add_argument("--in-flight", type=positive_int, default=10_000, help="requests admitted at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    per_iteration = PER_ITERATION
    iterations = args.trajectories // per_iteration
    gen_cfg = replace(
        PRESETS["causal"],
        num_iterations=iterations + -(-args.in_flight // per_iteration),  # whole iterations holding them
        prompts_per_iteration=125,
        prompt_pool=2000,
    )
    t0 = time.perf_counter()
    trace = synthetic_trajectories(random.Random(args.seed), gen_cfg)
    history = [t for t in trace if t.iteration < iterations]
    live = [t for t in trace if t.iteration >= iterations][: args.in_flight]
    gen_s = time.perf_counter() - t0
    bounds = quantile_buckets(history, (0.5, 0.9))
    sched = CMLFQScheduler(SchedulerConfig(type="cmlfq", buckets=bounds))

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for t in history:
        if t.iteration != sched.tree.version:
            sched.on_policy_version(t.iteration)
        sched.on_finish(
            FinishedTrajectory(
                t.trajectory_id, t.prompt_id, t.prompt_tokens, t.iteration, t.iteration, t.turns
            )
        )
    build_s = time.perf_counter() - t0
    gc.collect()
    tree_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    t0 = time.perf_counter()
    sched.on_policy_version(iterations)  # ages and prunes the tree, as at the start of an iteration
    version_ms = (time.perf_counter() - t0) * 1000

    requests = [SchedRequest(t.trajectory_id, t.prompt_id, t.prompt_tokens, iterations) for t in live]
    admit_ns: list[int] = []
    tool_ns: list[int] = []
    clock = time.perf_counter_ns
    for req in requests:
        start = clock()
        sched.admit(req)
        admit_ns.append(clock() - start)
    assert sched.in_flight() == len(requests)
    context = [t.prompt_tokens for t in live]
    for turn_index in range(max(len(t.turns) for t in live)):
        for k, (t, req) in enumerate(zip(live, requests, strict=True)):
            if turn_index >= len(t.turns) - 1:
                continue
            turn = t.turns[turn_index]
            context[k] += turn.gen_tokens + turn.payload_tokens
            assert turn.tool is not None and turn.status is not None
            ret = ToolReturn(
                turn_index, turn.gen_tokens, turn.tool, turn.payload_tokens, turn.status, context[k]
            )
            start = clock()
            sched.on_tool_return(req, ret)
            tool_ns.append(clock() - start)

    print(f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"generated {len(trace)} synthetic trajectories in {gen_s:.1f} s; buckets {bounds}")
    print(
        f"tree: {len(history)} trajectories, {iterations} policy versions, {sched.tree.num_nodes()} nodes "
        f"({len(sched.tree.prompts)} prompts), built in {build_s:.1f} s under tracemalloc, "
        f"memory {tree_bytes / 2**20:.1f} MiB ({tree_bytes / len(history):.0f} B per trajectory)"
    )
    print(f"on_policy_version (moves the clock; aging is lazy): {version_ms:.3f} ms")
    print(f"in flight: {sched.in_flight()} requests")
    for name, samples in (
        ("admit", admit_ns),
        ("on_tool_return", tool_ns),
        ("all decisions", admit_ns + tool_ns),
    ):
        s = sorted(samples)
        print(
            f"{name:>15}: n={len(s):>6}  p50={percentile(s, 0.5):6.1f} us  "
            f"p99={percentile(s, 0.99):6.1f} us  mean={statistics.fmean(s) / 1000:6.1f} us  "
            f"max={s[-1] / 1000:8.1f} us"
        )
    print(f"decision counters: {sched.counters}")

    finish_ns: list[int] = []
    for t in live:
        done = FinishedTrajectory(
            t.trajectory_id, t.prompt_id, t.prompt_tokens, iterations, iterations, t.turns
        )
        start = clock()
        sched.on_finish(done)
        finish_ns.append(clock() - start)
    s = sorted(finish_ns)
    print(
        f"{'on_finish':>15}: n={len(s):>6}  p50={percentile(s, 0.5):6.1f} us  "
        f"p99={percentile(s, 0.99):6.1f} us  mean={statistics.fmean(s) / 1000:6.1f} us  "
        f"max={s[-1] / 1000:8.1f} us  (insert + {sched.cfg.prune_nodes_per_insert} pruning checks)"
    )
    sched.on_policy_version(iterations + 1)
    t0 = time.perf_counter()
    dropped = sched.tree.prune()
    print(
        f"one full synchronous pruning pass for comparison: {(time.perf_counter() - t0) * 1000:.0f} ms "
        f"({dropped} subtrees dropped; {sched.tree.num_nodes()} nodes left)"
    )


if __name__ == "__main__":
    main()
