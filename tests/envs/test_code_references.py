"""MBPP and HumanEval reference solutions pass their own tests through the code reward, and an
always-equal stub (an object of its own, or a patched Counter) passes none (slow). All 1,138 were
checked once (2,276 sandboxed runs, 202 s on 2 shared cores, 2026-12-06: 1,138 pass, 0 gamed); CI
checks every HumanEval problem and every fourth MBPP one, about a third of the time."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.registry import build_environment
from tests.envs.test_code_reward_hacks import ALWAYS_EQUAL, COUNTER_HACK, DATA

# the always-equal class (and an unused stub function), as the reward-hack tests define it
STUB = ALWAYS_EQUAL.format(name="_unused_stub")
# an always-equal original Counter with `collections.Counter` rebound (scored 1.0 until 2026-12-07)
COUNTER_STUB = COUNTER_HACK.format(name="_unused_stub")


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "code").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_all_reference_solutions_pass_and_always_equal_stubs_do_not() -> None:
    env = build_environment(CodeEnvConfig(type="code", files=("code/mbpp.jsonl", "code/HumanEval.jsonl.gz")))
    problems = {p.prompt_id: p for p in env.sample_problems(len(env.records), 0)}
    assert len(problems) == len(env.records) == 1138
    sample = [r for i, r in enumerate(env.records) if r.id.startswith("HumanEval/") or i % 4 == 0]
    assert len(sample) > 400

    def check(record: Any) -> tuple[bool, bool]:
        """(the reference solution fails, an always-equal stub passes)"""
        reference = problems[record.id].reference_answer
        fails = env.reward(reference, record.solution) != env.cfg.reward.correct
        # Every name the tests take from the answer returns an always-equal object.
        names = json.loads(reference)["names"]
        stubs = (
            STUB + "".join(f"def {name}(*args, **kwargs):\n    return _Any()\n" for name in names),
            COUNTER_STUB + "".join(f"def {name}(*args, **kwargs):\n    return _C()\n" for name in names),
        )
        return fails, any(env.reward(reference, stub) == env.cfg.reward.correct for stub in stubs)

    # Two at a time, as the rollout's threads call the sandbox: each check is a child process.
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(check, sample))
    failing = [r.id for r, (fails, _) in zip(sample, outcomes, strict=True) if fails]
    gamed = [r.id for r, (_, passes) in zip(sample, outcomes, strict=True) if passes]
    assert failing == [] and gamed == []
