"""Error of the planner's cost model against the Vidur operator profiles, per operator kind and GPU.

Usage:
    python benchmarks/cost_model_error.py [--profiles ../shared/data/profiles] [--fit] [--by op]

Predictions use the efficiency factors in libra_core/planner/hardware.yaml (A100-80G for the
A100 profiles, H100 for the H100 ones). `--fit` also grid-searches the factors on the profiles and
prints them next to the shipped ones, with the error the fitted factors would give.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra_core.planner.calibration import (  # noqa: E402
    COMPUTE_PROFILES,
    NETWORK_PROFILES,
    ErrorRow,
    OpSample,
    error_rows,
    fit_compute,
    fit_network,
    load_compute_samples,
    load_network_samples,
)
from libra_core.planner.specs import get_hardware  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem  # noqa: E402

DEFAULT_PROFILES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiles"
SPEC_FOR = {"A100": "A100-80G", "H100": "H100"}
LARGE_MESSAGE_BYTES = 16 * 2**20


def print_table(title: str, rows: list[ErrorRow]) -> None:
    print(f"\n{title}")
    print("| GPU  | operator kind          | samples | mean APE | median APE | p90 APE | median pred/meas |")
    print("|------|------------------------|--------:|---------:|-----------:|--------:|-----------------:|")
    for r in rows:
        print(
            f"| {r.gpu:<4} | {r.kind:<22} | {r.samples:>7} | {r.mean_ape:>7.1%} | {r.median_ape:>9.1%} "
            f"| {r.p90_ape:>6.1%} | {r.bias:>16.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES, help="Vidur profiles folder")
    parser.add_argument("--fit", action="store_true", help="also fit the efficiency factors")
    parser.add_argument("--by", choices=["kind", "op"], default="kind", help="group rows by kind or operator")
    args = parser.parse_args(argv)
    needed = [
        rel for table in (COMPUTE_PROFILES, NETWORK_PROFILES) for rels in table.values() for rel in rels
    ]
    problem = folder_problem(args.profiles, needed, "Vidur profiles folder")
    if problem:
        parser.error(f"--profiles {problem}")
    rows: list[ErrorRow] = []
    large_rows: list[ErrorRow] = []
    fitted_rows: list[ErrorRow] = []
    for gpu, spec_name in SPEC_FOR.items():
        hw = get_hardware(spec_name)
        compute: list[OpSample] = []
        for rel in COMPUTE_PROFILES[gpu]:
            compute += load_compute_samples(args.profiles / rel)
        network: list[OpSample] = []
        for rel in NETWORK_PROFILES[gpu]:
            network += load_network_samples(args.profiles / rel)
        rows += error_rows(gpu, hw, compute + network, by=args.by)
        large = [s for s in network if s.bytes_moved >= LARGE_MESSAGE_BYTES]
        large_rows += error_rows(gpu, hw, large, by=args.by)
        if args.fit:
            t0 = time.perf_counter()
            fit = fit_network(fit_compute(hw, compute), network)
            keys = [
                "gemm_compute_eff",
                "mem_bw_eff",
                "op_overhead_us",
                "elementwise_bw_eff",
                "elementwise_overhead_us",
                "intra_allreduce_eff",
                "intra_latency_us",
                "intra_p2p_eff",
                "intra_p2p_latency_us",
                "inter_allreduce_eff",
                "inter_latency_us",
            ]
            print(f"{gpu} ({spec_name}) fit in {time.perf_counter() - t0:.1f}s:")
            for k in keys:
                print(f"  {k:<22} shipped {getattr(hw, k):>7} fitted {getattr(fit, k):>7}")
            fitted_rows += error_rows(gpu, fit, compute + network, by=args.by)
    print_table("Error with the shipped factors (hardware.yaml)", rows)
    print_table("Collectives with messages >= 16 MiB (DP gradient sync, weight broadcast)", large_rows)
    if args.fit:
        print_table("Error with the freshly fitted factors", fitted_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
