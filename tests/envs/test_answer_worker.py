"""The math answer-check worker: same verdicts as in-process, a hard deadline, restarts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libra_core.config.environments import MathToolsEnvConfig
from libra_core.envs.answer_check import math_equivalent, refusal
from libra_core.envs.answer_worker import AnswerCheckWorker
from libra_core.envs.registry import build_environment

# The screen lets this through, and sympy spends tens of seconds on it (answer_check_cost.py --slow).
SLOW_ANSWER = "\\boxed{\\tan(\\tan(\\tan(\\tan(x+1)+2)+3)+4)}"
CASES = [
    ("72", "so the answer is \\boxed{72}.", True),
    ("72", "\\boxed{71}", False),
    ("\\frac{1}{2}", "$0.5$", True),
    ("72", "\\boxed{}", None),  # nothing to read
    ("72", "\\boxed{9^{9^{9}}}", False),  # refused by the screen
    ("12", "é \udcff \\boxed{12}", True),  # a lone surrogate crosses the pipe
]


@pytest.fixture
def worker() -> Iterator[AnswerCheckWorker]:
    w = AnswerCheckWorker(timeout_s=2.0)
    yield w
    w.close()


def test_worker_verdicts_match_in_process_checks(worker: AnswerCheckWorker) -> None:
    for reference, answer, expected in CASES:
        assert math_equivalent(reference, answer) is expected, answer
        assert worker.math_equivalent(reference, answer) is expected, answer
    assert worker.restarts == 0


def test_a_check_past_the_deadline_is_wrong_and_the_next_one_runs(worker: AnswerCheckWorker) -> None:
    assert refusal(SLOW_ANSWER[len("\\boxed{") : -1]) is None  # the screen alone would not stop it
    start = time.monotonic()
    assert worker.math_equivalent("1", SLOW_ANSWER) is False
    assert time.monotonic() - start < 10  # the deadline (2 s) plus the kill, not sympy's ~27 s
    assert worker.restarts == 1
    assert worker.math_equivalent("72", "\\boxed{72}") is True
    assert worker.restarts == 1


def test_a_worker_that_died_while_idle_is_restarted(worker: AnswerCheckWorker) -> None:
    assert worker.math_equivalent("3", "\\boxed{3}") is True
    assert worker._process is not None
    worker._process.kill()
    worker._process.wait()
    assert worker.math_equivalent("3", "\\boxed{3}") is True


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        AnswerCheckWorker(timeout_s=0)


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_math_env_reward_uses_the_deadline() -> None:
    cfg = MathToolsEnvConfig(type="math_tools", files=("gsm8k/test.jsonl",), answer_check_timeout_s=1.0)
    env = build_environment(cfg)
    weights = cfg.reward
    start = time.monotonic()
    assert env.reward("1", SLOW_ANSWER) == weights.well_formed
    assert time.monotonic() - start < 10
    assert env.reward("72", "\\boxed{72}") == weights.correct
    assert env.reward("72", "\\boxed{70}") == weights.well_formed
    assert env.reward("72", "\\boxed{}") == weights.malformed


@pytest.mark.skipif(not (DATA / "math").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_cost_benchmark_checks_math500_the_same_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.benchmarks.support import load_script

    load_script("answer_check_cost").main(["--data", str(DATA), "--n", "40"])
    out = capsys.readouterr().out
    assert "80 checks of 40 records" in out
    assert "verdicts equal: True; correct self-checks: 40" in out
    assert "restarts: 0" in out
