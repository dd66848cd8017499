"""Contract of every registered environment, built from LibraConfig the way the stages build it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libra_core.config.models import LibraConfig
from libra_core.envs.registry import build_environment, environment_factory, registered_environments

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CONFIGS = {
    "arithmetic": {"type": "arithmetic"},
    "math_tools": {"type": "math_tools", "files": ["gsm8k/test.jsonl"]},
    "search": {"type": "search"},
    "code": {"type": "code"},
}


def test_registry_lists_all_environments() -> None:
    assert registered_environments() == sorted(CONFIGS)


def test_environment_factory_returns_the_registered_factory() -> None:
    from libra_core.envs.arithmetic import ArithmeticEnv

    assert environment_factory("arithmetic") is ArithmeticEnv
    # every registered name resolves; the data-backed ones are lazy factory functions
    assert all(callable(environment_factory(name)) for name in CONFIGS)


def test_an_unknown_environment_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown environment type 'chess'; valid: \['arithmetic', 'code'"):
        environment_factory("chess")


def test_environment_without_type_is_arithmetic() -> None:
    cfg = LibraConfig.model_validate({"environment": {"max_ops": 3}})
    assert cfg.environment.type == "arithmetic"


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("prompt_format", ["markers", "chatml"])
def test_environment_contract(name: str, prompt_format: str) -> None:
    if name != "arithmetic" and not DATA.is_dir():
        pytest.skip(f"shared data folder {DATA} is absent")
    if name == "arithmetic" and prompt_format == "chatml":
        pytest.skip("the embedded task has one format")
    raw = dict(CONFIGS[name]) | ({"prompt_format": prompt_format} if name != "arithmetic" else {})
    cfg = LibraConfig.model_validate({"environment": raw})
    env = build_environment(cfg.environment)
    assert env.name == name
    problems = env.sample_problems(5, 7, min_difficulty=3)
    assert len(problems) == 5
    assert [p.prompt_id for p in problems] == [
        p.prompt_id for p in env.sample_problems(5, 7, min_difficulty=3)
    ]
    assert set(env.stop_tokens) <= set(env.special_tokens)
    assert {"<|eos|>", "<|pad|>"} <= set(env.special_tokens)  # a tiny tokenizer can be trained
    for problem in problems:
        segments = env.demonstration(problem)
        assert segments[0].text == env.render_prompt(problem) and not segments[0].trainable
        answer = env.parse_turn(segments[-1].text)
        assert answer.kind == "answer"
        assert env.reward(problem.reference_answer, answer.answer) == cfg.environment.reward.correct
    assert env.corpus(3, 0)


def test_concurrent_first_lookups_register_the_builtins_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two threads both saw the builtins missing and the second raised "already registered" (until
    # 2026-12-07). A slow registration widens the window that a thread switch needed to hit.
    import threading
    import time

    from libra_core.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    real = registry.register_environment

    def slow(name: str, factory: Any) -> None:
        time.sleep(0.01)
        real(name, factory)

    monkeypatch.setattr(registry, "register_environment", slow)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def look_up() -> None:
        barrier.wait()
        try:
            registry.environment_factory("code")
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and registry.registered_environments() == sorted(CONFIGS)
