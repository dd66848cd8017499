"""code reward: answers that game the tests instead of solving the problem get no full reward.

Before 2026-12-06 the tests were pasted after the answer in one module: a function returning an
object whose `__eq__` is always True passed every `assert f(x) == y` (40/40 sampled MBPP rows,
29/30 HumanEval rows), and an answer defining `set` changed what `set(f(x)) == set(y)` tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import CodeEnvConfig
from libra_core.envs.code_harness import answer_names, check_plan, strict_tests
from libra_core.envs.registry import build_environment
from libra_core.envs.strict_values import strict

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ALWAYS_EQUAL = """
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
def {name}(*args, **kwargs):
    return _Any()
"""
# An always-equal original Counter with `collections.Counter` rebound, so a check reading the module
# attribute when it runs no longer recognises the class (every MBPP row scored 1.0 until 2026-12-07).
COUNTER_HACK = """
import collections
_C = collections.Counter
_C.__eq__ = lambda self, other: True
_C.__ne__ = lambda self, other: False
collections.Counter = dict
def {name}(*args, **kwargs):
    return _C()
"""


def _env(tmp_path: Path, *records: dict):  # noqa: ANN202
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return build_environment(CodeEnvConfig(type="code", data_dir=str(tmp_path), files=("code.jsonl",)))


def _reference(env, prompt_id: str) -> str:  # noqa: ANN001
    return next(
        p for p in env.sample_problems(len(env.records), 0) if p.prompt_id == prompt_id
    ).reference_answer


def test_always_equal_and_arithmetic_stubs_fail_while_real_answers_pass(tmp_path: Path) -> None:
    tests = (
        "assert pair(2) == [2, (2.0, 'x')]\n"
        "assert not pair(0) == [1]\n"
        "assert abs(half(1) - 0.5) < 1e-6\n"  # HumanEval's float tolerance keeps its meaning
    )
    pair = "def pair(n):\n    return [n, (n / 1, 'x')]\n"
    env = _env(tmp_path, {"id": "p", "question": "q", "tests": tests})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, f"{pair}def half(x):\n    return x / 2 + 1e-9\n") == 1.0
    assert env.reward(reference, f"{pair}def half(x):\n    return x / 2 + 1e-3\n") == 0.1
    stub = ALWAYS_EQUAL.format(name="pair") + "def half(*args):\n    return _Any()\n"
    assert env.reward(reference, stub) == 0.1
    subtracting = ALWAYS_EQUAL.format(name="half") + pair  # only the `abs(half(1) - 0.5)` test gamed
    assert env.reward(reference, subtracting) == 0.1
    # An int subclass with a friendly __eq__ is not a built-in value either.
    sub = "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
    sub += "def pair(n):\n    return I(0)\ndef half(x):\n    return 0.5\n"
    assert env.reward(reference, sub) == 0.1


def test_a_bare_call_assert_needs_a_real_bool(tmp_path: Path) -> None:
    # MBPP's `assert is_x(n)`: only the outer strict() wrap keeps an always-truthy object from
    # passing it (no `==` for the operand check to hold on to); no test covered that wrap.
    tests = "assert is_even(4)\nassert not is_even(3)\n"
    env = _env(tmp_path, {"id": "e", "question": "q", "tests": tests})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, "def is_even(n):\n    return n % 2 == 0\n") == 1.0
    truthy = "class T:\n    __bool__ = lambda s: True\n"
    truthy += "def is_even(n):\n    return T() if n == 4 else False\n"
    assert env.reward(reference, truthy) == 0.1


def test_an_answer_cannot_redefine_the_builtins_the_tests_use(tmp_path: Path) -> None:
    tests = "assert set(evens(4)) == set([0, 2])\nassert sorted(evens(6)) == [0, 2, 4]\n"
    env = _env(
        tmp_path, {"id": "e", "question": "q", "tests": tests, "solution": "def evens(n):\n    pass\n"}
    )
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, "def evens(n):\n    return (i for i in range(0, n, 2))\n") == 1.0
    shadowing = (
        "def set(*a):\n    return 1\ndef sorted(*a):\n    return [0, 2, 4]\ndef evens(n):\n    return None\n"
    )
    patching = "import builtins\nbuiltins.set = lambda *a: 1\nbuiltins.sorted = lambda *a: [0, 2, 4]\n"
    patching += "def evens(n):\n    return None\n"
    assert env.reward(reference, shadowing) == 0.1
    assert env.reward(reference, patching) == 0.1
    # Items an iterator yields are checked as they are drawn.
    lying = ALWAYS_EQUAL.format(name="_unused") + "def evens(n):\n    return iter([_Any(), _Any()])\n"
    assert env.reward(reference, lying) == 0.1


@pytest.mark.parametrize(
    "patch",
    [
        "_c = builtins.compile\n"
        "builtins.compile = lambda s, f, m, *a, **k: _c('pass' if f == 'tests.py' else s, f, m)\n",
        "_e = builtins.exec\n"
        "builtins.exec = lambda c, *a: None if c.co_filename == 'tests.py' else _e(c, *a)\n",
    ],
    ids=["compile", "exec"],
)
def test_an_answer_cannot_switch_off_the_tests_through_the_harness_builtins(
    tmp_path: Path, patch: str
) -> None:
    # the harness ran the tests with the live builtins.compile/exec: a wrong answer that made them
    # skip tests.py scored correct (MBPP/244, HumanEval/159)
    env = _env(tmp_path, {"id": "e", "question": "q", "tests": "assert evens(4) == [0, 2]\n"})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, "def evens(n):\n    return list(range(0, n, 2))\n") == 1.0
    assert env.reward(reference, f"import builtins\n{patch}def evens(n):\n    return None\n") == 0.1


def test_a_patched_counter_does_not_compare(tmp_path: Path) -> None:
    tests = "from collections import Counter\nassert tally('aab') == Counter({'a': 2, 'b': 1})\n"
    env = _env(tmp_path, {"id": "c", "question": "q", "tests": tests})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert (
        env.reward(reference, "from collections import Counter\ndef tally(s):\n    return Counter(s)\n")
        == 1.0
    )
    patched = "import collections\ncollections.Counter.__eq__ = lambda s, o: True\n"
    patched += "def tally(s):\n    return collections.Counter()\n"
    assert env.reward(reference, patched) == 0.1


def test_a_patched_counter_is_refused_after_collections_counter_is_rebound(tmp_path: Path) -> None:
    env = _env(tmp_path, {"id": "n", "question": "q", "tests": "assert double(2) == 4\n"})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, "def double(x):\n    return 2 * x\n") == 1.0
    assert env.reward(reference, COUNTER_HACK.format(name="double")) == 0.1


def test_humaneval_helpers_come_from_the_prompt_not_the_answer(tmp_path: Path) -> None:
    prompt = "def encode(s):\n    return s[1:] + s[:1]\n\ndef decode(s):\n    '''Undo encode.'''\n"
    check = (
        "def check(candidate):\n    for s in ('abc', 'hello'):\n        assert candidate(encode(s)) == s\n"
    )
    record = {
        "task_id": "HE/1",
        "entry_point": "decode",
        "prompt": prompt,
        "canonical_solution": "    return s[-1:] + s[:-1]\n",
        "test": check,
    }
    env = _env(tmp_path, record)
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert json.loads(reference)["names"] == ["decode"]
    assert env.reward(reference, env.records[0].solution) == 1.0
    # Redefining the prompt's helper as the identity makes decode's job trivial - in the answer only.
    assert env.reward(reference, "def encode(s):\n    return s\ndef decode(s):\n    return s\n") == 0.1
    assert env.reward(reference, "def decode(s):\n    return s\n") == 0.1  # wrong; the stub is not used


def test_an_answer_may_use_the_prompts_imports_and_helpers(tmp_path: Path) -> None:
    # HumanEval's harness runs prompt + completion; here the answer ran without the prompt, so a
    # correct answer repeating the signature `List[int]` without the import raised NameError (22 of
    # 164 prompts import before their def).
    prompt = (
        "from typing import List\n\ndef half(x):\n    return x // 2\n\n"
        'def first(xs: List[int]) -> int:\n    """First."""\n'
    )
    record = {
        "task_id": "HE/2",
        "entry_point": "first",
        "prompt": prompt,
        "canonical_solution": "    return xs[0]\n",
        "test": "def check(candidate):\n    assert candidate([4, 5]) == 4\n",
    }
    env = _env(tmp_path, record)
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert env.reward(reference, "def first(xs: List[int]) -> int:\n    return xs[0]\n") == 1.0
    assert env.reward(reference, "def first(xs: List[int]) -> int:\n    return half(xs[0] * 2)\n") == 1.0
    assert env.reward(reference, "def first(xs: List[int]) -> int:\n    return xs[1]\n") == 0.1


def test_a_module_the_tests_use_unimported_is_a_fresh_one(tmp_path: Path) -> None:
    tests = "assert size((1, 2)) == sys.getsizeof((1, 2))\n"
    solution = "import sys\ndef size(t):\n    return sys.getsizeof(t)\n"
    env = _env(tmp_path, {"id": "s", "question": "q", "tests": tests, "solution": solution})
    reference = env.sample_problems(1, 0)[0].reference_answer
    assert json.loads(reference)["names"] == ["size"]  # `sys` is not taken from the answer
    assert env.reward(reference, solution) == 1.0
    fake = "class sys:\n    getsizeof = staticmethod(lambda t: 0)\ndef size(t):\n    return 0\n"
    assert env.reward(reference, fake) == 0.1


def test_strict_accepts_built_in_values_only() -> None:
    nested = {"a": [1, 2.5, (None, b"x", frozenset({3}))], 2: {True: range(3)}}
    assert strict(nested) is nested
    looped: list = [1]
    looped.append(looped)
    assert strict(looped) is looped
    assert list(strict(iter([1, 2]))) == [1, 2]

    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            return True

        __hash__ = type.__hash__

    for bad in (object(), [1, object()], {"k": Meta("X", (), {})}, Meta("Y", (int,), {})(1)):
        with pytest.raises(AssertionError, match="only built-in"):
            strict(bad)
    with pytest.raises(AssertionError):
        list(strict(iter([object()])))


def test_rewritten_asserts_check_operands_and_keep_everything_else() -> None:
    rewritten = strict_tests("x = f(1)\nassert abs(f(x) - 1.0) < 1e-6, 'msg'\nprint(f(2) == 3)\n")
    assert rewritten.splitlines()[0] == "x = f(1)"
    assert "_libra_strict(abs(_libra_strict(_libra_strict(f(x)) - _libra_strict(1.0))))" in rewritten
    assert rewritten.splitlines()[2] == "print(f(2) == 3)"  # outside an assert: untouched
    assert strict_tests("assert (") == "assert ("  # unparseable: left to fail in the sandbox
    assert answer_names(
        "assert sum(1, 2) == 3\nassert len(x) == 1", "def sum(a, b):\n    return a + b\nx = [1]"
    ) == (
        "sum",
        "x",
    )
    # A reference written before `names` existed takes every non-builtin, non-module name.
    legacy = check_plan(json.dumps({"tests": "import math\nassert f(math.pi) == g"}))
    assert (legacy.names, legacy.modules, legacy.setup) == (("f", "g"), (), "")


@pytest.mark.skipif(not (DATA / "code").is_dir(), reason=f"shared data folder {DATA} is absent")
@pytest.mark.parametrize(
    "prompt_id", ["mbpp-126", "mbpp-596", "mbpp-789", "HumanEval/0", "HumanEval/32", "HumanEval/38"]
)
def test_real_problems_reject_the_always_equal_stub_and_pass_their_reference(prompt_id: str) -> None:
    env = build_environment(CodeEnvConfig(type="code", files=("code/mbpp.jsonl", "code/HumanEval.jsonl.gz")))
    record = env._by_id[prompt_id]
    reference = _reference(env, prompt_id)
    assert env.reward(reference, record.solution) == 1.0
    name = json.loads(reference)["names"][0]
    assert env.reward(reference, ALWAYS_EQUAL.format(name=name)) == 0.1
    assert env.reward(reference, COUNTER_HACK.format(name=name)) == 0.1
