"""A completion frozen by a weight sync (`/pause?mode=keep` ... `/resume`) is not a hung engine:
its request timeout counts only the time the engine was not paused by this process."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest

from libra_core.rollout.client import EngineClient, EngineRequestError, paused_seconds
from tests.support import serving

GEN_S, RELOAD_S, TIMEOUT_S = 0.6, 0.8, 1.0  # the turn needs 0.6 s of unpaused time; the sync 0.8 s


@pytest.fixture
def engine() -> Iterator[str]:
    """An engine whose generation advances only while it is not paused; `/v1/completions` with
    max_tokens 0 never answers (a hung engine)."""
    running = threading.Event()
    running.set()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            out: dict = {}
            if self.path == "/v1/completions":
                if body["max_tokens"] == 0:
                    time.sleep(3 * TIMEOUT_S)
                done = 0.0
                while done < GEN_S:
                    running.wait()
                    time.sleep(0.02)
                    done += 0.02
                choice = {
                    "index": 0,
                    "token_ids": [7],
                    "prompt_token_ids": body["prompt"],
                    "finish_reason": "stop",
                }
                out = {"choices": [choice | {"logprobs": {"token_logprobs": [-0.1]}}]}
            elif self.path.startswith("/pause"):
                running.clear()
            elif self.path == "/collective_rpc":
                time.sleep(RELOAD_S)
            elif self.path == "/resume":
                running.set()
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


async def _complete(url: str, max_tokens: int = 4) -> list[int]:
    client = EngineClient(url, timeout_s=TIMEOUT_S, coalesce_window_s=0.0)
    async with aiohttp.ClientSession() as http:
        done = await client.complete(
            http, [1, 2], max_tokens=max_tokens, temperature=1.0, top_p=1.0, stop_token_ids=[]
        )
    return list(done.token_ids)


def test_a_turn_frozen_by_a_weight_sync_outlives_the_timeout_and_finishes(engine: str) -> None:
    def sync() -> None:
        time.sleep(0.3)  # mid-turn
        EngineClient(engine, timeout_s=TIMEOUT_S).swap_weights("/policy")

    thread = threading.Thread(target=sync)
    thread.start()
    start = time.monotonic()
    tokens = asyncio.run(_complete(engine))  # was EngineRequestError(unresponsive=True)
    thread.join()
    assert tokens == [7]
    assert time.monotonic() - start > TIMEOUT_S  # it did outlive the timeout, paused
    assert paused_seconds(engine) >= RELOAD_S


def test_a_hung_engine_still_times_out_as_unresponsive(engine: str) -> None:
    start = time.monotonic()
    with pytest.raises(EngineRequestError) as err:
        asyncio.run(_complete(engine, max_tokens=0))
    assert err.value.unresponsive and err.value.url == engine
    assert TIMEOUT_S <= time.monotonic() - start < 2 * TIMEOUT_S


def test_a_sync_to_an_engine_that_exited_names_it_and_leaves_no_pause_open() -> None:
    from libra_core.rollout.vllm_server import free_port

    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens: the engine exited
    with pytest.raises(
        EngineRequestError, match=r"/pause\?mode=keep failed: ConnectError.*did the engine exit"
    ) as err:
        EngineClient(url, timeout_s=TIMEOUT_S).swap_weights("/policy")  # was a bare httpx.ConnectError
    assert err.value.url == url
    time.sleep(0.2)
    assert paused_seconds(url) < 0.1  # the failed pause was left open: its time grew for ever


@contextmanager
def _control_engine(answers: dict[str, tuple[int, bytes]]) -> Iterator[tuple[str, list[str]]]:
    """An engine answering the sync's control calls: `answers` maps a path prefix to (status, body),
    every other path gets 200 and no body; yields its URL and the paths it was called with."""
    calls: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(self.path)
            status, data = next((a for p, a in answers.items() if self.path.startswith(p)), (200, b""))
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url, calls


def test_a_failed_pause_is_resumed_and_closed() -> None:
    """A pause whose answer is an error may still have paused the engine: the sync resumes it and
    closes the pause, so the request timeouts to this engine count again."""
    with _control_engine({"/pause": (500, b"")}) as (url, calls):
        with pytest.raises(EngineRequestError, match="pause"):
            EngineClient(url, timeout_s=TIMEOUT_S).swap_weights("/policy")
        time.sleep(0.2)
        assert calls == ["/pause?mode=keep", "/resume"]  # no reload on an engine in doubt
        assert paused_seconds(url) < 0.1


def test_a_prefix_cache_the_engine_kept_fails_the_sync_and_the_engine_is_resumed() -> None:
    kept = json.dumps({"success": False}).encode()
    with _control_engine({"/reset_prefix_cache": (200, kept)}) as (url, calls):
        with pytest.raises(EngineRequestError, match="kept its prefix cache"):
            EngineClient(url, timeout_s=TIMEOUT_S).swap_weights("/policy")
        assert calls == ["/pause?mode=keep", "/collective_rpc", "/reset_prefix_cache", "/resume"]


def test_a_pause_answered_with_a_body_that_is_not_json_is_resumed_and_closed() -> None:
    # A bare JSONDecodeError escaped (naming no engine): no /resume was sent and the pause stayed
    # open, so no request to this engine timed out again.
    with _control_engine({"/pause": (200, b"OK")}) as (url, calls):
        with pytest.raises(
            EngineRequestError, match=r"/pause\?mode=keep answered 200 with a body that is not JSON"
        ) as err:
            EngineClient(url, timeout_s=TIMEOUT_S).swap_weights("/policy")
        assert err.value.url == url
        time.sleep(0.2)
        assert calls == ["/pause?mode=keep", "/resume"]
        assert paused_seconds(url) < 0.1
