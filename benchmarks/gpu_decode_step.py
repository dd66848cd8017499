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
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import atomic_write_text, output_file_problem, positive_int  # noqa: E402

MODELS_YAML = Path(__file__).resolve().parents[1] / "libra_core" / "planner" / "models.yaml"
# (context, largest batch): batch x context stays under 512k tokens of KV cache (84 GB for qwen3-14b).
GRID = {1_000: (1, 8, 32, 64, 128, 256), 4_000: (1, 8, 32, 64, 128), 16_000: (1, 8, 16, 32)}
SHARD_POINTS = ((2_000, 8), (2_000, 32), (8_000, 8))  # (context, sequences per GPU)
PREFILL = ((512, 4_000), (2_048, 0), (2_048, 8_000), (8_192, 0))  # (chunk tokens, tokens already in context)


def model_shape(name: str) -> dict:
    """The shape fields of `name` in models.yaml (read directly: no libra_core import needed)."""
    import yaml

    spec = yaml.safe_load(MODELS_YAML.read_text())[name]
    return {
        k: spec[k]
        for k in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "tie_embeddings",
        )
    }


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


def median_ms(fn, reps: int, sync) -> float:
    """Median wall ms of `fn` over `reps` runs (each synchronised), after two warm-ups."""
    for _ in range(2):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t) * 1e3)
    out.sort()
    return out[len(out) // 2]


def device_run(device: str) -> tuple[bool, Callable[[], None], dict]:
    """Whether `device` is a CUDA GPU, how to wait for its work, and a result header naming it."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return cuda, sync, {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}


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
            gs = "" if g is None else f"{g:.2f} | {g / pred:.2f}"
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


SMOKE_MODELS = "tiny"  # --smoke without --models: the models.yaml shape a CPU builds in a moment


def gpu_cli(doc: str, models: str, reps: int) -> argparse.ArgumentParser:
    """The options both GPU timing scripts take: measure (`--out`) or compare (`--compare`)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", type=Path, help="measure here (needs a CUDA GPU) and write JSON to this path")
    ap.add_argument(
        "--models",
        default=None,
        help=f"comma-separated models.yaml names (default: {models}; with --smoke: {SMOKE_MODELS})",
    )
    ap.add_argument("--reps", type=positive_int, default=reps, help=f"timings per point (default {reps})")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny shapes and sizes, and the {SMOKE_MODELS} model unless --models names others "
        "(checks the script on a CPU: --smoke --device cpu)",
    )
    ap.add_argument(
        "--compare", type=Path, help="a JSON written by --out: print it next to the planner's price"
    )
    ap.add_argument("--hardware", default="H200", help="the cost model's hardware for --compare")
    ap.set_defaults(default_models=models)
    return ap


def check_cli(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The checks both GPU scripts make before any work (exit 2 naming the problem); returns the
    models to measure: `--models`, else the tiny model under `--smoke`, else the script's default."""
    if a.compare:
        if not a.compare.is_file():
            ap.error(f"--compare {a.compare}: no such file")
        return []
    if not a.out:
        ap.error("give --out PATH (measure) or --compare PATH")
    problem = output_file_problem(a.out)
    if problem:
        ap.error(f"--out {problem}")
    text = a.models if a.models is not None else SMOKE_MODELS if a.smoke else a.default_models
    models = [m.strip() for m in text.split(",")]
    if not all(models):
        ap.error(f"--models {text!r}: expected comma-separated model names")
    import yaml

    known = yaml.safe_load(MODELS_YAML.read_text())
    unknown = [m for m in models if m not in known]
    if unknown:
        ap.error(f"--models: unknown {unknown}; valid: {sorted(known)}")
    return models


def run_compare(ap: argparse.ArgumentParser, fn: Callable[[Path, str], None], a: argparse.Namespace) -> None:
    """`fn(--compare, --hardware)`; a file that is not a JSON written by `--out` or an unknown
    hardware name is exit 2 naming it, not a traceback."""
    try:
        fn(a.compare, a.hardware)
    except (ValueError, KeyError, TypeError) as err:
        ap.error(f"--compare {a.compare} --hardware {a.hardware}: {type(err).__name__}: {err}")


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
