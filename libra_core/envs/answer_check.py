"""Final-answer checkers used by the reward stage: math equivalence and QA exact match / F1.

Math: `math-verify` (Hugging Face's verifier: LaTeX and plain-expression extraction, then
numeric/symbolic comparison with sympy), a pinned dependency; without it the math checker raises
ImportError when first used. It reads answers such as "72", "$72.0$", "1,000", "\\frac{1}{2}",
"The answer is 72" or "The answer is \\boxed{72}." Called once per trajectory by the reward stage,
and possibly from worker threads: math-verify's signal-based timeouts only work in the main thread
(and cannot stop sympy's big-integer C code anyway), so they are switched off and inputs are bounded
before parsing instead:

- Only the final answer is read: the last `\\boxed{...}` of the text if there is one (to the end
  of the text if unclosed; a chatml answer is the whole assistant turn, reasoning first), else its
  last MAX_ANSWER_CHARS characters.
- `refusal` screens that text for what would build a huge number or expression (power towers, `**`
  chains, long exponents, factorials of large or non-literal arguments, numbers of more than
  MAX_DIGITS digits, large symbolic expansions, big-operator sums). Such an answer is not parsed and
  counts as a well-formed wrong answer. All MATH-500 reference answers pass the screen.

QA: the SQuAD normalisation (lower case, no punctuation, no articles, single spaces) with exact
match and token F1 against each gold answer, best over the golds.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import string
from typing import Any

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 400  # text read when there is no \boxed{}; a longer \boxed{} is refused
MAX_DIGITS = 100  # digits of one number (1,000,000 counts 7)
MAX_EXPONENT_DIGITS = 4  # 2^{2005} is read; 2^{20050} is not
MAX_EXPONENT = 10_000  # product of the numbers in an exponent, times those of powers in its base
MAX_POWER_DIGITS = 100_000  # estimated digits of a power of a number
MAX_EXPANDED_TERMS = 300  # estimated terms of an expanded power of a sum: (x+1)^{299}, (x+y+1)^{22}
MAX_FACTORIAL = 1000  # n! for a literal n <= 1000 (2,568 digits); n!! is (n!)!, checked the same way
MAX_BIG_OPERATOR_NUMBER = 100  # \sum, \prod, \binom: every number (and power of numbers) at most this

INSTALL_HINT = "pip install 'math-verify==0.9.0'"

try:  # pinned dependency (pyproject.toml); checked when the math checker is first used
    from math_verify import parse as _mv_parse
    from math_verify import verify as _mv_verify

    HAVE_MATH_VERIFY = True
    # It warns on every call made with timeouts off; that is deliberate here (see module docstring).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
except ImportError:  # pragma: no cover - exercised only where math-verify is missing
    HAVE_MATH_VERIFY = False


def _require_math_verify() -> None:
    if not HAVE_MATH_VERIFY:
        raise ImportError(
            "the math answer checker (libra_core/envs/answer_check.py) needs the `math-verify` "
            f"package, a dependency of libra: {INSTALL_HINT}"
        )


# -- what is read ---------------------------------------------------------------------------------
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


# Markdown emphasis (`***18***`, `**18**`, `__Answer__`, `*18*`) in prose: the opening marker follows no
# operand, so it is no power or product. Until 2026-12-06 the screen read `**18**` as a chain of
# powers and refused a correct unboxed answer (well formed, 0.1) whenever a word near its end was
# bold, and `*18*` was not read as 18.
_MARKDOWN_BOLD = re.compile(
    r"(?<![\w)\]}*])(\*\*\*|___|\*\*|__|\*)(?=[^\s*])([^*_\n]+?)(?<=\S)\1(?![\w(\[{*])"
)


def final_answer_text(text: str) -> str:
    """The last `\\boxed{...}` of `text` (unclosed: from it to the end), else its last
    MAX_ANSWER_CHARS characters with markdown emphasis unwrapped."""
    text = text.strip()
    starts = list(_BOXED.finditer(text))
    if starts:
        start = starts[-1]
        end = _group_end(text, start.end() - 1)
        # Unclosed, it is still the last box the model opened: the tail read instead held the earlier
        # box too, and "\\boxed{5} is wrong, it's \\boxed{6" scored correct for 5 (until 2026-12-07).
        return text[start.start() :] if end is None else text[start.start() : end + 1]
    return _MARKDOWN_BOLD.sub(r"\2", text[-MAX_ANSWER_CHARS:]).strip()


_OPEN, _CLOSE = "({[", ")}]"


def _escaped(text: str, i: int) -> bool:
    return i > 0 and text[i - 1] == "\\"


def _group_end(text: str, i: int) -> int | None:
    """Index of the bracket closing the one at `i` (`\\{`, `\\}` are not brackets); None: unclosed."""
    depth = 0
    for j in range(i, len(text)):
        if _escaped(text, j):
            continue
        if text[j] in _OPEN:
            depth += 1
        elif text[j] in _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    return None


def _group_start(text: str, i: int) -> int:
    """Index of the bracket opening the one closed at `i` (0 when unbalanced)."""
    depth = 0
    for j in range(i, -1, -1):
        if _escaped(text, j):
            continue
        if text[j] in _CLOSE:
            depth += 1
        elif text[j] in _OPEN:
            depth -= 1
            if depth == 0:
                return j
    return 0


# -- the screen -----------------------------------------------------------------------------------
_NUMBER = re.compile(r"\d+(?:,(?:\\!)?\s?\d{3}(?!\d))*")  # 1,000 and 11,\! 111 are one number
_INTEGER = re.compile(r"\d+")
_POWER = re.compile(r"\^|\*\*")
_FACTORIAL = re.compile(r"(?<!\\)!+")  # \! is LaTeX spacing (10,\!080), not a factorial
_BIG_OPERATOR = re.compile(r"\\(?:sum|prod|[dt]?binom|choose)(?![a-zA-Z])")
_COMMAND = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[\w.]+")
_LETTER = re.compile(r"[a-zA-Z]")
_BINARY_SIGN = re.compile(r"(?<=[\w)}\]])\s*[+-]")  # x+1: two terms; (-x): one
_LEFT_RIGHT = re.compile(r"\\(left|right)(?![a-zA-Z])")
_DELIMITER = re.compile(r"\s*(\\[a-zA-Z]+|\\.|.)")  # after \right: ) or \} or \rangle


def _digits(text: str) -> int:
    return sum(ch.isdigit() for ch in text)


def _left_right_end(text: str, i: int) -> int:
    """End (exclusive) of the `\\left ... \\right<delimiter>` whose `\\left` ends at `i`."""
    depth = 1
    for match in _LEFT_RIGHT.finditer(text, i):
        depth += 1 if match.group(1) == "left" else -1
        if depth == 0:
            delimiter = _DELIMITER.match(text, match.end())
            return delimiter.end() if delimiter else match.end()
    return len(text)


def _operand_end(text: str, i: int) -> int:
    """End (exclusive) of the operand that starts at or after `i`: a bracket group, a command with
    its arguments (`\\frac{1}{2}`, `\\sqrt[3]{2}`, `\\left( ... \\right)`), or a run of digits and
    letters."""
    while i < len(text) and text[i] in " +-":
        i += 1
    if i >= len(text):
        return i
    if text[i] in _OPEN:
        end = _group_end(text, i)
        return len(text) if end is None else end + 1
    command = _COMMAND.match(text, i)
    if command:
        if command.group() == "\\left":
            return _left_right_end(text, command.end())
        i = command.end()
        while i < len(text) and text[i] in "{[":
            end = _group_end(text, i)
            if end is None:
                return len(text)
            i = end + 1
        return i
    word = _WORD.match(text, i)
    return word.end() if word else i + 1


def _operand_start(text: str, i: int) -> int:
    """Start of the operand that ends just before `i`: a bracket group, or a run of digits, letters
    and commands."""
    j = i - 1
    while j >= 0 and text[j] == " ":
        j -= 1
    if j >= 0 and text[j] in _CLOSE and not _escaped(text, j):
        return _group_start(text, j)
    while j >= 0 and (text[j].isalnum() or text[j] in "._\\"):
        j -= 1
    return j + 1


def refusal(text: str) -> str | None:
    """Why reading `text` could build a huge number or expression; None when it is safe to parse.

    Lexical and conservative, a heuristic rather than a bound: what it lets through was measured to
    parse and verify in about a second at most ((x+1)^{299}, 2^{2005}, 1000!)."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"answer longer than {MAX_ANSWER_CHARS} characters"
    if any(_digits(m.group()) > MAX_DIGITS for m in _NUMBER.finditer(text)):
        return f"a number of more than {MAX_DIGITS} digits"
    return _factorial_refusal(text) or _power_refusal(text) or _big_operator_refusal(text)


def _factorial_refusal(text: str) -> str | None:
    prose = None  # computed on the first `!` that needs it
    for match in _FACTORIAL.finditer(text):
        before = text[: match.start()].rstrip()
        if not before or before[-1].isalpha():  # "n!", or prose: "Great!"
            continue
        if match.group() == "!" and text[match.end() : match.end() + 1] in ("", " ", "\n", "\t"):
            # A sentence's exclamation mark ("The total is 1500!", "The answer is $72$!") outside
            # $...$ and \boxed{} in prose: math-verify reads the number, as it read "999!" (until
            # 2026-12-06 the screen refused the answer as a factorial, scoring it wrong).
            prose = _is_prose(text) if prose is None else prose
            if prose and not _in_math(text, match.start()):
                continue
        literal = re.search(r"\d+$", before)
        if literal is None:
            return "factorial of an expression"
        value = int(literal.group())
        for _ in match.group():  # 5!! is read as (5!)!
            if value > MAX_FACTORIAL:
                return f"factorial of a number over {MAX_FACTORIAL}"
            value = math.factorial(value)
    return None


def _in_math(text: str, position: int) -> bool:
    """Whether `position` lies inside `$...$` (an odd number of unescaped dollars before it) or a
    `\boxed{...}` / `\fbox{...}` group."""
    if len(re.findall(r"(?<!\\)\$", text[:position])) % 2:
        return True
    for box in re.finditer(r"\\(?:boxed|fbox)\s*\{", text[:position]):
        depth = 1
        for ch in text[box.end() : position]:
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                break
        if depth > 0:
            return True
    return False


def _power_refusal(text: str) -> str | None:
    # Pass 1: each power's exponent on its own.
    powers: list[tuple[int, int]] = []  # (operator position, product of the exponent's numbers)
    for match in _POWER.finditer(text):
        if match.group() == "^" and text[match.start() + 1 : match.start() + 2] == "^":
            return "a power tower"
        end = _operand_end(text, match.end())
        exponent = text[match.end() : end]
        if _POWER.search(exponent) or _FACTORIAL.search(exponent):
            return "a power tower (an exponent with a power or factorial in it)"
        if _POWER.match(text[end:].lstrip()):
            return "a chain of powers"
        numbers = _INTEGER.findall(exponent)
        if any(len(n) > MAX_EXPONENT_DIGITS for n in numbers):
            return f"an exponent with more than {MAX_EXPONENT_DIGITS} digits"
        powers.append((match.start(), math.prod(max(int(n), 1) for n in numbers)))
    # Pass 2: with its base (the powers inside a base group multiply: ((10^9)^9)^9).
    expanded_terms = 1
    for position, own in powers:
        start = _operand_start(text, position)
        base = text[start:position]
        if _FACTORIAL.search(text[:position].rstrip()[-1:]) or _FACTORIAL.search(base):
            return "a power of a factorial"
        total = own * math.prod(e for p, e in powers if start <= p < position)
        if total > MAX_EXPONENT:
            return f"an exponent over {MAX_EXPONENT}"
        if _digits(base) * total > MAX_POWER_DIGITS:
            return "a power with too many digits"
        if _LETTER.search(_COMMAND.sub("", base)):  # symbolic: verify may expand it
            terms = 1 + len(_BINARY_SIGN.findall(base))
            expanded_terms *= math.comb(total + terms - 1, terms - 1)
            if expanded_terms > MAX_EXPANDED_TERMS:
                return "a power of a sum that would expand to too many terms"
    return None


def _big_operator_refusal(text: str) -> str | None:
    if not _BIG_OPERATOR.search(text):
        return None
    if any(int(n) > MAX_BIG_OPERATOR_NUMBER for n in _INTEGER.findall(text)):
        return f"a sum, product or binomial with a number over {MAX_BIG_OPERATOR_NUMBER}"
    for match in re.finditer(r"(\d+)\s*(?:\^|\*\*)\s*\{?\s*(\d+)", text):
        base, exponent = int(match.group(1)), int(match.group(2))
        if base > 1 and exponent * math.log10(base) > math.log10(MAX_BIG_OPERATOR_NUMBER):
            return f"a sum, product or binomial with a number over {MAX_BIG_OPERATOR_NUMBER}"
    return None


# -- parsing and comparison -----------------------------------------------------------------------
_WORD_ARGUMENT = re.compile(  # \text{ dollars}, \begin{pmatrix}: words that are not prose
    r"\\(?:text\w*|mbox|math\w+|operatorname|begin|end)\s*\{[^{}]*\}"
)
_PLAIN_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_MATH_WORDS = frozenset(  # function names written without a backslash: sin(x) is not prose
    ("sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh")
    + ("log", "ln", "exp", "sqrt", "pi", "inf", "infty", "oo", "mod", "gcd", "lcm", "max", "min")
)


# Sentence punctuation after a bare answer; `\,` `\;` `\:` are LaTeX spaces, not punctuation.
_TRAILING_STOP = re.compile(r"(?:(?<!\\)[.,;:])+$")


def _is_prose(text: str) -> bool:
    """Words outside LaTeX commands and \\text{} ("The answer is 72", "72 dollars"), as opposed to a
    bare expression ("x^5 - x^4 + 1", "6 + 9i") that reads best as a boxed expression."""
    words = _PLAIN_WORD.findall(_WORD_ARGUMENT.sub(" ", text))
    return any(word.lower() not in _MATH_WORDS for word in words)


def _parse(text: str, *, gold: bool) -> list[Any]:
    """Parse already screened final-answer text."""
    if not gold and "\\$" in text and _is_prose(text):
        # "Janet makes \$18 every day.": with the dollar escaped math-verify found nothing and the
        # whole sentence, boxed, parsed as a string that never verifies (until 2026-12-06).
        text = text.replace("\\$", "$")
    boxed = f"\\boxed{{{text}}}"
    delimited = "\\boxed" in text or "\\fbox" in text or re.search(r"(?<!\\)\$", text) is not None
    if delimited or (not gold and _is_prose(text)):
        sources = [text, boxed]  # extracted from as written
    elif gold:
        sources = [boxed]
    else:
        # A bare answer ending a sentence ("72.", "1,000.", "1/2.", "72,"): boxed with its stop,
        # it parsed as the string "72." and a correct answer scored well_formed (until 2026-12-07).
        bare = _TRAILING_STOP.sub("", text) or text
        sources = [f"\\boxed{{{bare}}}", text]
    for source in sources:
        parsed = _mv_parse(source, parsing_timeout=None)  # type: ignore[arg-type]
        if parsed:
            return list(parsed)
    return []


def parse_math(text: str, *, gold: bool = False) -> list[Any]:
    """Parsed candidates of `text`'s final answer (empty: nothing parseable, or refused by the
    screen). Golds are read as a boxed expression."""
    _require_math_verify()
    text = final_answer_text(text)
    if not text or refusal(text):
        return []
    return _parse(text, gold=gold)


def math_equivalent(reference: str, answer: str) -> bool | None:
    """True/False for a parseable `answer`, None when no answer could be read from it. An answer
    the screen refuses (see `refusal`) is False: well formed, not equal."""
    _require_math_verify()
    text = final_answer_text(answer)
    if not text:
        return None
    reason = refusal(text)
    if reason is not None:
        logger.debug("answer %r not parsed: %s", text[:80], reason)
        return False
    predicted = _parse(text, gold=False)
    if not predicted:
        return None
    gold_text = final_answer_text(reference)
    reason = refusal(gold_text)
    if reason is not None:
        logger.warning("reference answer %r not parsed: %s", reference[:80], reason)
        return False
    gold = _parse(gold_text, gold=True) if gold_text else []
    if not gold:
        logger.warning("reference answer %r could not be parsed", reference[:80])
        return False
    return bool(_mv_verify(gold, predicted, timeout_seconds=None))


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
