"""Multi-prompt completion payloads: choices are matched to prompts by index, and a choice that
echoes a different prompt is an error (a mixed-up demultiplex would train on wrong tokens)."""

from __future__ import annotations

import time

import httpx
import pytest

from libra_core.rollout.client import EngineClient, EngineRequestError, parse_completions, paused_seconds


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
    with pytest.raises(EngineRequestError, match="did the engine exit") as err:
        child.pause()  # nothing listens on port 1: the error surfaces, it is not swallowed
    assert isinstance(err.value.__cause__, httpx.ConnectError) and err.value.url == "http://127.0.0.1:1"
    before = paused_seconds("http://127.0.0.1:1")
    time.sleep(0.2)
    assert paused_seconds("http://127.0.0.1:1") == before < 0.2  # the failed pause is not left open


class _FailingEngine:
    """A stand-in engine on a free port that hangs on, or drops, every completion request."""

    def __init__(self, mode: str) -> None:
        import http.server
        import threading
        import time

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if mode == "hang":
                    time.sleep(3)
                # "drop": close without an answer, as an engine that died mid-request

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("hang", r"completion: no answer within 0.5 s \(rollout.engine.request_timeout_s\)"),
        ("drop", r"completion failed: ServerDisconnectedError.*did the engine exit\?"),
    ],
)
@pytest.mark.parametrize("window", [0.0, 0.01])
def test_an_engine_that_hangs_or_dies_is_an_error_naming_it(mode: str, message: str, window: float) -> None:
    """They were a bare TimeoutError('') and aiohttp's ServerDisconnectedError, naming no engine."""
    import asyncio

    import aiohttp

    engine = _FailingEngine(mode)

    async def call() -> None:
        client = EngineClient(engine.url, timeout_s=0.5, coalesce_window_s=window)
        async with aiohttp.ClientSession() as http:
            await client.complete(
                http, [1, 2, 3], max_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=[1]
            )

    try:
        with pytest.raises(EngineRequestError, match=rf"^{engine.url} {message}"):
            asyncio.run(call())
    finally:
        engine.server.shutdown()


def test_a_signal_raised_in_a_coalesced_batch_reaches_its_trajectories(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prefect's TerminationSignal (a BaseException) raised while the batch task ran ended that task
    # alone, and its trajectories waited for good: a cancelled run did not stop until killed.
    import asyncio

    import aiohttp

    class Signal(BaseException):
        pass

    client = EngineClient("http://127.0.0.1:1", coalesce_window_s=0.01)

    async def raising(http: aiohttp.ClientSession, body: dict) -> dict:
        raise Signal("terminate")

    monkeypatch.setattr(client, "_post_completions", raising)

    async def run() -> list:
        async with aiohttp.ClientSession() as http:
            turns = [
                client.complete(http, [1, 2], max_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=[])
                for _ in range(3)
            ]
            return await asyncio.wait_for(asyncio.gather(*turns), 5)

    with pytest.raises(Signal):  # not a 5 s TimeoutError: every waiting turn got the signal
        asyncio.run(run())


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [
        ("application/json", b'{"choices": [', "JSONDecodeError"),
        ("text/html", b"<html>proxy error</html>", "ContentTypeError"),
    ],
)
def test_a_200_that_is_not_json_names_the_engine(content_type: str, body: bytes, said: str) -> None:
    # A bare JSONDecodeError named no engine, and an HTML page from a proxy read as "did the engine
    # exit? see its log" (until 2026-12-07).
    import asyncio
    import http.server

    import aiohttp

    from tests.support import serving

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    async def complete(url: str) -> None:
        engine = EngineClient(url, timeout_s=5, coalesce_window_s=0.0)
        async with aiohttp.ClientSession() as session:
            await engine.complete(
                session, [1, 2], max_tokens=2, temperature=1.0, top_p=1.0, stop_token_ids=[]
            )

    with serving(Handler) as url, pytest.raises(EngineRequestError) as err:
        asyncio.run(complete(url))
    assert err.value.url == url and "200 but a body that is not JSON" in str(err.value)
    assert said in str(err.value) and "did the engine exit" not in str(err.value)


def test_an_echo_that_is_not_a_list_is_an_error() -> None:
    choice = _choice(0, [1, 2], [7]) | {"prompt_token_ids": 12}
    with pytest.raises(EngineRequestError, match="not a list"):
        parse_completions({"choices": [choice]}, [[1, 2]])  # was a bare TypeError


@pytest.mark.parametrize("window", [0.0, 0.05], ids=["alone", "coalesced"])
def test_a_completion_longer_than_max_tokens_is_an_error(window: float) -> None:
    # A reply of 5 tokens to max_tokens 4 was taken as it was: the trajectory overran
    # rollout.max_total_tokens and still validated.
    import asyncio
    import http.server
    import json

    import aiohttp

    from tests.support import serving

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
            size = body["max_tokens"] + (1 if prompts[0] == [1] else 0)  # prompt [1]: one too many
            out = {"choices": [_choice(i, p, [7] * size) for i, p in enumerate(prompts)]}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    async def turn(url: str, prompt: list[int]) -> list[int]:
        client = EngineClient(url, timeout_s=5.0, coalesce_window_s=window)
        async with aiohttp.ClientSession() as http:
            done = await client.complete(
                http, prompt, max_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=[]
            )
        return done.token_ids

    with serving(Handler) as url:
        assert asyncio.run(turn(url, [2])) == [7] * 4  # at the limit: taken
        with pytest.raises(EngineRequestError, match="completion of 5 tokens for a request of max_tokens 4"):
            asyncio.run(turn(url, [1]))
