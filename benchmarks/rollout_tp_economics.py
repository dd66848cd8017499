"""What the rollout cost model says one GPU gets from each TP degree, and what vLLM measured.

    .venv/bin/python benchmarks/rollout_tp_economics.py [--hardware A800] [--lambda-csv PATH]
        [--step-overhead-us US] [--seq-overhead-us US]

Part 1, the cost model (`RolloutCostModel.decode_step_s`): for each built-in scenario's model, at a
few contexts and a fixed number of sequences *per GPU* (so a TP-k instance decodes k times as many),
the decode step (ITL) and the tokens per second per GPU of TP 1/2/4/8. Heterogeneous TP pays when a
low degree gives more tokens per GPU (for the bulk) and a high degree a shorter step (for the tail).

Part 2, the same model against vLLM: `../shared/data/hardware/vllm_tp_lambda_v0.csv` (Lambda's
benchmark, vLLM v0.5.4, ShareGPT requests, 320 prompts at once, A100/H100 SXM). For Mistral-7B-v0.3
(bf16; models.yaml `mistral-7b-v0.3`, from its config.json) each row gives the measured output tok/s and
ITL per TP degree; the batch decoding at once is taken from Little's law (tok/s x ITL), the context
is assumed to be 600 tokens (ShareGPT requests are a few hundred tokens each way; at this size the
step barely depends on it), and the model's ITL at that batch is printed next to the measured one,
with the gap per step and per sequence of the batch: the CPU time per decode step that a what-if
can give the simulator (`--setting serving_seq_overhead_us=...` or `serving_step_overhead_us`).
Lambda reports that vLLM v0.6.0 more than doubled this throughput by cutting CPU overhead, so the
gap is the v0.5.4 stack's, not a property of the GPUs.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from libra_core.planner.rollout_cost import RolloutCostModel
from libra_core.planner.specs import get_hardware, get_model
from libra_core.sim.workloads import SCENARIOS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import non_negative_float  # noqa: E402

DEFAULT_CSV = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "hardware" / "vllm_tp_lambda_v0.csv"
)
DEGREES = (1, 2, 4, 8)
MISTRAL_7B = get_model("mistral-7b-v0.3")  # the model of the Lambda table
LAMBDA_CTX = 600
LAMBDA_GPU = {"A100-80GB-SXM": "A100", "H100-80GB-SXM": "H100"}


def per_gpu_table(cm: RolloutCostModel, per_gpu: int, ctx: int) -> list[tuple[int, float, float]]:
    rows = []
    for tp in DEGREES:
        if not cm.model.supports_tp(tp) or cm.kv_capacity_tokens(tp) < per_gpu * tp * ctx:
            continue
        step = float(cm.decode_step_s(tp, np.asarray(per_gpu * tp), np.asarray(ctx)))
        rows.append((tp, step, per_gpu * tp / step / tp))
    return rows


def part_one(hardware: str, step_us: float = 0.0, seq_us: float = 0.0) -> None:
    hw = get_hardware(hardware)
    if step_us or seq_us:  # the simulator's what-if (SimSettings.hardware does the same)
        hw = hw.model_copy(update={"serving_step_overhead_us": step_us, "serving_seq_overhead_us": seq_us})
    print(f"## The cost model on {hw.name}: decode step and tokens/s per GPU at equal sequences per GPU")
    print(f"(serving CPU time per step: {step_us:g} us + {seq_us:g} us per sequence)\n")
    print("| model | context | seqs per GPU | " + " | ".join(f"TP{t} ms / tok/s/GPU" for t in DEGREES) + " |")
    print("|---|---:|---:|" + "---:|" * len(DEGREES))
    for name in sorted({s.model for s in SCENARIOS.values() if s.name != "tiny"}):
        cm = RolloutCostModel(get_model(name), hw)
        for ctx in (2_000, 8_000, 32_000):
            for per_gpu in (2, 8, 32):
                got = {tp: (step, rate) for tp, step, rate in per_gpu_table(cm, per_gpu, ctx)}
                cells = [f"{got[t][0] * 1e3:.1f} / {got[t][1]:,.0f}" if t in got else "-" for t in DEGREES]
                print(f"| {name} | {ctx:,} | {per_gpu} | " + " | ".join(cells) + " |")
    print()


def part_two(csv_path: Path) -> None:
    if not csv_path.is_file():
        print(f"(part 2 skipped: {csv_path} not found; pass --lambda-csv)")
        return
    print(f"## The cost model against vLLM v0.5.4 (Lambda), {MISTRAL_7B.name}, context {LAMBDA_CTX}\n")
    print(
        "| GPUs | TP | measured tok/s | measured ITL ms | batch (Little) | model ITL ms | model tok/s "
        "| measured / model ITL | gap per step ms | gap per sequence us |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            cell = row.get("mistral_7b_v03", "")
            gpu = row["gpu_config"].split("x", 1)[1]
            if not cell or gpu not in LAMBDA_GPU:
                continue
            tok_s, itl_ms = (float(x) for x in cell.split("/"))
            tp = int(row["tp"])
            batch = tok_s * itl_ms / 1e3
            cm = RolloutCostModel(MISTRAL_7B, get_hardware(LAMBDA_GPU[gpu]))
            step = float(cm.decode_step_s(tp, np.asarray(batch), np.asarray(LAMBDA_CTX)))
            gap_ms = itl_ms - step * 1e3  # what the GPU kernels do not explain
            print(
                f"| {row['gpu_config']} | {tp} | {tok_s:,.0f} | {itl_ms:.1f} | {batch:.0f} "
                f"| {step * 1e3:.1f} | {batch / step:,.0f} | {itl_ms / 1e3 / step:.1f}x "
                f"| {gap_ms:.1f} | {gap_ms * 1e3 / batch:.0f} |"
            )
    print()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="A800")
    ap.add_argument("--lambda-csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument(
        "--step-overhead-us", type=non_negative_float, default=0.0, help="serving CPU time per decode step"
    )
    ap.add_argument(
        "--seq-overhead-us",
        type=non_negative_float,
        default=0.0,
        help="serving CPU time per sequence and step",
    )
    args = ap.parse_args(argv)
    if not args.lambda_csv.is_file():
        ap.error(f"--lambda-csv {args.lambda_csv}: no such file")
    try:
        get_hardware(args.hardware)
    except ValueError as err:
        ap.error(str(err))
    print(
        f"Command: .venv/bin/python benchmarks/rollout_tp_economics.py --hardware {args.hardware} "
        f"--step-overhead-us {args.step_overhead_us:g} --seq-overhead-us {args.seq_overhead_us:g}\n"
    )
    part_one(args.hardware, args.step_overhead_us, args.seq_overhead_us)
    part_two(args.lambda_csv)


if __name__ == "__main__":
    main()
