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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import comma_list, positive_int  # noqa: E402

MAX_MODEL_LEN = 512  # the engine's context: 16 prompt tokens + N_long generated must fit
PROMPT_TOKENS = 16

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
    ap.add_argument(
        "--batches",
        type=comma_list(positive_int),
        default="1,8,32,64,128,256",
        help="comma-separated batch sizes, at least two different ones (the fit is a line)",
    )
    ap.add_argument(
        "--lengths",
        type=comma_list(positive_int),
        default="16,96",
        help="N_short,N_long generated tokens per sequence",
    )
    ap.add_argument("--repeats", type=positive_int, default=3, help="median of this many timings per point")
    a = ap.parse_args(argv)
    batches = a.batches
    if len(set(batches)) < 2:
        ap.error(f"--batches {','.join(map(str, batches))}: give at least two different batch sizes to fit")
    if len(a.lengths) != 2 or not a.lengths[0] < a.lengths[1]:
        ap.error(f"--lengths {','.join(map(str, a.lengths))}: give two increasing numbers N_short,N_long")
    n_short, n_long = a.lengths
    if PROMPT_TOKENS + n_long > MAX_MODEL_LEN:
        ap.error(
            f"--lengths: N_long {n_long} + {PROMPT_TOKENS} prompt tokens exceed the engine's "
            f"{MAX_MODEL_LEN}-token context"
        )
    for k, v in {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}.items():
        os.environ.setdefault(k, v)

    import vllm
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model")
        t0 = time.perf_counter()
        llm = LLM(model=str(path), max_num_seqs=max(batches), max_model_len=MAX_MODEL_LEN, seed=0)
        print(f"vLLM {vllm.__version__}: engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        vocab = llm.llm_engine.model_config.get_vocab_size()
        prompt = {"prompt_token_ids": [5 + i % (vocab - 5) for i in range(PROMPT_TOKENS)]}

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
