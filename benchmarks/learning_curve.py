"""Is the policy changing during RL? Per-window accuracy by difficulty and sampled-token NLL.

    .venv/bin/python benchmarks/learning_curve.py RUN_DIR [RUN_DIR ...] [--window 10]

Reads each run's trajectory lake and history and prints, per window of iterations: the training
reward, the exact-answer share by the number of calculator calls the trajectory made, the
mean negative log-prob of the sampled policy tokens (behaviour log-probs; it falls as RL sharpens
the policy), the share of answers given after fewer calculator calls than the problem has operations
(the premature stop that `environment.warmup_early_answer_rate` teaches the warm-up), the share of
mixed-outcome groups and the greedy evaluation where one ran. The reward of the first and last
three iterations (the foundation issue's measure) closes each table.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import positive_int, run_folder_problem  # noqa: E402


def summarize(run_dir: Path, window: int) -> None:
    from libra_core.data.history import read_history
    from libra_core.data.io import read_lake

    history = read_history(run_dir)
    lake = read_lake(run_dir).select(
        [
            "iteration",
            "reward",
            "final_answer",
            "reference_answer",
            "prompt_ids",
            "tool_events",
            "behavior_logprobs",
            "loss_mask",
        ]
    )
    rows = lake.to_pylist()
    by_iteration: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_iteration[r["iteration"]].append(r)
    iterations = sorted(by_iteration)
    operations = _operation_counter(run_dir)
    print(f"\n{run_dir.name}: {len(iterations)} iterations, {len(rows)} trajectories")
    print(
        "| iterations | reward | exact | exact by tool calls (n) | sampled-token NLL | stopped early "
        "| mixed groups | greedy eval |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---|")
    hist = {h["iteration"]: h for h in history}
    for lo in range(0, len(iterations), window):
        its = iterations[lo : lo + window]
        chunk = [r for i in its for r in by_iteration[i]]
        exact = [
            r["final_answer"] is not None and r["final_answer"].strip() == r["reference_answer"]
            for r in chunk
        ]
        calls: dict[int, list[bool]] = defaultdict(list)
        nll_sum = nll_n = 0.0
        answered = [r for r in chunk if r["final_answer"] is not None]
        early = np.mean([len(r["tool_events"]) < operations(r["prompt_ids"]) for r in answered] or [0.0])
        for r, ok in zip(chunk, exact, strict=True):
            calls[len(r["tool_events"])].append(ok)
            lp = np.asarray(r["behavior_logprobs"], dtype=np.float64)
            mask = np.asarray(r["loss_mask"], dtype=bool)
            nll_sum -= float(lp[mask].sum())
            nll_n += int(mask.sum())
        by_calls = ", ".join(f"{k}: {np.mean(v):.2f} ({len(v)})" for k, v in sorted(calls.items()))
        evals = [
            f"{hist[i]['eval_accuracy']:.2f}" for i in its if hist.get(i, {}).get("eval_accuracy") is not None
        ]
        mixed = np.mean([hist[i]["mixed_group_share"] for i in its if i in hist])
        print(
            f"| {its[0]}-{its[-1]} | {np.mean([r['reward'] for r in chunk]):.3f} | {np.mean(exact):.3f} "
            f"| {by_calls} | {nll_sum / max(nll_n, 1):.4f} | {early:.3f} | {mixed:.2f} "
            f"| {' '.join(evals) or '-'} |"
        )
    rewards = [h["reward_mean"] for h in history]
    k = min(3, len(rewards))
    print(
        f"reward first {k} -> last {k}: {np.mean(rewards[:k]):.3f} -> {np.mean(rewards[-k:]):.3f} "
        f"({np.mean(rewards[-k:]) - np.mean(rewards[:k]):+.3f})"
    )


def _operation_counter(run_dir: Path):
    """prompt token ids -> binary operations in the arithmetic problem (the calls it needs)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "policy")

    def operations(prompt_ids: list[int]) -> int:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        return sum(text.count(op) for op in "+-*")

    return operations


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="run folders (each with lake/, policy/ and history.parquet)"
    )
    parser.add_argument("--window", type=positive_int, default=10, help="iterations per table row")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:  # every folder checked before the first table
        problem = run_folder_problem(run_dir, ("policy", "history.parquet"))
        if problem:
            parser.error(problem)
    for run_dir in args.run_dirs:
        summarize(run_dir, args.window)


if __name__ == "__main__":
    main()
