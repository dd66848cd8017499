"""MBPP and HumanEval reference solutions pass their own tests through the code reward, and an
always-equal stub passes none (slow). All 1,138 were checked once (2,276 sandboxed runs, 202 s on 2
shared cores, 2026-12-06: 1,138 pass, 0 gamed); CI checks every HumanEval problem and every fourth
MBPP one, about a third of the time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.registry import build_environment

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
STUB = """
class _Any:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self): return True
    def __abs__(self): return 0
    def __sub__(self, other): return 0
    __rsub__ = __sub__
    def __iter__(self): return iter(())
    def __len__(self): return 0
    __hash__ = None
"""


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "code").is_dir(), reason=f"shared data folder {DATA} is absent")
def test_all_reference_solutions_pass_and_always_equal_stubs_do_not() -> None:
    env = build_environment(CodeEnvConfig(type="code", files=("code/mbpp.jsonl", "code/HumanEval.jsonl.gz")))
    problems = {p.prompt_id: p for p in env.sample_problems(len(env.records), 0)}
    assert len(problems) == len(env.records) == 1138
    failing, gamed = [], []
    sample = [r for i, r in enumerate(env.records) if r.id.startswith("HumanEval/") or i % 4 == 0]
    assert len(sample) > 400
    for record in sample:
        reference = problems[record.id].reference_answer
        if env.reward(reference, record.solution) != env.cfg.reward.correct:
            failing.append(record.id)
        # Every name the tests take from the answer returns an always-equal object.
        names = json.loads(reference)["names"]
        stub = STUB + "".join(f"def {name}(*args, **kwargs):\n    return _Any()\n" for name in names)
        if env.reward(reference, stub) == env.cfg.reward.correct:
            gamed.append(record.id)
    assert failing == [] and gamed == []
