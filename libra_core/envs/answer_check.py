"""Final-answer checkers used by the reward stage: math equivalence and QA exact match / F1.

Math: `math-verify` (Hugging Face's verifier: LaTeX and plain-expression extraction, then
numeric/symbolic comparison with sympy) when installed; otherwise a small sympy fallback that
compares numbers and simple expressions. Both read answers such as "72", "$72.0$", "1,000",
"\\frac{1}{2}" or "The answer is \\boxed{72}." Called once per trajectory by the reward stage, and
possibly from worker threads: math-verify's signal-based timeouts only work in the main thread, so
they are switched off and inputs are length-capped instead.

QA: the SQuAD normalisation (lower case, no punctuation, no articles, single spaces) with exact
match and token F1 against each gold answer, best over the golds.
"""

from __future__ import annotations

import collections
import logging
import re
import string
from typing import Any

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 400  # longer answers are cut: parsing cost grows with length

try:  # optional dependency: `math-verify`
    from math_verify import parse as _mv_parse
    from math_verify import verify as _mv_verify

    HAVE_MATH_VERIFY = True
    # It warns on every call made with timeouts off; that is deliberate here (see module docstring).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
except ImportError:  # pragma: no cover - exercised only where math-verify is missing
    HAVE_MATH_VERIFY = False


def parse_math(text: str, *, gold: bool = False) -> list[Any]:
    """Parsed candidates of `text` (empty: nothing parseable). Golds are read as a boxed expression."""
    text = text.strip()[:MAX_ANSWER_CHARS]
    if not text:
        return []
    if HAVE_MATH_VERIFY:
        # A bare answer ("6+9i", a pmatrix) reads best as a boxed expression; text with its own
        # delimiters or prose ("The answer is 72") is extracted from as written.
        boxed = f"\\boxed{{{text}}}"
        delimited = "\\boxed" in text or re.search(r"(?<!\\)\$", text) is not None
        sources = [text, boxed] if delimited else [boxed] if gold else [boxed, text]
        for source in sources:
            parsed = _mv_parse(source, parsing_timeout=None)  # type: ignore[arg-type]
            if parsed:
                return list(parsed)
        return []
    value = _fallback_value(text)
    return [] if value is None else [value]


def math_equivalent(reference: str, answer: str) -> bool | None:
    """True/False for a parseable `answer`, None when no answer could be read from it."""
    predicted = parse_math(answer)
    if not predicted:
        return None
    gold = parse_math(reference, gold=True)
    if not gold:
        logger.warning("reference answer %r could not be parsed", reference[:80])
        return False
    if HAVE_MATH_VERIFY:
        return bool(_mv_verify(gold, predicted, timeout_seconds=None))
    return _fallback_equal(gold[0], predicted[0])


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _fallback_value(text: str) -> Any:
    import sympy

    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    candidate = boxed[-1] if boxed else text.strip().strip("$").strip()
    try:
        return sympy.sympify(candidate.replace(",", "").replace("^", "**"))
    except (sympy.SympifyError, TypeError, ValueError, SyntaxError):
        numbers = _NUMBER.findall(text)
        return sympy.Rational(numbers[-1].replace(",", "")) if numbers else None


def _fallback_equal(gold: Any, predicted: Any) -> bool:
    import sympy

    try:
        return bool(sympy.simplify(gold - predicted) == 0)
    except (TypeError, ValueError, AttributeError):
        return str(gold) == str(predicted)


# -- question answering ---------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: list[str]) -> bool:
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in golds)


def token_f1(prediction: str, golds: list[str]) -> float:
    """Best token-level F1 of `prediction` against any gold answer."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
