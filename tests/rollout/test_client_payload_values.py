"""A completion's values are checked, not converted: an engine (or a proxy before it) that sends
token ids as a string, floats or booleans, a NaN log-prob or no finish reason is named in an
EngineRequestError at once; `int()`/`float()` took them as other tokens, or let the whole rollout
fail later at the schema check, naming no engine."""

from __future__ import annotations

import math

import pytest

from libra_core.rollout.client import EngineRequestError, parse_completion, parse_completions

URL = "http://127.0.0.1:9/v1"


def _payload(token_ids: object, logprobs: object, finish: object = "stop") -> dict:
    return {
        "choices": [
            {
                "index": 0,
                "token_ids": token_ids,
                "logprobs": {"token_logprobs": logprobs},
                "finish_reason": finish,
            }
        ]
    }


@pytest.mark.parametrize(
    "token_ids,logprobs,finish",
    [
        ("6578", [-0.1] * 4, "stop"),  # a string: its digits were taken as 4 token ids
        ([65.0, 78.0], [-0.1, -0.1], "stop"),
        ([True, False], [-0.1, -0.1], "stop"),
        ([-7, 4], [-0.1, -0.1], "stop"),
        ([65, 78], [math.nan, -0.1], "stop"),
        ([65, 78], [-0.1, math.inf], "stop"),
        ([65, 78], ["-0.1", -0.1], "stop"),
        ([65, 78], [-0.1, -0.1], None),  # was the string 'None'
    ],
    ids=[
        "ids-string",
        "ids-float",
        "ids-bool",
        "ids-negative",
        "lp-nan",
        "lp-inf",
        "lp-string",
        "finish-null",
    ],
)
def test_a_bad_value_is_an_engine_error_naming_the_engine(token_ids, logprobs, finish) -> None:  # noqa: ANN001
    with pytest.raises(EngineRequestError, match="malformed completion payload") as err:
        parse_completion(_payload(token_ids, logprobs, finish), url=URL)
    assert err.value.url == URL


def test_a_coalesced_reply_names_the_engine_too() -> None:
    payload = _payload([65, 78], [math.nan, -0.1])
    payload["choices"][0]["prompt_token_ids"] = [1, 2]
    with pytest.raises(EngineRequestError) as err:
        parse_completions(payload, [[1, 2]], url=URL)
    assert err.value.url == URL
    with pytest.raises(EngineRequestError, match="expected 2 choices") as err:
        parse_completions(payload, [[1, 2], [3]], url=URL)
    assert err.value.url == URL


def test_good_values_are_read_as_they_are() -> None:
    got = parse_completion(_payload([0, 65, 78], [-0.25, 0, -1.5], "length"), max_tokens=3, url=URL)
    assert got.token_ids == [0, 65, 78]
    assert got.logprobs == [-0.25, 0.0, -1.5] and all(isinstance(x, float) for x in got.logprobs)
    assert got.finish_reason == "length"
