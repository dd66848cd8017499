"""Train and held-out problems: every problem belongs to one split, fixed by a hash of its id.

The SFT warm-up and the RL rollouts draw from the `train` split; the greedy accuracy measured
after the warm-up and every `eval.every` iterations draws from `eval`. The tokenizer's corpus draws
from `train` too (`demonstration_texts`): a held-out problem's text shapes neither the vocabulary nor
a training target (until 2026-12-07 the corpus drew from both splits). Different seeds alone do
not hold a set out: GSM8K's 7,473 problems are nearly all seen by a 350-step warm-up of 64
demonstrations, and the arithmetic task has only 243 one-operation problems.

The split is a property of the problem (its `prompt_id`), not of the seed or the environment's
sampler, so it holds for every environment without changing how each one samples: problems are
drawn from the environment and those of the other split are dropped.
"""

from __future__ import annotations

import hashlib
import logging
import random
from typing import Literal

from libra_core.envs.base import Environment, Problem

log = logging.getLogger(__name__)

Split = Literal["train", "eval"]
EVAL_SHARE = 8  # one problem in eight is held out
MAX_ROUNDS = 64  # draws before giving up on filling a split (an environment with too few problems)
EVAL_SEED_OFFSET = 1_000_003  # the eval set's seed: the run's seed + this


def split_of(prompt_id: str) -> Split:
    """The split a problem belongs to, the same in every run and process."""
    digest = hashlib.sha256(prompt_id.encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_SHARE == 0 else "train"


def sample_split(
    env: Environment, n: int, seed: int, split: Split, *, min_difficulty: int | None = None
) -> list[Problem]:
    """`n` distinct problems of `split`, reproducible from `seed`, in the environment's sampling order.

    Draws from `env.sample_problems` (the first draw with `seed` itself, so the train split keeps
    most of an environment's own stream) and keeps the problems of `split` not kept already (each
    round draws afresh, so it meets problems of earlier rounds again). A split with fewer than `n`
    distinct problems found in `MAX_ROUNDS` draws repeats them, with a warning; one with none (a
    one-problem test dataset, say) is filled from the other split, with a warning: the set is then
    not held out.
    """
    if n <= 0:
        return []
    kept: dict[str, Problem] = {}  # by prompt_id, in the order first drawn
    others: dict[str, Problem] = {}
    per_round = n if split == "train" else n * EVAL_SHARE
    for round_ in range(MAX_ROUNDS):
        round_seed = seed if round_ == 0 else random.Random(f"split:{seed}:{round_}").getrandbits(63)
        for problem in env.sample_problems(per_round, round_seed, min_difficulty=min_difficulty):
            found = kept if split_of(problem.prompt_id) == split else others
            found.setdefault(problem.prompt_id, problem)
            if len(kept) >= n:
                return list(kept.values())
    if kept:
        log.warning(
            "environment %s has %d distinct %s problems for a set of %d; the set repeats them",
            env.name,
            len(kept),
            split,
            n,
        )
        return _cycled(list(kept.values()), n)
    log.warning(
        "environment %s has no %s problems for a set of %d; it comes from the other split, so it "
        "is not held out",
        env.name,
        split,
        n,
    )
    return _cycled(list(others.values()), n)


def _cycled(problems: list[Problem], n: int) -> list[Problem]:
    return [problems[i % len(problems)] for i in range(n)]


def demonstration_texts(env: Environment, n: int, seed: int) -> list[str]:
    """The worked demonstrations of `n` train-split problems: the body of an environment's `corpus`.

    Drawn as the environment samples (its difficulty mix and its repeats kept; a dataset smaller
    than `n` repeats, as it always did), with the eval split's problems dropped. `sample_split`
    would ask for distinct problems, which skews the arithmetic mix towards the larger difficulties
    and warns for every small dataset. An environment with no train problem at all falls back to
    `sample_split`, which says so."""
    kept: list[Problem] = []
    for round_ in range(MAX_ROUNDS):
        round_seed = seed if round_ == 0 else random.Random(f"corpus:{seed}:{round_}").getrandbits(63)
        kept += [p for p in env.sample_problems(n, round_seed) if split_of(p.prompt_id) == "train"]
        if len(kept) >= n:
            break
    problems = kept[:n] if kept else sample_split(env, n, seed, "train")
    return ["".join(s.text for s in env.demonstration(p)) for p in _cycled(problems, n)]


def eval_problems(env: Environment, seed: int, n: int) -> list[Problem]:
    """The run's held-out set: the same `n` problems after the warm-up and at every evaluation."""
    return sample_split(env, n, seed + EVAL_SEED_OFFSET, "eval")
