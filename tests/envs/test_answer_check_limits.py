"""The math answer checker's bounds: it reads the final answer of a long turn, refuses answers that
would build huge numbers before parsing them (math-verify runs with its timeouts off and sympy's
big-integer code cannot be interrupted), reads plain prose answers, and needs math-verify."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_core.envs import answer_check
from libra_core.envs.answer_check import final_answer_text, math_equivalent, parse_math, refusal

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MATH500 = DATA / "math" / "math500_test.jsonl"
REPO = Path(__file__).resolve().parents[2]

# 520 characters of reasoning with intermediate values (24, 48) before the final answer.
REASONING = (
    "Natalia sold 48 clips in April. In May she sold half as many, 48/2 = 24 clips. "
    "Altogether she sold 48 + 24 clips. Let me double check each step carefully. "
) * 3 + "Adding the two months once more gives the total below. " * 3


# -- defect 1: the final answer of a long turn ------------------------------------------------------
@pytest.mark.parametrize("ending", ["So the final answer is \\boxed{72}.<|im_end|>", "The answer is 72"])
def test_a_final_answer_after_long_reasoning_is_read(ending: str) -> None:
    turn = REASONING + ending
    assert len(REASONING) > answer_check.MAX_ANSWER_CHARS
    assert math_equivalent("72", turn) is True
    assert math_equivalent("24", turn) is False  # an intermediate value of the reasoning is not the answer


def test_a_wrong_final_answer_is_not_matched_against_the_reasoning() -> None:
    turn = REASONING + "So the final answer is \\boxed{99}."
    assert math_equivalent("24", turn) is False
    assert math_equivalent("48", turn) is False
    assert math_equivalent("99", turn) is True


def test_the_last_balanced_box_is_the_answer() -> None:
    assert final_answer_text("first \\boxed{1}, then \\boxed{\\frac{1}{2}} done") == "\\boxed{\\frac{1}{2}}"
    assert final_answer_text("\\boxed{\\{1, 2\\}}.") == "\\boxed{\\{1, 2\\}}"
    assert math_equivalent("\\frac{1}{2}", "x" * 600 + " so \\boxed{\\frac{1}{2}}") is True
    assert math_equivalent("72", "I first thought \\boxed{72} but it is \\boxed{73}") is False
    # An unclosed last box is still the answer: the tail read instead held the earlier box, and a
    # retracted "\boxed{5} is wrong, it's \boxed{6" scored correct for 5 (until 2026-12-07).
    assert final_answer_text("\\boxed{72} and \\boxed{7") == "\\boxed{7"
    retracted = "\\boxed{5} is wrong, it's \\boxed{6"
    assert (math_equivalent("5", retracted), math_equivalent("6", retracted)) == (False, True)
    assert math_equivalent("5", "\\boxed{5} then \\boxed{") is None  # an empty last box: no answer


# -- defect 2: answers that would build huge numbers are refused before parsing ----------------------
HUGE = [
    "\\boxed{9^{9^{9}}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{100!!}",
    "\\boxed{2^{2^{30}}}",
    "\\boxed{(10^{6})!}",
    "\\boxed{Answer:\n9**9**9",  # a fuzz case that stalled forever
    "9**9**9**9",
    "\\boxed{9^\\left(9^{9}\\right)}",
    "\\boxed{10^{99}^{99}}",
    "\\boxed{2^{123456}}",
    "\\boxed{2^{999*999*999}}",
    "\\boxed{((10^{99})^{99})^{99}}",
    "\\boxed{1000!^{99}}",
    "\\boxed{1001!}",
    "The total is $1001!$",  # a factorial in math mode, in prose: still refused
    "The total is \\boxed{1001!} today",
    "\\boxed{" + "9" * 101 + "}",
    "\\boxed{(x+1)^{999}}",
    "\\boxed{(x+y+z+w+v+u+1)^{12}}",
    "\\boxed{\\sum_{k=1}^{1000} k^k}",
    "\\boxed{\\binom{1000000}{500000}}",
    "\\boxed{\\binom{10^{9}}{10^{8}}}",
    "\\boxed{" + "1+" * 300 + "1}",  # a box longer than MAX_ANSWER_CHARS
]


@pytest.mark.parametrize("answer", HUGE)
def test_answers_that_build_huge_numbers_are_refused_at_once(answer: str) -> None:
    # The lexical screen first: if it stops refusing, this fails here instead of hanging the suite.
    assert refusal(final_answer_text(answer)) is not None
    start = time.perf_counter()
    assert math_equivalent("72", answer) is False  # a well-formed wrong answer
    assert parse_math(answer) == []
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("reference", "answer"),
    [
        ("2^{2005}", "\\boxed{2^{2005}}"),
        ("720", "\\boxed{6!}"),
        ("3628800", "\\boxed{10!}"),
        ("x^5 - x^4 + x^3 - x^2 + x - 1", "\\boxed{x^5 - x^4 + x^3 - x^2 + x - 1}"),
        ("x^2 + 2x + 1", "\\boxed{(x+1)^{2}}"),
        ("90^\\circ", "\\boxed{90^\\circ}"),
        ("10080", "\\boxed{10,\\!080}"),
        ("385", "\\boxed{\\sum_{k=1}^{10} k^2}"),
        ("120", "\\boxed{\\binom{10}{3}}"),
        ("1024", "2^{10}"),
        ("72", "The answer is 72!"),  # an exclamation, not 72!
        # Refused as factorials until 2026-12-06 (the number over 1000, the closing dollar): scored
        # wrong though math-verify reads the number, as it reads "72!" above.
        ("1500", "The total is 1500!"),
        ("72", "The answer is $72$!"),
        # An escaped dollar: math-verify found nothing, and the whole sentence parsed as a string.
        ("18", "Janet makes \\$18 every day."),
        ("\\frac{\\sqrt{2}}{2}", "\\boxed{e^{i\\pi/4} \\cdot 0 + \\frac{1}{\\sqrt{2}}}"),
    ],
)
def test_ordinary_powers_and_factorials_still_verify(reference: str, answer: str) -> None:
    assert refusal(final_answer_text(answer)) is None
    assert math_equivalent(reference, answer) is True


def test_no_gsm8k_reference_answer_is_refused() -> None:
    path = DATA / "gsm8k" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"shared data folder {DATA} is absent")
    golds = [json.loads(line)["answer"].split("####")[-1].strip() for line in path.open()]
    assert len(golds) == 1319
    assert [g for g in golds if refusal(final_answer_text(g))] == []


@pytest.mark.skipif(not MATH500.is_file(), reason=f"shared data folder {DATA} is absent")
def test_every_math500_answer_passes_the_screen_and_matches_itself() -> None:
    refs = [json.loads(line)["answer"] for line in MATH500.open()]
    assert len(refs) == 500
    assert [r for r in refs if refusal(final_answer_text(r))] == []  # golds are never refused
    assert [r for r in refs if not math_equivalent(r, r)] == []
    assert [r for r in refs if not math_equivalent(r, f"The answer is \\boxed{{{r}}}.")] == []
    assert [r for r in refs if not math_equivalent(r, f"{REASONING}So the answer is \\boxed{{{r}}}.")] == []


# -- markdown emphasis in a prose answer ------------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    [
        "The **total** cost is 18 dollars.",
        "Janet earns 18 dollars per day. **Done**",
        "So she makes **18** dollars per day.",
        "**Answer**: 18",
        "The answer is __18__.",
        "So the answer is *18*.",
        "So the answer is ***18***.",
        "The answer is ___18___.",
    ],
)
def test_a_bold_or_italic_word_is_no_power_and_the_answer_reads(answer: str) -> None:
    # `**18**` was read as a chain of powers: a correct unboxed answer scored well formed (0.1).
    assert refusal(final_answer_text(answer)) is None
    assert math_equivalent("18", answer) is True
    assert math_equivalent("17", answer) is False


@pytest.mark.parametrize("answer", ["2**3**4**5", "(2)**3**40", "The answer is 2**100**3"])
def test_powers_written_with_stars_are_still_screened(answer: str) -> None:
    assert refusal(final_answer_text(answer)) == "a chain of powers"


# -- defect 3: prose answers are read as written ---------------------------------------------------
@pytest.mark.parametrize(
    ("reference", "answer"),
    [("72", "The answer is 72"), ("72", "72 dollars"), ("18", "So she has 18 apples left")],
)
def test_prose_answers_are_read_as_written(reference: str, answer: str) -> None:
    assert math_equivalent(reference, answer) is True  # was False: read as t*h*e*a*n*s*w*e*r*i*s*72
    assert math_equivalent("71", answer) is False


@pytest.mark.parametrize(
    ("reference", "answer", "expected"),
    [
        ("72", "The answer is 72.", True),
        ("72", "I do not know", False),  # parseable as symbols: well formed, wrong
        ("6+9i", "6 + 9i", True),  # a bare expression reads as one, not as its last number
        ("x^3+3x-6", "x^3 + 3x - 6", True),
        ("864 \\mbox{ inches}^2", "864 \\mbox{ inches}^2", True),
        (
            "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
            "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
            True,
        ),
        ("72", "72", True),
        ("3", "x = 3", True),
    ],
)
def test_bare_expressions_still_read_as_boxed(reference: str, answer: str, expected: bool) -> None:
    assert math_equivalent(reference, answer) is expected


# -- defect 4: no sympify fallback; a missing math-verify is a clear error ----------------------------
def test_without_math_verify_the_checker_raises_and_evaluates_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    monkeypatch.setattr(answer_check, "HAVE_MATH_VERIFY", False)
    for call in (
        lambda: math_equivalent("72", f"__import__('os').system('touch {marker}')"),
        lambda: math_equivalent("72", "72"),
        lambda: parse_math("72"),
    ):
        with pytest.raises(ImportError, match=r"math-verify.*pip install"):
            call()
    assert not marker.exists()
    assert not hasattr(answer_check, "_fallback_value")


def test_the_module_imports_without_math_verify_and_fails_when_used() -> None:
    code = (
        "import sys; sys.modules['math_verify'] = None\n"
        "from libra_core.envs import answer_check as ac\n"
        "assert not ac.HAVE_MATH_VERIFY and ac.exact_match('Paris', ['paris'])\n"
        "try:\n    ac.math_equivalent('72', '72')\nexcept ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install" in out.stdout and "math-verify" in out.stdout
