"""How much flooring every optimizer step at the iteration's longest sequence over-priced training
(the price until 2026-12-07), against the step-by-step floor (`planner/step_longest.py`).

Usage: python benchmarks/train_step_floor.py [--model qwen3-8b] [--hardware A800] [--dp 8 64 1024]
    [--tp 1]

Per workload preset (seed 0) and DP degree (TP `--tp`, PP1): a rank's expected work in one step, the
old floor's over the new, the whole update's estimated seconds both ways, and its TP all-reduce
seconds both ways (the micro-batches' tokens follow the step's longest too, since 2026-12-07).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra_core.planner.presets import PRESETS, workload_preset  # noqa: E402
from libra_core.planner.specs import get_hardware, get_model  # noqa: E402
from libra_core.planner.train_cost import TrainLayout, TrainShape, estimate_train, rank_step_flops  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--hardware", default="A800")
    ap.add_argument("--dp", type=int, nargs="+", default=[8, 64, 1024])
    ap.add_argument("--tp", type=int, default=1)
    args = ap.parse_args()
    model, hw = get_model(args.model), get_hardware(args.hardware)
    print(f"model {model.name}, {hw.name}, TP{args.tp} PP1 ZeRO-1")
    print(
        "| workload | DP | rank work: old / per-step floor | update s (per-step floor) | update s (old) "
        "| TP comm s (per-step) | TP comm s (old) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in PRESETS:
        shape = TrainShape.from_workload(workload_preset(name, 0))
        old = TrainShape(shape.tokens, shape.sum_sq_len, shape.max_seq_len, shape.minibatches)
        for dp in args.dp:
            layout = TrainLayout(args.tp, 1, dp, zero_stage=1)
            ratio = rank_step_flops(model, old, layout) / rank_step_flops(model, shape, layout)
            new, was = estimate_train(model, hw, layout, shape), estimate_train(model, hw, layout, old)
            print(
                f"| {name} | {dp} | {ratio:.3f} | {new.time_s:.2f} | {was.time_s:.2f} "
                f"| {new.tp_comm_s:.2f} | {was.tp_comm_s:.2f} |"
            )


if __name__ == "__main__":
    main()
