"""Does a GRPO update move the policy the right way on real rewarded batches?

    .venv/bin/python benchmarks/update_direction.py RUN_DIR [--iteration 66] [--updates 1] [--lr 1e-4]
        [--negative-weight 1.0] [--no-std] [--kl 0.0]

Copies the policy that generated `stages/iteration=N/rewarded.arrow` (checkpoint `iter_{N-1}`,
which must be a kept checkpoint) and the run's AdamW state, applies `--updates` updates on the
batches of iterations N, N+1, ... with the given settings, and prints:
- the mean change of each trajectory's summed policy-token log-prob in batch N, split by the sign
  of its GRPO advantage (positive-advantage trajectories should gain relative to the others);
- how confidently each side was sampled (summed NLL of its policy tokens; a token sampled at p close
  to 1 has almost no gradient to give);
- the mean change of the summed log-prob of *correct* demonstrations of fresh 3- and 4-operation
  problems (the environment's reference solutions, never seen in training): whether the update
  generalises towards solving new problems, or only away from this batch's failures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import folder_problem, non_negative_float, positive_int  # noqa: E402


def _summed(model: object, sequences: list[tuple[list[int], list[int], int]]) -> np.ndarray:
    """Per sequence (token ids, loss mask over the scored tail, start of that tail): summed log-prob."""
    import torch

    from libra_core.training.logprobs import token_logprobs

    out = []
    with torch.no_grad():
        for ids, mask, start in sequences:
            t = torch.tensor([ids])
            lp = token_logprobs(model, t, torch.ones_like(t))[0].numpy()[start - 1 :]
            out.append(float((lp * np.asarray(mask)).sum()))
    return np.asarray(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--iteration",
        type=positive_int,
        default=66,
        help="the first batch (checkpoint iter_N-1 is its policy)",
    )
    parser.add_argument("--updates", type=positive_int, default=1)
    parser.add_argument("--lr", type=non_negative_float, default=1e-4)
    parser.add_argument("--negative-weight", type=non_negative_float, default=1.0)
    parser.add_argument("--no-std", action="store_true", help="advantages not divided by the group std")
    parser.add_argument(
        "--kl", type=non_negative_float, default=0.0, help="k3 KL coefficient to the starting policy"
    )
    parser.add_argument(
        "--demos", type=positive_int, default=64, help="held-out demonstrations per difficulty"
    )
    args = parser.parse_args(argv)
    batches = [
        f"stages/iteration={i:05d}/rewarded.arrow"
        for i in range(args.iteration, args.iteration + args.updates)
    ]
    problem = folder_problem(args.run_dir, ["policy", *batches], "run folder")
    if problem:
        parser.error(problem)
    source = args.run_dir / "checkpoints" / f"iter_{args.iteration - 1:05d}"
    if not (source / "policy").is_dir():
        kept = sorted(p.name for p in (args.run_dir / "checkpoints").glob("iter_*"))
        parser.error(f"{source} is missing; pick --iteration one past a kept checkpoint: {kept}")

    import torch

    from libra_core.config.training import GRPOConfig, OptimizerConfig, TrainingConfig
    from libra_core.data.io import read_ipc
    from libra_core.envs.arithmetic import ArithmeticEnv
    from libra_core.model.sft import SegmentEncoder
    from libra_core.pipeline.rollout_stage import load_tokenizer
    from libra_core.training.advantages import group_advantages
    from libra_core.training.checkpoint import load_policy
    from libra_core.training.update import run_grpo_update

    torch.set_num_threads(1)

    stages = args.run_dir / "stages"
    tables = [
        read_ipc(stages / f"iteration={i:05d}" / "rewarded.arrow", require_reward=True)
        for i in range(args.iteration, args.iteration + args.updates)
    ]
    rows = tables[0].to_pylist()
    batch = [(r["prompt_ids"] + r["response_ids"], r["loss_mask"], len(r["prompt_ids"])) for r in rows]
    env, encoder = ArithmeticEnv(), SegmentEncoder(load_tokenizer(str(args.run_dir / "policy")))
    demos: dict[int, list[tuple[list[int], list[int], int]]] = {}
    for ops in (3, 4):
        problems = [
            p for p in env.sample_problems(6 * args.demos, 999, min_difficulty=ops) if p.difficulty == ops
        ]
        encoded = [encoder.demonstration(env.demonstration(p)) for p in problems[: args.demos]]
        demos[ops] = [(ids, mask[1:], 1) for ids, mask in encoded]  # mask of the targets 1..n-1
    adv = group_advantages(
        np.array([r["reward"] for r in rows]), [r["group_id"] for r in rows], scale_by_std=not args.no_std
    )
    with tempfile.TemporaryDirectory() as tmp:
        policy, state = Path(tmp) / "policy", Path(tmp) / "state"
        shutil.copytree(source / "policy", policy)
        if (source / "trainer").is_dir():  # continue with the run's AdamW state
            shutil.copytree(source / "trainer", state)

        def measure() -> tuple[np.ndarray, dict[int, np.ndarray]]:
            model = load_policy(policy, torch.device("cpu"))
            return _summed(model, batch), {ops: _summed(model, d) for ops, d in demos.items()}

        before, demo_before = measure()
        cfg = TrainingConfig(
            device="cpu",
            threads=1,
            optimizer=OptimizerConfig(lr=args.lr),
            grpo=GRPOConfig(
                negative_weight=args.negative_weight, scale_by_std=not args.no_std, kl_coef=args.kl
            ),
        )
        for k, table in enumerate(tables):
            result = run_grpo_update(
                policy,
                state,
                table,
                cfg,
                version=10_000 + k * cfg.grpo.minibatches,  # past any lr warm-up
                seed=k,
                reference_dir=source / "policy" if args.kl > 0 else None,
            )
        after, demo_after = measure()
    delta = after - before
    for name, chosen in (("advantage>0", adv > 0), ("advantage<0", adv < 0)):
        logps = [
            np.asarray(r["behavior_logprobs"])[np.asarray(r["loss_mask"], dtype=bool)]
            for r, keep in zip(rows, chosen, strict=True)
            if keep
        ]
        print(
            f"batch {args.iteration}, {name}: {len(logps)} trajectories, sampled-token NLL "
            f"{np.mean([-lp.sum() for lp in logps]):.2f} nats each, "
            f"{np.mean([(lp < np.log(0.5)).sum() for lp in logps]):.2f} tokens sampled at p < 0.5"
        )
    print(
        f"{args.updates} update(s), lr {args.lr}, negative weight {args.negative_weight}, "
        f"std {'off' if args.no_std else 'on'}, kl {args.kl}; last clip fraction {result.clip_fraction:.3f}"
    )
    print(
        f"batch {args.iteration}, mean change of summed log-prob: advantage>0 {delta[adv > 0].mean():+.3f}, "
        f"advantage<0 {delta[adv < 0].mean():+.3f}, advantage=0 {delta[adv == 0].mean():+.3f}"
    )
    print(
        "held-out correct demonstrations, mean change of summed log-prob: "
        + ", ".join(
            f"{ops} ops {(demo_after[ops] - demo_before[ops]).mean():+.3f} "
            f"(from {demo_before[ops].mean():.3f})"
            for ops in demos
        )
    )


if __name__ == "__main__":
    main()
