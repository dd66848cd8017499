"""How much a drift-aware planner could gain: replanning on the iterations to come instead of the past.

    .venv/bin/python benchmarks/sim_future_window.py [--policies static-optimal +planning]
        [--iterations 60] [--loads 128] [--scenarios r2e-gym search-r1 dapo-math] [--seed 0]

The replanner prices its candidates on the last `window_iterations` iterations (sim/pipeline.py,
`replan`). Under drift that window lags the `replan_every` iterations the new plan will serve. This
runs each policy twice: as it is ("past"), and with an oracle window holding the trajectories of
the iterations the plan will serve ("future"; the simulator knows them, a real planner does not).
The online calibration still compares the window's price with the rollouts just measured, so the
future rows also show what mixing a forecast into that calibration costs. If "future" gains little,
pricing the drift expected before the next replan is not where the planner's gap is. One row per
scenario and load: tok/s and the plan moves (applied and reverted), per policy and window.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

from libra_core.sim import POLICIES, pipeline, simulate, workloads
from libra_core.sim.engine import Simulator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, non_negative_int, positive_int  # noqa: E402


def future_window(replan: Callable[[Simulator, int], bool]) -> Callable[[Simulator, int], bool]:
    """`replan` priced on iterations j .. j + replan_every - 1 instead of the last measured ones."""

    def wrapped(sim: Simulator, j: int) -> bool:
        past = list(sim.windows)
        ahead = range(j, min(j + sim.s.replan_every, sim.iterations))
        sim.windows[:] = [sim.workload_of(k) for k in ahead]  # replans run at j < iterations
        try:
            return replan(sim, j)
        finally:
            sim.windows[:] = past

    return wrapped


def run(policy: str, scenario: str, load: int, iterations: int, seed: int, future: bool) -> tuple[float, int]:
    """(tok/s, plan moves) of one policy on 48xA800, as `libra simulate` runs it."""
    window = (
        mock.patch.object(pipeline, "replan", future_window(pipeline.replan)) if future else nullcontext()
    )
    with window:
        report = simulate(
            scenario,
            "48xA800",
            iterations,
            [policy],
            seed=seed,
            spec_overrides={"prompts_per_iteration": load},
        )
    r = report.result(policy)
    return r.tokens_per_s, r.replans_applied


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policies", nargs="+", action=ExtendList, default=["static-optimal", "+planning"])
    ap.add_argument("--iterations", type=positive_int, default=60)
    ap.add_argument(
        "--loads",
        type=positive_int,
        nargs="+",
        action=ExtendList,
        default=[128],
        help="prompts per iteration",
    )
    ap.add_argument(
        "--scenarios", nargs="+", action=ExtendList, default=["r2e-gym", "search-r1", "dapo-math"]
    )
    ap.add_argument("--seed", type=non_negative_int, default=0)
    args = ap.parse_args(argv)
    bad = [p for p in args.policies if p not in POLICIES] + [
        s for s in args.scenarios if s not in workloads.SCENARIOS
    ]
    if bad:
        ap.error(f"unknown {bad}; policies: {sorted(POLICIES)}; scenarios: {sorted(workloads.SCENARIOS)}")
    try:  # each scenario at each load, as `simulate` loads it
        for sc in args.scenarios:
            for load in args.loads:
                workloads.load_scenario(sc, args.iterations, args.seed, None, {"prompts_per_iteration": load})
    except ValueError as err:
        ap.error(str(err))
    print("command: .venv/bin/python benchmarks/sim_future_window.py " + " ".join(sys.argv[1:]))
    print(f"\n48xA800, {args.iterations} iterations, seed {args.seed}; tok/s (plan moves)")
    cols = [f"{p} {w}" for p in args.policies for w in ("past", "future")]
    print("| scenario | prompts | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for sc in args.scenarios:
        for load in args.loads:
            cells = []
            for p in args.policies:
                for future in (False, True):
                    tok_s, moves = run(p, sc, load, args.iterations, args.seed, future)
                    cells.append(f"{tok_s:,.0f} ({moves})")
            print(f"| {sc} | {load} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
