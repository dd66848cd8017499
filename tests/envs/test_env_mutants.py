"""Boundaries of the math answer screen that a mutation audit found untested: each size limit itself
is read, one past it is refused (`answer_check.refusal`'s documented limits)."""

from __future__ import annotations

import math

from libra_core.envs.answer_check import final_answer_text, math_equivalent, refusal


# -- the math answer screen: at each limit read, one past it refused -----------------------------
def test_an_answer_of_exactly_max_answer_chars_is_read() -> None:
    inner = "1+" * 195 + "11"  # 196 terms: 195 ones and 11
    boxed = "\\boxed{" + inner + "}"
    assert len(boxed) == 400
    assert refusal(boxed) is None
    assert math_equivalent(str(195 + 11), boxed) is True
    longer = "\\boxed{" + "1+" * 195 + "111}"  # 401 characters
    assert refusal(longer) == "answer longer than 400 characters"
    assert math_equivalent("306", longer) is False  # well formed, never parsed


def test_a_number_of_exactly_max_digits_is_read() -> None:
    hundred = "1" * 100
    assert refusal(hundred) is None
    assert math_equivalent(hundred, f"\\boxed{{{hundred}}}") is True
    assert refusal("1" * 101) == "a number of more than 100 digits"
    # Thousands separators are no digits: "1" and 33 groups of three are 1 + 99 = 100 digits.
    grouped = "1" + ",000" * 33
    assert sum(ch.isdigit() for ch in grouped) == 100
    assert refusal(grouped) is None
    assert refusal(grouped + ",000") == "a number of more than 100 digits"


def test_the_factorial_of_max_factorial_is_read_and_one_more_is_not() -> None:
    assert refusal(final_answer_text("\\boxed{1000!}")) is None
    assert refusal(final_answer_text("\\boxed{1001!}")) == "factorial of a number over 1000"
    # n!! is (n!)!: 6! = 720 is within the limit, 7! = 5040 is not.
    assert refusal("\\boxed{6!!}") is None
    assert refusal("\\boxed{7!!}") == "factorial of a number over 1000"


def test_an_exponent_of_exactly_max_exponent_is_read() -> None:
    # The exponent's numbers multiply: 100 x 100 = 10,000 (the limit), 100 x 101 = 10,100.
    assert refusal("\\boxed{2^{100 \\cdot 100}}") is None
    assert refusal("\\boxed{2^{100 \\cdot 101}}") == "an exponent over 10000"
    # Each number of an exponent has at most 4 digits: 9,999 is read, 10,000 is not (though within
    # MAX_EXPONENT, that is checked after the digits).
    assert refusal("\\boxed{2^{9999}}") is None
    assert refusal("\\boxed{2^{10000}}") == "an exponent with more than 4 digits"


def test_a_power_of_exactly_max_power_digits_is_read() -> None:
    # Estimated digits = digits of the base x exponent: 10 x 10,000 = 100,000 (the limit).
    ten_digits, eleven_digits = "1" * 10, "1" * 11
    assert refusal(f"\\boxed{{{ten_digits}^{{100 \\cdot 100}}}}") is None
    assert refusal(f"\\boxed{{{eleven_digits}^{{100 \\cdot 100}}}}") == "a power with too many digits"


def test_an_expansion_of_exactly_max_expanded_terms_is_read() -> None:
    # (x+1)^n expands to C(n+1, 1) = n + 1 terms; (x+y+1)^n to C(n+2, 2).
    assert math.comb(300, 1) == 300 and math.comb(25, 2) == 300 and math.comb(26, 2) == 325
    assert refusal("\\boxed{(x+1)^{299}}") is None
    assert refusal("\\boxed{(x+1)^{300}}") == "a power of a sum that would expand to too many terms"
    assert refusal("\\boxed{(x+y+1)^{23}}") is None
    assert refusal("\\boxed{(x+y+1)^{24}}") == "a power of a sum that would expand to too many terms"


def test_a_binomial_of_max_big_operator_number_is_read_and_verified() -> None:
    assert refusal("\\boxed{\\binom{100}{50}}") is None
    assert math_equivalent(str(math.comb(100, 50)), "\\boxed{\\binom{100}{50}}") is True
    refused = "a sum, product or binomial with a number over 100"
    assert refusal("\\boxed{\\binom{101}{50}}") == refused
    # A power of numbers counts with its value: 10^2 = 100 is the limit, 10^3 and 2^7 = 128 are over.
    assert refusal("\\boxed{\\binom{10^2}{2}}") is None
    assert math_equivalent(str(math.comb(100, 2)), "\\boxed{\\binom{10^2}{2}}") is True
    assert refusal("\\boxed{\\binom{10^3}{2}}") == refused
    assert refusal("\\boxed{\\binom{2^7}{2}}") == refused
