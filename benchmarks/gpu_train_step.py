"""Time a training micro-batch and an optimizer step of a model's shape on one GPU, for `train_mfu`.

    python benchmarks/gpu_train_step.py --out train.json [--models qwen3-4b]
    .venv/bin/python benchmarks/gpu_train_step.py --compare train.json --hardware H200

The first form runs on a machine with a CUDA GPU and needs torch, transformers and pyyaml only. It
builds the model with transformers from the shape in `libra_core/planner/models.yaml` (random
weights, float32 master weights, bf16 autocast, SDPA attention: how the project's torch backend
trains) and times forward + backward of one packed sequence per micro-batch at a few lengths, with
and without activation recomputation, then one fused AdamW step over all parameters.

The second form (here, no GPU) divides the planner's FLOP count for each point
(`train_cost.iteration_flops`) by the measured time and the GPU's bf16 peak: the MFU a single GPU
reached, next to the `train_mfu` that hardware.yaml assumes. The optimizer step is put next to the
planner's memory-bound price of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The script's folder: on sys.path when it runs as a script; added for a test that loads this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import atomic_write_text  # noqa: E402
from _gpu_common import check_cli, device_run, gpu_cli, median_ms, model_shape, run_compare  # noqa: E402

POINTS = ((2_048, False), (4_096, False), (4_096, True), (8_192, True))  # (sequence tokens, recompute)


def _build(name: str, device: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    s = model_shape(name)
    qwen3 = name.startswith("qwen3")
    cls_cfg, cls = (Qwen3Config, Qwen3ForCausalLM) if qwen3 else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cls_cfg(
        vocab_size=s["vocab_size"],
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_layers"],
        num_attention_heads=s["num_heads"],
        num_key_value_heads=s["num_kv_heads"],
        head_dim=s["head_dim"],
        tie_word_embeddings=s["tie_embeddings"],
        max_position_embeddings=32_768,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).float()
    return model, s


def measure(models: list[str], out: Path, device: str, reps: int, points: tuple) -> dict:
    import torch

    cuda, sync, result = device_run(device)
    result["models"] = {}
    for name in models:
        model, shape = _build(name, device)
        model.train()
        params = sum(p.numel() for p in model.parameters())
        rec: dict = {"params": params, "fwd_bwd": [], "optimizer_ms": None}
        result["models"][name] = rec
        for tokens, recompute in points:
            if recompute:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            ids = torch.randint(0, shape["vocab_size"], (1, tokens), device=device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()

            def step(ids=ids, model=model) -> None:
                with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()

            try:
                ms = median_ms(step, reps, sync)
            except torch.OutOfMemoryError:
                ms = None
            model.zero_grad(set_to_none=False)
            peak_gb = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
            rec["fwd_bwd"].append({"tokens": tokens, "recompute": recompute, "ms": ms, "peak_gb": peak_gb})
            print(
                f"{name} fwd+bwd tokens={tokens} recompute={recompute}: {ms} ms (peak {peak_gb} GB)",
                flush=True,
            )
            atomic_write_text(out, json.dumps(result, indent=1))
        model.gradient_checkpointing_disable()
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
        rec["optimizer_ms"] = median_ms(opt.step, reps, sync)
        print(
            f"{name} AdamW step over {params / 1e9:.2f}B fp32 params: {rec['optimizer_ms']:.1f} ms",
            flush=True,
        )
        atomic_write_text(out, json.dumps(result, indent=1))
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return result


def compare(path: Path, hardware: str) -> None:
    from libra_core.planner.specs import get_hardware, get_model
    from libra_core.planner.train_cost import TrainShape, iteration_flops

    data = json.loads(path.read_text())
    hw = get_hardware(hardware)
    peak = hw.peak_flops_per_s("bfloat16")
    print(
        f"measured on {data['device']} (torch {data['torch']}); {hw.name} bf16 peak "
        f"{peak / 1e12:.0f} TFLOP/s, train_mfu assumed {hw.train_mfu}"
    )
    for name, rec in data["models"].items():
        m = get_model(name)
        print(f"\n{name} ({rec['params'] / 1e9:.2f}B params), one sequence per micro-batch")
        print("| tokens | recompute | fwd+bwd ms | TFLOP (planner) | MFU | model ms at train_mfu |")
        print("|---:|---|---:|---:|---:|---:|")
        for r in rec["fwd_bwd"]:
            t = r["tokens"]
            flops = iteration_flops(m, TrainShape(t, float(t) ** 2, t, minibatches=1), r["recompute"])
            pred = flops / (peak * hw.train_mfu) * 1e3
            if r["ms"] is None:
                print(f"| {t:,} | {r['recompute']} | out of memory | {flops / 1e12:.1f} | | {pred:.0f} |")
                continue
            mfu = flops / (r["ms"] / 1e3) / peak
            print(
                f"| {t:,} | {r['recompute']} | {r['ms']:.0f} | {flops / 1e12:.1f} | {mfu:.2f} | {pred:.0f} |"
            )
        # The planner's optimizer price: read+write 12 bytes of fp32 states and master, read 2 of grad.
        opt_pred = m.num_params * 2 * (12 + 2) / (hw.mem_bw_bytes_per_s * hw.mem_bw_eff) * 1e3
        print(f"\noptimizer step: measured {rec['optimizer_ms']:.1f} ms, planner {opt_pred:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = gpu_cli(__doc__ or "", "qwen3-4b", 5)
    a = ap.parse_args(argv)
    models = check_cli(ap, a)
    if a.compare:
        run_compare(ap, compare, a)
        return 0
    points = ((64, False), (64, True)) if a.smoke else POINTS
    measure(models, a.out, a.device, a.reps, points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
