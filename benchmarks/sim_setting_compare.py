"""One policy under several simulator settings, per scenario and load: which setting plans better where.

    .venv/bin/python benchmarks/sim_setting_compare.py [--policy static-optimal] [--iterations 10]
        [--loads 32 64 128] [--scenarios r2e-gym search-r1 dapo-math] [--seed 0]
        [--variant NAME=FIELD=VALUE[,FIELD=VALUE...] ...]

`benchmarks/sim_load_sweep.py` runs every policy under one setting; this runs one policy under
several (the planner's price variants, re-ranking, ...) so a change to the planner can be judged at
every load before it becomes a default. Each `--variant` is a name, `=`, and comma-separated
`SimSettings` overrides (`default` = no change, always run first). One row per scenario and load:
per variant, tok/s and the first deployment's rollout GPUs and instances. Seed 0 by default.

e.g.  .venv/bin/python benchmarks/sim_setting_compare.py --variant one-range=one_degree_dp=false \\
          rerank=rerank_plans=4
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from libra_core.planner.specs import parse_cluster
from libra_core.sim import POLICIES, simulate, workloads
from libra_core.sim.overrides import parse_overrides
from libra_core.sim.policies import check_cluster_size, resolve_policies
from libra_core.sim.settings import SimSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import ExtendList, non_negative_int, or_stop, positive_int  # noqa: E402


def parse_variant(text: str) -> tuple[str, SimSettings]:
    """`NAME=FIELD=VALUE[,FIELD=VALUE...]` -> (NAME, settings); raises ValueError naming the problem."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"variant {text!r}: expected NAME=FIELD=VALUE[,FIELD=VALUE...]")
    return name, SimSettings(**parse_overrides(rest.split(","), SimSettings, f"--variant {name}"))


def rollout_layout(deployment: str) -> str:
    """`train 16 (...) | rollout 32 (4xTP8)` -> `32: 4xTP8` (the deployment string of the report)."""
    m = re.search(r"rollout (\d+) \(([^)]*)\)", deployment)
    return f"{m.group(1)}: {m.group(2)}" if m else deployment


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policy", default="static-optimal", choices=sorted(POLICIES))
    ap.add_argument("--iterations", type=positive_int, default=10)
    ap.add_argument(
        "--loads",
        type=positive_int,
        nargs="+",
        action=ExtendList,
        default=[32, 64, 128],
        help="prompts per iteration",
    )
    ap.add_argument(
        "--scenarios", nargs="+", action=ExtendList, default=["r2e-gym", "search-r1", "dapo-math"]
    )
    ap.add_argument("--hardware", default="48xA800")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument(
        "--variant", nargs="+", action="extend", default=[], help="NAME=FIELD=VALUE[,FIELD=VALUE...]"
    )
    args = ap.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in workloads.SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; valid: {sorted(workloads.SCENARIOS)}")
    try:
        variants = [("default", SimSettings()), *(parse_variant(v) for v in args.variant)]
        check_cluster_size(resolve_policies([args.policy]), parse_cluster(args.hardware).num_gpus)
        for sc in args.scenarios:  # each scenario at each load, as `simulate` loads it
            for load in args.loads:
                workloads.load_scenario(sc, args.iterations, args.seed, None, {"prompts_per_iteration": load})
    except ValueError as err:
        ap.error(str(err))
    names = [n for n, _ in variants]
    if len(set(names)) < len(names):
        ap.error(f"--variant names must differ from each other and from `default`, got {names}")
    print("command: .venv/bin/python benchmarks/sim_setting_compare.py " + " ".join(sys.argv[1:]))
    header = True
    for sc in args.scenarios:
        for load in args.loads:
            t0 = time.perf_counter()
            cells = []
            for _, settings in variants:
                report = or_stop(
                    simulate,
                    sc,
                    args.hardware,
                    args.iterations,
                    [args.policy],
                    seed=args.seed,
                    settings=settings,
                    spec_overrides={"prompts_per_iteration": load},
                )
                r = report.result(args.policy)
                cells.append(f"{r.tokens_per_s:,.0f} | {rollout_layout(r.first_deployment)}")
            if header:  # after the first row: a cluster too small for the model stops before it
                header = False
                print(f"\n{args.policy}, {args.hardware}, {args.iterations} iterations, seed {args.seed}")
                print(
                    "| scenario | prompts | "
                    + " | ".join(f"{n} tok/s | {n} rollout" for n, _ in variants)
                    + " | wall s |"
                )
                print("|---|---:|" + "---:|---|" * len(variants) + "---:|")
            print(
                f"| {sc} | {load} | " + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |", flush=True
            )


if __name__ == "__main__":
    main()
