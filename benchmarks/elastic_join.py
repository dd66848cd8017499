"""Elastic Hybrid Pool: time for a hybrid to join and to leave, and the core's step time with and
without a join in progress (the join must not stall the core).

    .venv/bin/python benchmarks/elastic_join.py [--steps 12] [--hidden 256] [--rounds 2]

A local pool of 3 single-thread workers: K=2 core ranks (gloo all-reduce) and one hybrid that joins
through a plan (plan_switches -> apply_switches), becomes active at a step boundary, and leaves on
the next plan. Core steps are driven back to back, so a stall would show up as a longer step.
Figures are medians over rounds; everything runs on this machine's CPUs.
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import sys
import time
from pathlib import Path

from libra_core.elastic import toy
from libra_core.elastic.membership import Role
from libra_core.elastic.plan import apply_switches, plan_switches
from libra_core.elastic.state_machine import HybridState
from libra_core.elastic.toy import ToyPoolController, ToyProblem
from libra_core.pools.local import LocalPool

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int, summary  # noqa: E402

ROLES = {"w0": Role.CORE_TRAINING, "w1": Role.CORE_TRAINING, "w2": Role.HYBRID}


def _init_method() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _step(pool: LocalPool) -> dict:
    futures = [pool.submit(w, toy.core_step) for w in ("w0", "w1")]
    return [f.result(timeout=120) for f in futures][0]


def _states(pool: LocalPool) -> dict[str, HybridState]:
    return {w: HybridState(s) for w, s in pool.run("w0", toy.core_states, timeout_s=30).items()}


def one_round(pool: LocalPool, problem: ToyProblem, steps: int) -> dict[str, float]:
    key = secrets.token_bytes(32)
    init = _init_method()
    futures = [
        pool.submit(w, toy.core_start, problem, r, 2, init, key=key, deadline_s=10.0)
        for r, w in enumerate(("w0", "w1"))
    ]
    address = futures[0].result(timeout=120)
    futures[1].result(timeout=120)
    assert address is not None
    controller = ToyPoolController(pool, problem, address, key, shards={"w2": 2})

    # A hybrid is a live rollout worker: torch is already imported there, as it is on a real one.
    pool.run("w2", toy.warm_up, timeout_s=120)
    baseline = [_step(pool)["step_s"] for _ in range(steps)]

    # Join: issue the plan, keep stepping until the hybrid is counted in a step.
    t_join = time.perf_counter()
    apply_switches(plan_switches(ROLES, _states(pool), 3), controller)
    during: list[float] = []
    while True:
        report = _step(pool)
        if "w2" in report["included"]:
            join_s = time.perf_counter() - t_join
            join_steps = len(during)
            active = [report["step_s"]]
            break
        during.append(report["step_s"])
        loop = controller.loops["w2"]
        if loop.done():
            raise RuntimeError(f"hybrid loop ended before activation: {loop.exception() or loop.result()}")
        assert time.perf_counter() - t_join < 120, "the hybrid did not become active within 120 s"
    active += [_step(pool)["step_s"] for _ in range(steps - 1)]

    # Leave: issue the plan, step until the divisor is back to K and the hybrid's loop has returned.
    t_leave = time.perf_counter()
    apply_switches(plan_switches(ROLES, _states(pool), 2), controller)
    while _step(pool)["divisor"] != 2:
        pass
    hybrid = controller.loops["w2"].result(timeout=120)
    leave_s = time.perf_counter() - t_leave
    for w in ("w0", "w1"):
        pool.run(w, toy.core_stop, timeout_s=60)
    return {
        "core_step_ms_idle": 1e3 * statistics.median(baseline),
        "core_step_ms_join_in_progress": 1e3 * statistics.median(during) if during else float("nan"),
        "core_step_ms_max_join_in_progress": 1e3 * max(during) if during else float("nan"),
        "core_step_ms_with_hybrid": 1e3 * statistics.median(active),
        "join_s": join_s,
        "join_steps": join_steps,
        "hybrid_snapshot_load_s": hybrid["load_s"],
        "leave_s": leave_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--steps", type=positive_int, default=12, help="core steps per phase")
    parser.add_argument(
        "--hidden", type=positive_int, default=256, help="MLP width (sets step cost and snapshot size)"
    )
    parser.add_argument("--rounds", type=positive_int, default=2, help="join/leave rounds (fresh core each)")
    args = parser.parse_args(argv)  # checked before the worker pool starts
    problem = ToyProblem(in_dim=64, hidden=args.hidden, depth=3, batch=256, grad_clip=1.0)
    numel = sum(p.numel() for p in problem.model().parameters())
    pool = LocalPool()
    t0 = time.perf_counter()
    start = pool.start(3)
    print(f"pool: 3 local workers started in {start.duration_s:.2f} s; model {numel} params (float64)")
    try:
        rounds = [one_round(pool, problem, args.steps) for _ in range(args.rounds)]
    finally:
        pool.stop()
    print(f"{'metric':36s} " + " ".join(f"round{i:<6d}" for i in range(len(rounds))) + " median")
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        print(f"{name:36s} " + " ".join(f"{v:<11.3f}" for v in values) + f" {statistics.median(values):.3f}")
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
