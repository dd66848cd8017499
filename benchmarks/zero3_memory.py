"""ZeRO-3's gathered unit (`planner/memory.zero3_gathered_bytes`) per built-in model and TP degree,
and one layout's memory with and without it.

Usage: python benchmarks/zero3_memory.py [--tp 1 2 4] [--layout qwen3-30b-a3b:H100:2:4:recompute]

The layout is MODEL:GPU:TP:DP[:recompute] under ZeRO-3 at PP1 EP1, priced on the swe-longtail
preset (seed 0) as the planner prices it (`train_cost.estimate_train`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra_core.planner.memory import zero3_gathered_bytes  # noqa: E402
from libra_core.planner.presets import workload_preset  # noqa: E402
from libra_core.planner.specs import get_hardware, get_model, model_specs  # noqa: E402
from libra_core.planner.train_cost import TrainLayout, TrainShape, estimate_train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--layout", default="qwen3-30b-a3b:H100:2:4:recompute")
    args = ap.parse_args()
    print("| model | " + " | ".join(f"TP{t} GB" for t in args.tp) + " |")
    print("|---|" + "---:|" * len(args.tp))
    for name, model in model_specs().items():
        cells = [f"{zero3_gathered_bytes(model, tp, 1) / 1e9:.2f}" for tp in args.tp]
        print(f"| {name} | " + " | ".join(cells) + " |")
    name, gpu, tp, dp, *rest = args.layout.split(":")
    model, hw = get_model(name), get_hardware(gpu)
    shape = TrainShape.from_workload(workload_preset("swe-longtail", 0))
    est = estimate_train(model, hw, TrainLayout(int(tp), 1, int(dp), 1, 3, "recompute" in rest), shape)
    total, gathered = est.memory.total_bytes, est.memory.gathered_bytes
    print(
        f"{args.layout} ZeRO-3 on swe-longtail: {total / 1e9:.1f} GB with the gathered unit "
        f"({gathered / 1e9:.2f} GB), {(total - gathered) / 1e9:.1f} GB without; {hw.name} holds "
        f"{hw.mem_bytes / 1e9:.1f} GB"
    )


if __name__ == "__main__":
    main()
