"""Multi-prompt completion payloads: choices are matched to prompts by index, and a choice that
echoes a different prompt is an error (a mixed-up demultiplex would train on wrong tokens)."""

from __future__ import annotations

import httpx
import pytest

from libra_core.rollout.client import EngineClient, EngineRequestError, parse_completions


def _choice(index: int, prompt: list[int], tokens: list[int]) -> dict:
    return {
        "index": index,
        "prompt_token_ids": prompt,
        "token_ids": tokens,
        "logprobs": {"token_logprobs": [-0.5] * len(tokens)},
        "finish_reason": "stop",
    }


def test_choices_come_back_in_prompt_order() -> None:
    prompts = [[1, 2], [3], [4, 5, 6]]
    payload = {
        "choices": [_choice(2, prompts[2], [9]), _choice(0, prompts[0], [7, 7]), _choice(1, prompts[1], [8])]
    }
    out = parse_completions(payload, prompts)
    assert [c.token_ids for c in out] == [[7, 7], [8], [9]]
    assert out[0].logprobs == [-0.5, -0.5]


def test_a_choice_echoing_another_prompt_is_an_error() -> None:
    prompts = [[1, 2], [3]]
    payload = {"choices": [_choice(0, prompts[1], [7]), _choice(1, prompts[0], [8])]}
    with pytest.raises(EngineRequestError, match="choice 0 answers a different prompt"):
        parse_completions(payload, prompts)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"choices": [_choice(0, [1], [7])]}, "expected 2 choices, got 1"),
        ({"choices": [_choice(0, [1], [7]), _choice(0, [2], [8])]}, "indices are not 0..1"),
        ({"error": "boom"}, "expected 2 choices, got no"),
    ],
)
def test_malformed_multi_prompt_payloads(payload: dict, message: str) -> None:
    with pytest.raises(EngineRequestError, match=message):
        parse_completions(payload, [[1], [2]])


def test_client_rejects_a_negative_window() -> None:
    with pytest.raises(ValueError, match="coalesce_window_s >= 0"):
        EngineClient("http://127.0.0.1:1", coalesce_window_s=-1.0)


def test_control_calls_share_one_http_client_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    a, b = EngineClient("http://127.0.0.1:1"), EngineClient("http://127.0.0.1:2")
    assert a._control is b._control  # built once, not per call or per instance
    pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: pid + 1)  # as in a forked child
    child = EngineClient("http://127.0.0.1:1")
    assert child._control is not a._control
    with pytest.raises(httpx.ConnectError):
        child.pause()  # nothing listens on port 1: the error surfaces, it is not swallowed
