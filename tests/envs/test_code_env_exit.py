"""code reward: exiting early must not pass the tests; visible tests and demonstrations hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import CodeEnvConfig, SandboxConfig
from libra_core.envs.registry import build_environment
from libra_core.envs.sandbox import namespaces_available

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
CORRECT = "def add(a, b):\n    return a + b\n"
EXIT_HACKS = {
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "raise SystemExit": "raise SystemExit\n",
    "exit()": "exit()\n",
    "exit after defining": "def add(a, b):\n    return 0\nraise SystemExit(0)\n",
    "replaced stdout": "import io, sys\nsys.stdout = io.StringIO()\nsys.exit(0)\n",
}
ISOLATIONS = [
    "rlimits",
    pytest.param(
        "namespaces",
        marks=pytest.mark.skipif(not namespaces_available(), reason="needs root and util-linux unshare"),
    ),
]


def _env(tmp_path: Path, isolation: str = "rlimits"):  # noqa: ANN202
    record = {"id": "add", "question": "Write add(a, b).", "tests": TESTS, "solution": CORRECT}
    (tmp_path / "code.jsonl").write_text(json.dumps(record) + "\n")
    cfg = CodeEnvConfig(
        type="code", data_dir=str(tmp_path), files=("code.jsonl",), sandbox=SandboxConfig(isolation=isolation)
    )
    return build_environment(cfg)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_exiting_before_the_tests_is_not_correct(tmp_path: Path, isolation: str) -> None:
    env = _env(tmp_path, isolation)
    reference = env.sample_problems(1, 0)[0].reference_answer
    weights = env.cfg.reward
    for name, hack in EXIT_HACKS.items():
        assert env.reward(reference, hack) == weights.well_formed, name
        assert env.reward(reference, f"```python\n{hack}```") == weights.well_formed, name
    # ... while correct answers still pass, also when they print (under the 64 KiB cap) or replace
    # sys.stdout, and a wrong one does not.
    chatty = f"{CORRECT}for i in range(2000):\n    print('line', i)\n"
    redirected = f"import io, sys\nsys.stdout = io.StringIO()\nprint('hidden')\n{CORRECT}"
    for answer in (CORRECT, chatty, redirected):
        assert env.reward(reference, answer) == weights.correct, answer
    assert env.reward(reference, "def add(a, b):\n    return a - b\n") == weights.well_formed


def test_libra_format_visible_test_is_a_complete_statement(tmp_path: Path) -> None:
    tests = "x = [1,\n     2]\nassert add(x[0],\n           x[1]) == 3\nassert add(0, 0) == 0\n"
    record = {"id": "add", "question": "Write add(a, b).", "tests": tests, "solution": CORRECT}
    (tmp_path / "code.jsonl").write_text(json.dumps(record) + "\n")
    env = build_environment(CodeEnvConfig(type="code", data_dir=str(tmp_path), files=("code.jsonl",)))
    visible = env.records[0].visible_test
    assert visible == "x = [1,\n     2]\nassert add(x[0],\n           x[1]) == 3"
    trial = env.run_tool(env.parse_turn(env.demonstration(env.sample_problems(1, 0)[0])[1].text))
    assert (trial.status, trial.observation) == ("success", "ok")


@pytest.mark.skipif(not (DATA / "code").is_dir(), reason=f"shared data folder {DATA} is absent")
@pytest.mark.parametrize(
    "prompt_id",
    ["HumanEval/1", "HumanEval/87", "HumanEval/38", "HumanEval/4", "mbpp-367", "mbpp-927"],
)
def test_visible_tests_parse_and_demonstrations_show_the_real_observation(prompt_id: str) -> None:
    import ast

    env = build_environment(CodeEnvConfig(type="code", files=("code/mbpp.jsonl", "code/HumanEval.jsonl.gz")))
    record = env._by_id[prompt_id]
    if prompt_id != "HumanEval/38":  # its asserts all use the test's loop variables
        assert record.visible_test, prompt_id
        ast.parse(record.visible_test)
        assert "candidate" not in record.visible_test
    if prompt_id.startswith("mbpp"):
        assert record.prompt.endswith(record.visible_test)  # the prompt shows what the test needs
    problem = next(p for p in env.sample_problems(len(env.records), 0) if p.prompt_id == prompt_id)
    demo = env.demonstration(problem)
    result = env.run_tool(env.parse_turn(demo[1].text))
    assert (result.status, env.format_observation(result)) == ("success", demo[2].text)
