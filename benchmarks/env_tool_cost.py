"""What the environments' sandbox, tools and services cost here: the first table of "Measured here"
in docs/environments.md, each row measured through the API the environments call.

    .venv/bin/python benchmarks/env_tool_cost.py [--data ../shared/data] [--runs 20] [--calls 1000]
        [--search-calls 60] [--mbpp 20] [--math 500] [--cpu-time-s 3] [--wall-time-s 6] [--json PATH]

Rows, in the order they run:
- `print(1)` through `Sandbox.run_python`, `--runs` times per isolation (`namespaces`, `rlimits`),
  after one untimed run each; `namespaces` is reported unavailable where it cannot be created.
- `while True: pass` under `--cpu-time-s`/`--wall-time-s` (isolation `auto`): status, reason, wall.
- `--calls` calculator calls through `MathToolsEnv.run_tool` (GSM8K-style expressions, in turn).
- The search environment's build (`build_environment`: passages, generated questions), then its
  service's start (`SearchEnv.service_url`: a process loads the passages, builds the BM25 index and
  binds a port), then `--search-calls` `SearchEnv.run_tool` calls with the default `latency_ms` and
  k, each on a generated 'which article' question (seed 0; repeated when more calls than questions).
- `CodeEnv.reward` on the first `--mbpp` MBPP reference solutions (tests run in the sandbox).
- `MathToolsEnv.reward` on the first `--math` MATH-500 answers, each boxed as its own final answer
  (through the answer worker, whose start is included in the total).
Prints a Markdown table, the command line and `uptime`'s load average; `--json` also writes the
figures to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libra_core.config.environments import CodeEnvConfig, MathToolsEnvConfig, SandboxConfig, SearchEnvConfig
from libra_core.envs.base import TurnAction
from libra_core.envs.registry import build_environment
from libra_core.envs.sandbox import Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import (  # noqa: E402
    atomic_write_text,
    folder_problem,
    output_file_problem,
    positive_float,
    positive_int,
    summary,
)

REPO = Path(__file__).resolve().parents[1]
MBPP, MATH500 = "code/mbpp.jsonl", "math/math500_test.jsonl"
PASSAGES = SearchEnvConfig.model_fields["passages_file"].default
CALCULATOR_EXPRESSIONS = ("48/2", "(48+24)/2", "0.2*50", "1,000*3", "12*7+5", "2**10", "100-37", "7%3")


def quantile(values: list[float], q: float) -> float:
    """The `q` quantile by nearest rank (p90 of 20 values is the 18th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(q * len(ordered), 9)) - 1)]


def sandbox_print(isolation: str, runs: int) -> dict[str, Any]:
    try:
        sandbox = Sandbox(SandboxConfig(isolation=isolation))  # type: ignore[arg-type]
    except RuntimeError as err:  # namespaces need root and unshare
        return {"isolation": isolation, "unavailable": str(err)}
    sandbox.run_python("print(1)")  # untimed: the first run pays for cold caches
    walls, ok = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        result = sandbox.run_python("print(1)")
        walls.append(time.perf_counter() - t0)
        ok += result.status == "success" and result.stdout == "1\n"
    ms = [1000 * w for w in walls]
    return {
        "isolation": sandbox.isolation,
        "runs": runs,
        "ok": ok,
        "median_ms": statistics.median(ms),
        "p90_ms": quantile(ms, 0.9),
    }


def sandbox_spin(cpu_time_s: int, wall_time_s: float) -> dict[str, Any]:
    sandbox = Sandbox(SandboxConfig(cpu_time_s=cpu_time_s, wall_time_s=wall_time_s))
    result = sandbox.run_python("while True: pass")
    return {
        "isolation": result.isolation,
        "cpu_time_s": cpu_time_s,
        "wall_time_s": wall_time_s,
        "status": result.status,
        "reason": result.reason,
        "wall_s": result.wall_s,
    }


def calculator(env: Any, calls: int) -> dict[str, Any]:
    micros, ok = [], 0
    for i in range(calls):
        action = TurnAction("tool_call", tool="calculator", arguments=CALCULATOR_EXPRESSIONS[i % 8])
        t0 = time.perf_counter_ns()
        result = env.run_tool(action)
        micros.append((time.perf_counter_ns() - t0) / 1000)
        ok += result.status == "success"
    return {"calls": calls, "ok": ok, "median_us": statistics.median(micros), "p90_us": quantile(micros, 0.9)}


def search(data: str, calls: int) -> dict[str, Any]:
    cfg = SearchEnvConfig(type="search", data_dir=data)
    t0 = time.perf_counter()
    env: Any = build_environment(cfg)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.service_url()
    start_s = time.perf_counter() - t0
    generated = [p for p in env.problems if p.prompt_id.startswith("title")]
    questions = random.Random(0).sample(generated, min(calls, len(generated)))
    ms, sizes, ok = [], [], 0
    for i in range(calls):
        action = TurnAction("tool_call", tool="search", arguments=questions[i % len(questions)].question)
        t0 = time.perf_counter()
        result = env.run_tool(action)
        ms.append(1000 * (time.perf_counter() - t0))
        sizes.append(len(result.observation))
        ok += result.status == "success"
    return {
        "passages": len(env.passages),
        "build_s": build_s,
        "start_s": start_s,
        "calls": calls,
        "questions": len(questions),
        "ok": ok,
        "latency_ms": list(cfg.latency_ms),
        "k": cfg.top_k,
        "median_ms": statistics.median(ms),
        "p90_ms": quantile(ms, 0.9),
        "payload_min": min(sizes),
        "payload_median": statistics.median(sizes),
        "payload_max": max(sizes),
    }


def code_reward(env: Any, n: int) -> dict[str, Any]:
    references = {p.prompt_id: p.reference_answer for p in env.sample_problems(len(env.records), 0)}
    records = [r for r in env.records if r.solution][:n]
    t0 = time.perf_counter()
    passed = sum(env.reward(references[r.id], r.solution) == env.cfg.reward.correct for r in records)
    return {"problems": len(records), "passed": passed, "total_s": time.perf_counter() - t0}


def math_reward(env: Any, n: int) -> dict[str, Any]:
    records = env.records[:n]
    t0 = time.perf_counter()
    correct = sum(env.reward(r.answer, f"\\boxed{{{r.answer}}}") == env.cfg.reward.correct for r in records)
    return {"answers": len(records), "correct": correct, "total_s": time.perf_counter() - t0}


def _spread(r: dict[str, Any], unit: str) -> str:
    return f"median {r[f'median_{unit}']:.0f} {unit}, p90 {r[f'p90_{unit}']:.0f} {unit}"


def table(res: dict[str, Any]) -> list[str]:
    """The Markdown table: the rows of docs/environments.md's, in its order, with this run's counts."""
    rows = []
    for what, r in (
        ("namespaces` (unshare + mounts + fork + exec)", res["sandbox_namespaces"]),
        ("rlimits`", res["sandbox_rlimits"]),
    ):
        ran = f"unavailable ({r.get('unavailable')})"
        if "unavailable" not in r:
            ran = f"{_spread(r, 'ms')} ({r['runs']} runs, {r['ok']} printed 1)"
        rows.append((f"one sandboxed `print(1)`, `{what}", ran))
    s, c, q = res["spin"], res["calculator"], res["search"]
    limits = f"`cpu_time_s={s['cpu_time_s']}`, `wall_time_s={s['wall_time_s']:g}`"
    ended = f"`{s['status']}` ({s['reason']}) after {s['wall_s']:.1f} s wall ({s['isolation']})"
    rows.append((f"`while True: pass` with {limits}", ended))
    rows.append(("calculator call", f"{_spread(c, 'us')} ({c['calls']:,} calls, {c['ok']:,} success)"))
    loaded = f"load {q['passages']:,} passages, BM25 index, bind port"
    rows.append(
        (f"search service start ({loaded})", f"{q['start_s']:.2f} s; environment build {q['build_s']:.2f} s")
    )
    lo, hi = q["latency_ms"]
    asked = f"default `latency_ms` {lo:g}-{hi:g}, k={q['k']}, {q['questions']} generated questions"
    payload = f"payload {q['payload_min']}-{q['payload_max']} characters (median {q['payload_median']:.0f})"
    rows.append((f"search call ({asked})", f"{_spread(q, 'ms')}; {payload}; {q['ok']}/{q['calls']} success"))
    m, a = res["code_reward"], res["math_reward"]
    rows.append(
        (
            f"code reward: {m['problems']} MBPP reference solutions through the sandbox",
            f"{m['passed']}/{m['problems']} pass, {m['total_s']:.1f} s total",
        )
    )
    rows.append(
        (
            f"math reward: {a['answers']} MATH-500 answers verified against themselves",
            f"{a['correct']}/{a['answers']}, {a['total_s']:.1f} s total (with the answer worker's start)",
        )
    )
    return ["| what | figure |", "|---|---|", *(f"| {what} | {figure} |" for what, figure in rows)]


def _data_folder(path: Path) -> Path:
    """A relative `--data` as the environments' `data_dir` resolves it: the repository root first."""
    if path.is_absolute() or not (REPO / path).is_dir():
        return path.absolute()
    return (REPO / path).resolve()


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=summary(__doc__))
    ap.add_argument(
        "--data", type=Path, default=Path("../shared/data"), metavar="DIR", help="the shared data folder"
    )
    ap.add_argument(
        "--runs", type=positive_int, default=20, metavar="N", help="timed sandbox runs per isolation"
    )
    ap.add_argument("--calls", type=positive_int, default=1000, metavar="N", help="calculator calls")
    ap.add_argument("--search-calls", type=positive_int, default=60, metavar="N", help="search calls")
    ap.add_argument(
        "--mbpp", type=positive_int, default=20, metavar="N", help="MBPP reference solutions checked"
    )
    ap.add_argument("--math", type=positive_int, default=500, metavar="N", help="MATH-500 answers checked")
    ap.add_argument(
        "--cpu-time-s", type=positive_int, default=3, metavar="S", help="CPU limit of the endless loop"
    )
    ap.add_argument(
        "--wall-time-s", type=positive_float, default=6.0, metavar="S", help="wall limit of the endless loop"
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.json is not None and (problem := output_file_problem(args.json)):
        ap.error(f"--json {problem}")
    data = _data_folder(args.data)
    if problem := folder_problem(data, needs=[MBPP, MATH500, PASSAGES], what="data folder"):
        ap.error(f"--data {problem}")
    if args.cpu_time_s > 600 or args.wall_time_s > 600:
        ap.error("--cpu-time-s and --wall-time-s must be at most 600 (SandboxConfig's limits)")
    try:
        math_env: Any = build_environment(
            MathToolsEnvConfig(type="math_tools", data_dir=str(data), files=(MATH500,))
        )
        code_env: Any = build_environment(CodeEnvConfig(type="code", data_dir=str(data), files=(MBPP,)))
    except (ValueError, OSError) as err:  # a record the loaders reject
        ap.error(f"--data {data}: {err}")
    with_solution = sum(bool(r.solution) for r in code_env.records)
    limits = (
        ("--mbpp", args.mbpp, with_solution, MBPP),
        ("--math", args.math, len(math_env.records), MATH500),
    )
    for flag, wanted, have, what in limits:
        if wanted > have:
            ap.error(f"{flag} {wanted}: {data / what} holds only {have}")

    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("sandbox_namespaces", lambda: sandbox_print("namespaces", args.runs)),
        ("sandbox_rlimits", lambda: sandbox_print("rlimits", args.runs)),
        ("spin", lambda: sandbox_spin(args.cpu_time_s, args.wall_time_s)),
        ("calculator", lambda: calculator(math_env, args.calls)),
        ("search", lambda: search(str(data), args.search_calls)),
        ("code_reward", lambda: code_reward(code_env, args.mbpp)),
        ("math_reward", lambda: math_reward(math_env, args.math)),
    ]
    load_before = _load_average()
    t0 = time.perf_counter()
    results: dict[str, Any] = {name: step() for name, step in steps}
    given = sys.argv[1:] if argv is None else argv
    results |= {
        "command": " ".join([".venv/bin/python", "benchmarks/env_tool_cost.py", *given]),
        "total_s": time.perf_counter() - t0,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "cpus": os.cpu_count(),
    }
    print("\n".join(table(results)))
    print(f"\n{results['command']}")
    print(
        f"{results['total_s']:.0f} s; load average (1, 5, 15 min) before {load_before}, after "
        f"{results['load_average_after']}; {results['cpus']} CPUs"
    )
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
