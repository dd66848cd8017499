"""The serving engine's CPU time per decode step, measured on the installed vLLM.

    .venv/bin/python benchmarks/vllm_step_overhead.py [--batches 1,8,32,64,128,256] [--repeats 3]

A decode step of vLLM is the model's forward pass plus CPU work: scheduling, preparing the inputs,
sampling, and turning the outputs into results (`detokenize` on, as the rollout runs it). To see
the CPU part, this serves a model too small to cost anything (one layer, width 64, a 200-token
vocabulary, built here), so the step is nearly all engine. For each batch size B it generates
B sequences of exactly N tokens (`ignore_eos`) for two lengths and takes the difference, which
removes the prefill and the request's fixed costs: step = (t(N_long) - t(N_short)) / (N_long -
N_short). A straight-line fit step = fixed + per_seq x B is what the simulator's what-if takes
(`--setting serving_step_overhead_us=... serving_seq_overhead_us=...`).

What it measures is the CPU backend's engine on this machine's CPU (2 cores shared by the engine
core and the front end), with the model's own forward included (tiny, but not zero: the sampler
and LM head run on the CPU too). On a GPU server the sampler runs on the GPU and vLLM V1 overlaps
part of the CPU work with the GPU's, so this is an upper bound for the same vLLM version there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Words of every letter pair, so the tokenizer has a few hundred tokens to learn.
CORPUS = [" ".join(a + b + a for b in "abcdefghijklmnopqrstuvwxyz") for a in "abcdefghijklmnopqrstuvwxyz"] * 4


def build_model(out: Path) -> Path:
    from libra_core.config.models import TinyModelConfig
    from libra_core.model.policy import build_tiny_policy, save_policy
    from libra_core.model.tokenizer import train_tokenizer

    tok = train_tokenizer(CORPUS, ("<|eos|>", "<|pad|>"), vocab_size=200)
    cfg = TinyModelConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    print(f"tiny model: vocabulary {len(tok)}", flush=True)
    return save_policy(build_tiny_policy(cfg, len(tok), seed=0), tok, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--lengths", default="16,96", help="N_short,N_long generated tokens per sequence")
    ap.add_argument("--repeats", type=int, default=3, help="median of this many timings per point")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    n_short, n_long = (int(n) for n in a.lengths.split(","))
    if not 0 < n_short < n_long:
        ap.error("--lengths must be two increasing positive numbers")
    for k, v in {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}.items():
        os.environ.setdefault(k, v)

    import vllm
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model")
        t0 = time.perf_counter()
        llm = LLM(model=str(path), max_num_seqs=max(batches), max_model_len=512, seed=0)
        print(f"vLLM {vllm.__version__}: engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        vocab = llm.llm_engine.model_config.get_vocab_size()
        prompt = {"prompt_token_ids": [5 + i % (vocab - 5) for i in range(16)]}

        def run(batch: int, n: int) -> float:
            sp = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=1.0, seed=0)
            t = time.perf_counter()
            outs = llm.generate([prompt] * batch, sp, use_tqdm=False)
            dt = time.perf_counter() - t
            got = {len(o.outputs[0].token_ids) for o in outs}
            if got != {n}:
                raise RuntimeError(f"asked for {n} tokens per sequence, got lengths {sorted(got)}")
            return dt

        run(max(batches), n_long)  # warm-up
        rows = []
        for b in batches:
            steps = []
            for _ in range(a.repeats):
                steps.append((run(b, n_long) - run(b, n_short)) / (n_long - n_short))
            step = float(np.median(steps))
            rows.append((b, step))
            print(
                f"batch {b:>4}: {step * 1e3:7.3f} ms per decode step ({step / b * 1e6:6.1f} us per sequence)",
                flush=True,
            )
    bs = np.array([r[0] for r in rows], float)
    st = np.array([r[1] for r in rows], float)
    per_seq, fixed = np.polyfit(bs, st, 1)
    print("\n| batch | step ms | us per sequence |\n|---:|---:|---:|")
    for b, s in rows:
        print(f"| {b} | {s * 1e3:.2f} | {s / b * 1e6:.1f} |")
    print(
        f"\nfit: step = {fixed * 1e6:.0f} us + {per_seq * 1e6:.1f} us x batch "
        f"(vLLM {vllm.__version__}, {os.cpu_count()} CPUs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
