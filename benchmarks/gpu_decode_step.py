"""Time a real decode step and prefill chunk of a model's shape on one GPU, for the cost model.

    python benchmarks/gpu_decode_step.py --out step.json [--models qwen3-14b,qwen3-8b] [--only decode]
    python benchmarks/gpu_decode_step.py --out shards.json --models qwen3-14b --tp-shards
    .venv/bin/python benchmarks/gpu_decode_step.py --compare step.json --hardware H200

The first form runs on a machine with a CUDA GPU and needs torch and pyyaml only (it reads
`libra_core/planner/models.yaml` directly, so the device machine's own Python can run it). For each
model it builds the layers with random bf16 weights and a contiguous KV cache, and times one decode
step (all layers, final norm, LM head, greedy pick) for a grid of batch x context, captured in a
CUDA graph and replayed (the kernels alone, as vLLM runs decode) and run eagerly (with the launch
cost). Attention is a batched matmul over the cache with the query heads of each KV group as rows
(GQA), so it reads each sequence's K and V once: close to what a paged decode kernel moves, not
vLLM's kernel itself. It also times prefill chunks (causal attention by SDPA). One GPU, so TP 1 only.

`--tp-shards` times instead what one GPU of a TP 1/2/4/8 instance computes (a k-th of the heads,
MLP and vocabulary, the hidden size whole) at equal sequences per GPU, so a TP-k shard decodes k
times as many: the kernel half of `benchmarks/rollout_tp_economics.py`. `--compare` adds the cost
model's all-reduces (which one GPU cannot run) and prints tokens per second per GPU.

The comparison form (here, no GPU) puts `RolloutCostModel.decode_step_s` / `prefill_s_per_token` for the
named hardware at TP 1 next to each measured point: the ratio says where the fitted model is off.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import atomic_write_text  # noqa: E402
from _gpu_common import check_cli, device_run, gpu_cli, median_ms, model_shape, run_compare  # noqa: E402

# (context, largest batch): batch x context stays under 512k tokens of KV cache (84 GB for qwen3-14b).
GRID = {1_000: (1, 8, 32, 64, 128, 256), 4_000: (1, 8, 32, 64, 128), 16_000: (1, 8, 16, 32)}
SHARD_POINTS = ((2_000, 8), (2_000, 32), (8_000, 8))  # (context, sequences per GPU)
PREFILL = ((512, 4_000), (2_048, 0), (2_048, 8_000), (8_192, 0))  # (chunk tokens, tokens already in context)


class Model:
    """A dense decoder of the given shape, random weights, bf16, with a KV cache of `cache_tokens`."""

    def __init__(self, shape: dict, cache_tokens: int, device: str):
        import torch

        self.s, self.dev = shape, device
        h, qd = shape["hidden_size"], shape["num_heads"] * shape["head_dim"]
        kvd = shape["num_kv_heads"] * shape["head_dim"]
        f, L = shape["intermediate_size"], shape["num_layers"]
        g = torch.Generator(device=device).manual_seed(0)

        def w(*dims: int):
            return torch.randn(*dims, generator=g, device=device, dtype=torch.bfloat16) / math.sqrt(dims[0])

        self.layers = [
            dict(
                n1=torch.ones(h, device=device, dtype=torch.bfloat16),
                qkv=w(h, qd + 2 * kvd),
                o=w(qd, h),
                n2=torch.ones(h, device=device, dtype=torch.bfloat16),
                gu=w(h, 2 * f),
                down=w(f, h),
            )
            for _ in range(L)
        ]
        self.norm = torch.ones(h, device=device, dtype=torch.bfloat16)
        self.head = w(h, shape["vocab_size"])
        self.cache_tokens = cache_tokens
        self.k = torch.randn(L, cache_tokens * kvd, generator=g, device=device, dtype=torch.bfloat16)
        self.v = torch.randn(L, cache_tokens * kvd, generator=g, device=device, dtype=torch.bfloat16)

    def params(self) -> int:
        per = sum(t.numel() for t in self.layers[0].values())
        return per * len(self.layers) + self.head.numel() + self.norm.numel()

    def decode(self, x, ctx: int, logits: bool = False):
        """One decode step for x [B, hidden] attending `ctx` cached tokens each (the last one this
        step's): the greedy token ids, or the logits."""
        import torch
        import torch.nn.functional as F

        s = self.s
        B, hd, kvh = x.shape[0], s["head_dim"], s["num_kv_heads"]
        grp, qd, kvd = s["num_heads"] // kvh, s["num_heads"] * hd, kvh * hd
        eps = 1e-6
        for i, ly in enumerate(self.layers):
            a = F.rms_norm(x, (x.shape[-1],), ly["n1"], eps)
            qkv = a @ ly["qkv"]
            q, k, v = qkv.split((qd, kvd, kvd), dim=-1)
            q = q * 1.0001  # stands for rotary embedding: one elementwise pass over q and k
            k = k * 1.0001
            kc = self.k[i, : B * ctx * kvd].view(B, kvh, ctx, hd)
            vc = self.v[i, : B * ctx * kvd].view(B, kvh, ctx, hd)
            kc[:, :, ctx - 1] = k.view(B, kvh, hd)  # append this step's K and V
            vc[:, :, ctx - 1] = v.view(B, kvh, hd)
            qg = q.view(B, kvh, grp, hd)
            scores = torch.matmul(qg, kc.transpose(-1, -2)) * (hd**-0.5)
            att = torch.matmul(torch.softmax(scores.float(), dim=-1).to(x.dtype), vc)
            x = x + att.reshape(B, qd) @ ly["o"]
            a = F.rms_norm(x, (x.shape[-1],), ly["n2"], eps)
            gate, up = (a @ ly["gu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ ly["down"]
        out = F.rms_norm(x, (x.shape[-1],), self.norm, eps) @ self.head
        return out if logits else out.argmax(dim=-1)

    def prefill(self, x, past: int):
        """A prefill chunk x [T, hidden] of one sequence with `past` tokens already cached."""
        import torch.nn.functional as F

        s = self.s
        T, hd, kvh, nh = x.shape[0], s["head_dim"], s["num_kv_heads"], s["num_heads"]
        qd, kvd = nh * hd, kvh * hd
        ctx = past + T
        from torch.nn.attention.bias import causal_lower_right

        # Flash/efficient kernels: K and V expanded to every query head, a bottom-right causal bias.
        mask = causal_lower_right(T, ctx) if past else None
        for i, ly in enumerate(self.layers):
            a = F.rms_norm(x, (x.shape[-1],), ly["n1"], 1e-6)
            q, k, v = (a @ ly["qkv"]).split((qd, kvd, kvd), dim=-1)
            kc = self.k[i, : ctx * kvd].view(ctx, kvh, hd)
            vc = self.v[i, : ctx * kvd].view(ctx, kvh, hd)
            kc[past:] = k.view(T, kvh, hd)
            vc[past:] = v.view(T, kvh, hd)
            rep = nh // kvh
            o = F.scaled_dot_product_attention(
                q.view(T, nh, hd).transpose(0, 1).unsqueeze(0),
                kc.transpose(0, 1).repeat_interleave(rep, dim=0).unsqueeze(0),
                vc.transpose(0, 1).repeat_interleave(rep, dim=0).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
            ).squeeze(0)
            x = x + o.transpose(0, 1).reshape(T, qd) @ ly["o"]
            a = F.rms_norm(x, (x.shape[-1],), ly["n2"], 1e-6)
            gate, up = (a @ ly["gu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ ly["down"]
        return F.rms_norm(x[-1:], (x.shape[-1],), self.norm, 1e-6) @ self.head


def _graph_ms(m: Model, x, ctx: int, reps: int, sync) -> float:
    """Median ms of one decode step captured in a CUDA graph and replayed (the kernels alone)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            m.decode(x, ctx)
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        m.decode(x, ctx)
    return median_ms(gr.replay, reps, sync)


def shard(shape: dict, tp: int) -> dict:
    """What one GPU of a TP-`tp` instance holds: heads, KV heads (at least one), MLP and vocabulary
    split `tp` ways, the hidden size whole (Megatron-style tensor parallelism)."""
    if shape["num_heads"] % tp or shape["intermediate_size"] % tp:
        raise ValueError(
            f"TP {tp} does not divide {shape['num_heads']} heads and {shape['intermediate_size']} MLP"
        )
    return {
        **shape,
        "num_heads": shape["num_heads"] // tp,
        "num_kv_heads": max(1, shape["num_kv_heads"] // tp),
        "intermediate_size": shape["intermediate_size"] // tp,
        "vocab_size": shape["vocab_size"] // tp,
    }


def shard_degrees(ap: argparse.ArgumentParser, name: str, degrees: tuple[int, ...]) -> tuple[int, ...]:
    """The `degrees` that split `name` evenly, checked before any GPU work: the others are skipped
    with a note (vLLM cannot run them either), and none left is exit 2 naming the model."""
    shape, fit = model_shape(name), []
    for tp in degrees:
        try:
            shard(shape, tp)
            fit.append(tp)
        except ValueError as err:
            print(f"{name}: TP {tp} skipped ({err})", flush=True)
    if not fit:
        ap.error(f"--tp-shards: no TP degree of {list(degrees)} splits {name}")
    return tuple(fit)


def measure_shards(name: str, out: Path, device: str, reps: int, points: tuple, degrees=(1, 2, 4, 8)) -> dict:
    """Decode steps of one GPU's shard of TP 1/2/4/8 instances at equal sequences per GPU (a TP-k
    instance decodes k times as many): the kernel half of the TP economics. The all-reduces a
    real TP-k step adds cannot run on one GPU; `--compare` adds the cost model's for them."""
    import torch

    cuda, sync, result = device_run(device)
    result["tp_shards"] = []
    full = model_shape(name)
    for tp in degrees:
        sh = shard(full, tp)
        cache = max(per_gpu * tp * ctx for ctx, per_gpu in points)
        m = Model(sh, cache, device)
        for ctx, per_gpu in points:
            x = torch.randn(per_gpu * tp, sh["hidden_size"], device=device, dtype=torch.bfloat16)
            with torch.no_grad():
                ms = (
                    _graph_ms(m, x, ctx, reps, sync)
                    if cuda
                    else median_ms(partial(m.decode, x, ctx), reps, sync)
                )
            result["tp_shards"].append(
                {
                    "model": name,
                    "tp": tp,
                    "ctx": ctx,
                    "per_gpu": per_gpu,
                    "ms": round(ms, 3),
                    "cuda_graph": cuda,
                }
            )
            print(
                f"{name} TP{tp} shard, {per_gpu}/GPU (batch {per_gpu * tp}), ctx {ctx}: {ms:.2f} ms",
                flush=True,
            )
            atomic_write_text(out, json.dumps(result, indent=1))
        del m
        if cuda:
            torch.cuda.empty_cache()
    return result


def measure(models: list[str], out: Path, device: str, reps: int, grid: dict, prefill: tuple) -> dict:
    """Time every (context, batch) decode point of `grid` and every (tokens, past) chunk of `prefill`."""
    import torch

    cuda, sync, result = device_run(device)
    result["models"] = {}
    for name in models:
        shape = model_shape(name)
        cache = max([b * c for c, bs in grid.items() for b in bs] + [t + p for t, p in prefill])
        t0 = time.perf_counter()
        m = Model(shape, cache, device)
        sync()
        rec: dict = {
            "shape": shape,
            "params": m.params(),
            "build_s": round(time.perf_counter() - t0, 1),
            "decode": [],
            "prefill": [],
        }
        result["models"][name] = rec
        for ctx, batches in grid.items():
            for B in batches:
                x = torch.randn(B, shape["hidden_size"], device=device, dtype=torch.bfloat16)
                with torch.no_grad():
                    eager = median_ms(partial(m.decode, x, ctx), reps, sync)
                    graph_ms = _graph_ms(m, x, ctx, reps, sync) if cuda else None
                row = {
                    "batch": B,
                    "ctx": ctx,
                    "eager_ms": round(eager, 3),
                    "graph_ms": None if graph_ms is None else round(graph_ms, 3),
                }
                rec["decode"].append(row)
                print(f"{name} decode B={B:>3} ctx={ctx:>6}: graph {graph_ms} ms, eager {eager:.3f} ms")
                atomic_write_text(out, json.dumps(result, indent=1))
        for T, past in prefill:
            x = torch.randn(T, shape["hidden_size"], device=device, dtype=torch.bfloat16)
            with torch.no_grad():
                ms = median_ms(partial(m.prefill, x, past), max(3, reps // 4), sync)
            rec["prefill"].append({"tokens": T, "past": past, "eager_ms": round(ms, 3)})
            print(f"{name} prefill T={T} past={past}: {ms:.3f} ms", flush=True)
            atomic_write_text(out, json.dumps(result, indent=1))
        del m
        if cuda:
            torch.cuda.empty_cache()
    return result


def _compare_shards(data: dict, hw) -> None:
    """Per TP degree: the shard's measured step, the model's all-reduces added, tokens/s per GPU."""
    from libra_core.planner.ops import all_reduce_s
    from libra_core.planner.rollout_cost import RolloutCostModel
    from libra_core.planner.specs import get_model

    print(f"measured on {data['device']} (torch {data['torch']}); model: {hw.name}")
    print("one GPU's shard of a TP-k instance (CUDA graph on a GPU); + the model's 2 all-reduces per layer")
    print("| model | ctx | seqs per GPU | TP | shard ms | model shard ms | + all-reduce ms | tok/s per GPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in data["tp_shards"]:
        m = get_model(r["model"])
        tp, batch = r["tp"], r["per_gpu"] * r["tp"]
        ar = m.num_layers * 2 * float(all_reduce_s(hw, batch * m.hidden_size * m.bytes_per_param, tp)) * 1e3
        full = float(RolloutCostModel(m, hw).forward_s(tp, batch, batch, r["ctx"])) * 1e3
        step = r["ms"] + ar
        print(
            f"| {r['model']} | {r['ctx']:,} | {r['per_gpu']} | {tp} | {r['ms']:.2f} | {full - ar:.2f} "
            f"| {ar:.2f} | {batch / (step / 1e3) / tp:,.0f} |"
        )


def compare(path: Path, hardware: str) -> None:
    from libra_core.planner.rollout_cost import RolloutCostModel
    from libra_core.planner.specs import get_hardware, get_model

    data = json.loads(path.read_text())
    hw = get_hardware(hardware)
    if "tp_shards" in data:
        _compare_shards(data, hw)
        return
    print(f"measured on {data['device']} (torch {data['torch']}); model: {hw.name}, TP 1")
    for name, rec in data["models"].items():
        cm = RolloutCostModel(get_model(name), hw)
        print(f"\n{name} ({rec['params'] / 1e9:.2f}B params built) decode step, ms")
        print("| ctx | batch | model | CUDA graph | graph / model | eager | eager - graph |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rec["decode"]:
            pred = float(cm.decode_step_s(1, r["batch"], r["ctx"])) * 1e3
            g, e = r["graph_ms"], r["eager_ms"]
            gs = " | " if g is None else f"{g:.2f} | {g / pred:.2f}"  # two cells either way
            ds = "" if g is None else f"{e - g:.2f}"
            print(f"| {r['ctx']:,} | {r['batch']} | {pred:.2f} | {gs} | {e:.2f} | {ds} |")
        print(f"\n{name} prefill chunk, ms")
        print("| tokens | past | model | eager (SDPA) | measured / model |")
        print("|---:|---:|---:|---:|---:|")
        for r in rec["prefill"]:
            ctx = r["past"] + r["tokens"] / 2  # the chunk's tokens attend this many on average
            pred = float(cm.prefill_s_per_token(1, ctx)) * r["tokens"] * 1e3
            ms = r["eager_ms"]
            print(f"| {r['tokens']:,} | {r['past']:,} | {pred:.1f} | {ms:.1f} | {ms / pred:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = gpu_cli(__doc__ or "", "qwen3-14b,qwen3-8b", 20)
    ap.add_argument("--only", choices=("decode", "prefill"), help="time one kind of forward pass")
    ap.add_argument(
        "--tp-shards", action="store_true", help="time one GPU's shard of TP 1/2/4/8 (first of --models)"
    )
    a = ap.parse_args(argv)
    models = check_cli(ap, a)
    if a.compare:
        run_compare(ap, compare, a)
        return 0
    if a.tp_shards:
        points, degrees = (((32, 2),), (1, 2)) if a.smoke else (SHARD_POINTS, (1, 2, 4, 8))
        degrees = shard_degrees(ap, models[0], degrees)
        measure_shards(models[0], a.out, a.device, a.reps, points, degrees)
        return 0
    grid = {64: (1, 2)} if a.smoke else GRID
    prefill = ((16, 0), (16, 32)) if a.smoke else PREFILL
    measure(
        models,
        a.out,
        a.device,
        a.reps,
        {} if a.only == "prefill" else grid,
        () if a.only == "decode" else prefill,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
