"""Held-out problems: the accuracy after the warm-up and at every evaluation is measured on
problems that neither the warm-up nor the rollouts ever draw."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from libra_core.config.environments import CodeEnvConfig, MathToolsEnvConfig, SearchEnvConfig
from libra_core.config.models import ArithmeticEnvConfig
from libra_core.config.training import WarmupConfig
from libra_core.envs.arithmetic import ArithmeticEnv
from libra_core.envs.base import Problem, Segment
from libra_core.envs.registry import build_environment
from libra_core.envs.splits import EVAL_SHARE, demonstration_texts, eval_problems, sample_split, split_of
from libra_core.model.sft import warmup_batch

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
_ENV_CONFIGS = {
    "arithmetic": ArithmeticEnvConfig(),
    "math_tools": MathToolsEnvConfig(type="math_tools"),
    "search": SearchEnvConfig(type="search"),
    "code": CodeEnvConfig(type="code"),
}


def test_a_problem_has_one_split_and_one_in_eight_is_held_out() -> None:
    ids = [f"p{i}" for i in range(8000)]
    assert [split_of(i) for i in ids] == [split_of(i) for i in ids]
    held_out = sum(split_of(i) == "eval" for i in ids) / len(ids)
    assert abs(held_out - 1 / EVAL_SHARE) < 0.01, held_out


def test_the_warm_up_never_sees_an_arithmetic_eval_problem() -> None:
    # One-operation problems are few (243 here), so seeds alone put them in both sets.
    env = ArithmeticEnv(ArithmeticEnvConfig())
    held_out = eval_problems(env, seed=0, n=64)
    assert len(held_out) == 64 and all(split_of(p.prompt_id) == "eval" for p in held_out)
    assert {p.difficulty for p in held_out} == {1, 2, 3, 4}  # still spans the difficulties
    steps = WarmupConfig().steps
    seen = {p.question for step in range(steps) for p in _questions(warmup_batch(env, 0, step, 64))}
    assert len(seen) > 5000  # the warm-up covers the small problems many times over
    assert not seen & {p.question for p in held_out}


@pytest.mark.parametrize("env_type", ["arithmetic", "math_tools", "search", "code"])
def test_the_tokenizer_corpus_holds_no_eval_problem(env_type: str) -> None:
    # The corpus is the environment's demonstrations: drawn from the train split, a held-out
    # problem's text never shapes the vocabulary.
    if env_type != "arithmetic" and not DATA.is_dir():
        pytest.skip(f"shared data folder {DATA} is absent")
    env = build_environment(_ENV_CONFIGS[env_type])
    corpus = set(env.corpus(200, 0))
    drawn = env.sample_problems(400, 7)
    held_out = {_demo_text(env, p) for p in drawn if split_of(p.prompt_id) == "eval"}
    trained = {_demo_text(env, p) for p in drawn if split_of(p.prompt_id) == "train"}
    assert len(held_out) >= 10 and not corpus & held_out
    assert corpus & trained  # the same comparison finds the train split's demonstrations


def _demo_text(env, problem: Problem) -> str:  # noqa: ANN001
    return "".join(s.text for s in env.demonstration(problem))


def _questions(demos: list) -> list[Problem]:
    # a demonstration's first segment is the prompt: <|user|>QUESTION<|assistant|>
    return [Problem("", demo[0].text.split("<|user|>")[1].split("<|assistant|>")[0], "", 0) for demo in demos]


def test_rollout_problems_come_from_the_train_split_and_are_reproducible() -> None:
    env = ArithmeticEnv(ArithmeticEnvConfig())
    drawn = sample_split(env, 16, 12345, "train", min_difficulty=3)
    assert drawn == sample_split(env, 16, 12345, "train", min_difficulty=3)
    assert len(drawn) == 16 and all(split_of(p.prompt_id) == "train" and p.difficulty >= 3 for p in drawn)
    # the train split keeps most of the environment's own stream
    own = env.sample_problems(16, 12345, min_difficulty=3)
    assert sum(p in own for p in drawn) >= 12


def test_an_environment_too_small_to_hold_a_set_out_says_so(caplog: pytest.LogCaptureFixture) -> None:
    env = ArithmeticEnv(ArithmeticEnvConfig(max_ops=1, max_operand=1, operators=("+",)))  # only (1+1)
    split = split_of(env.sample_problems(1, 0)[0].prompt_id)
    other = "train" if split == "eval" else "eval"
    with caplog.at_level(logging.WARNING, logger="libra_core.envs.splits"):
        drawn = sample_split(env, 3, 0, other)
    assert [p.question for p in drawn] == ["(1+1)"] * 3
    assert "not held out" in caplog.text


@pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_gsm8k_eval_problems_are_outside_the_warm_ups_draws() -> None:
    env = build_environment(MathToolsEnvConfig(type="math_tools"))
    held_out = {p.prompt_id for p in eval_problems(env, seed=0, n=64)}
    assert len(held_out) == 64
    trained = {p.prompt_id for step in range(200) for p in sample_split(env, 64, step, "train")}
    assert len(trained) > 5000 and not trained & held_out


class _ListEnv:
    """A dataset of `size` problems sampled like the data-backed environments (no repeats while the
    pool lasts): every round of `sample_split` meets problems of earlier rounds again."""

    name = "list"

    def __init__(self, size: int) -> None:
        self.problems = [Problem(f"p{i}", f"q{i}", "a", 1) for i in range(size)]

    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]:
        import random

        rng = random.Random(seed)
        out: list[Problem] = []
        while len(out) < n:
            out += rng.sample(self.problems, min(n - len(out), len(self.problems)))
        return out


def test_a_set_has_no_repeats_while_the_split_has_enough_distinct_problems(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = _ListEnv(400)  # about 50 eval problems
    n_eval = sum(split_of(p.prompt_id) == "eval" for p in env.problems)
    with caplog.at_level(logging.WARNING, logger="libra_core.envs.splits"):
        for seed in range(20):
            held_out = eval_problems(env, seed, n_eval - 2)
            assert len({p.prompt_id for p in held_out}) == n_eval - 2, seed
            assert all(split_of(p.prompt_id) == "eval" for p in held_out)
            train = sample_split(env, 300, seed, "train")
            assert len({p.prompt_id for p in train}) == 300 and not {p.prompt_id for p in train} & {
                p.prompt_id for p in held_out
            }
    assert caplog.text == ""
    assert eval_problems(env, 3, 40) == eval_problems(env, 3, 40)  # reproducible from the seed


def test_a_split_too_small_for_the_set_repeats_its_own_problems(caplog: pytest.LogCaptureFixture) -> None:
    env = _ListEnv(400)
    eval_ids = {p.prompt_id for p in env.problems if split_of(p.prompt_id) == "eval"}
    with caplog.at_level(logging.WARNING, logger="libra_core.envs.splits"):
        held_out = eval_problems(env, 0, 2 * len(eval_ids))
    assert len(held_out) == 2 * len(eval_ids)
    assert {p.prompt_id for p in held_out} == eval_ids  # every one, and nothing of the train split
    assert "the set repeats them" in caplog.text


class _DemoEnv(_ListEnv):
    def demonstration(self, problem: Problem) -> list[Segment]:
        return [Segment(problem.question, trainable=True)]


def test_the_corpus_keeps_the_environments_draws_less_the_eval_split(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Repeats and the environment's order are kept (a small dataset repeats, as its own draws do);
    # asking for distinct problems skewed the arithmetic mix and warned for every small dataset.
    env = _DemoEnv(size=40)
    with caplog.at_level(logging.WARNING, logger="libra_core.envs.splits"):
        texts = demonstration_texts(env, 100, 0)
    assert len(texts) == 100 and not caplog.text
    own = [p.question for p in env.sample_problems(100, 0) if split_of(p.prompt_id) == "train"]
    assert 80 <= len(own) < 100 and texts[: len(own)] == own
    held_out = {p.question for p in env.problems if split_of(p.prompt_id) == "eval"}
    assert held_out and not held_out & set(texts)
