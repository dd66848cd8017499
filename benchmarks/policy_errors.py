"""Where does the arithmetic policy fail? Greedy vs sampled accuracy, and the first wrong call.

    .venv/bin/python benchmarks/policy_errors.py --policy POLICY_DIR [--problems 128]
    .venv/bin/python benchmarks/policy_errors.py --run RUN_DIR

`--policy`: exact-answer share of the policy on fresh 3- and 4-operation problems, greedy and
sampled at temperature 1 (the transformers reference loop of the warm-up, one thread): the gap is
what sharpening the sampled policy could gain. `--run`: over a run's trajectory lake, for 4-op
problems, which calculator call was the first to differ from the reference solution's, and the
success rate by expression shape (digits as n, operators as o).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem, positive_int, run_folder_problem  # noqa: E402


def greedy_vs_sampled(policy: Path, n: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from libra_core.envs.arithmetic import ArithmeticEnv
    from libra_core.model.sft import greedy_answers
    from libra_core.pipeline.rollout_stage import load_tokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    tokenizer, env = load_tokenizer(str(policy)), ArithmeticEnv()
    for ops in (3, 4):
        drawn = env.sample_problems(6 * n, 12345, min_difficulty=ops)
        problems = [p for p in drawn if p.difficulty == ops][:n]
        scores = []
        for temperature in (0.0, 1.0):
            torch.manual_seed(0)
            answers = greedy_answers(model, tokenizer, env, problems, temperature=temperature)
            right = [
                a is not None and a.strip() == p.reference_answer
                for a, p in zip(answers, problems, strict=True)
            ]
            scores.append(sum(right) / len(problems))
        print(f"{ops} ops, {len(problems)} problems: greedy {scores[0]:.3f}, sampled {scores[1]:.3f}")


def first_wrong_call(run_dir: Path) -> None:
    from libra_core.data.io import read_lake
    from libra_core.envs.arithmetic import ArithmeticEnv
    from libra_core.envs.base import Problem
    from libra_core.pipeline.rollout_stage import load_tokenizer

    tokenizer, env = load_tokenizer(str(run_dir / "policy")), ArithmeticEnv()
    first: Counter[str] = Counter()
    shapes: Counter[str] = Counter()
    solved: Counter[str] = Counter()
    columns = ["prompt_ids", "response_ids", "final_answer", "reference_answer"]
    for r in read_lake(run_dir).select(columns).to_pylist():
        question = re.sub(r"<\|[a-z/]+\|>| ", "", tokenizer.decode(r["prompt_ids"]))
        steps = env.solution_steps(Problem("q", question, r["reference_answer"], 0))
        if len(steps) != 4:
            continue
        shape = "".join(c if c in "()" else "n" if c.isdigit() else "o" for c in question)
        ok = r["final_answer"] is not None and r["final_answer"].strip() == r["reference_answer"]
        shapes[shape] += 1
        solved[shape] += ok
        if ok:
            continue
        calls = re.findall(
            r"<\|call\|>(.*?)<\|/call\|>", tokenizer.decode(r["response_ids"]).replace(" ", "")
        )
        wrong = next(
            (
                str(i + 1)
                for i, (a, op, b, _) in enumerate(steps)
                if i >= len(calls) or calls[i] != f"{a}{op}{b}"
            ),
            "none (every call right, answer wrong)",
        )
        first[wrong] += 1
    print(
        f"4-op failures: {sum(first.values())}; first wrong call: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(first.items()))
    )
    print("| shape | trajectories | exact |")
    print("|---|---:|---:|")
    for shape, count in shapes.most_common():
        print(f"| `{shape}` | {count} | {solved[shape] / count:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, help="HF policy folder (e.g. a warm-up in runs/.cache)")
    parser.add_argument("--run", type=Path, help="run folder with a trajectory lake")
    parser.add_argument("--problems", type=positive_int, default=128, help="problems per operation count")
    args = parser.parse_args(argv)
    if args.policy is None and args.run is None:
        parser.error("pass --policy POLICY_DIR, --run RUN_DIR, or both")
    problem = args.policy is not None and folder_problem(args.policy, ["config.json"], "policy folder")
    if problem:
        parser.error(f"--policy {problem}")
    problem = args.run is not None and run_folder_problem(args.run)
    if problem:
        parser.error(f"--run {problem}")
    if args.policy is not None:
        greedy_vs_sampled(args.policy, args.problems)
    if args.run is not None:
        first_wrong_call(args.run)


if __name__ == "__main__":
    main()
