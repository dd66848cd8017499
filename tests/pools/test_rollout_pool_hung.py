"""An engine that hangs with its process still running is replaced on the stage's retry.

The engine here is a stand-in process (an HTTP server that answers /health and never answers a
request: the fault being injected); the client, the pool and its process handling are the real ones.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from libra_core.config.models import VllmEngineConfig
from libra_core.pools import rollout
from libra_core.rollout import engine_registry
from libra_core.rollout.client import EngineClient, EngineRequestError

HUNG_SERVER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # /health and /v1/models answer: the API server is up
        body = json.dumps({"data": [{"id": sys.argv[2]}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # the engine behind it is stuck
        time.sleep(3600)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class _HungServer(rollout.VllmServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", HUNG_SERVER, str(self.port), self.identity]


@pytest.fixture
def hung_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setattr(rollout, "VllmServer", _HungServer)
    info = rollout.ensure_rollout_pool(
        "rollout:hung",
        tmp_path / "policy",
        VllmEngineConfig(startup_timeout_s=20),
        tmp_path / "logs",
        size=1,
        max_model_len=64,
        dtype="float32",
    )
    yield info
    rollout.stop_rollout_pool("rollout:hung")


async def _complete(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        await EngineClient(url, timeout_s=0.5).complete(
            http, [1, 2, 3], max_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=[1]
        )


def test_a_timed_out_rollout_replaces_the_engine_on_retry(hung_pool: rollout.PoolInfo) -> None:
    (url,) = hung_pool.urls
    pool = rollout._POOLS["rollout:hung"]
    (server,) = pool.servers
    assert server.process is not None
    pgid = server.process.pid
    with (
        pytest.raises(EngineRequestError, match=r"no answer within 0.5 s") as caught,
        rollout.replacing_unresponsive("rollout:hung"),
    ):
        asyncio.run(_complete(url))
    assert caught.value.unresponsive and caught.value.url == url
    assert server.alive()  # hung, not dead: the old `live_pool` kept it
    live = rollout.live_pool("rollout:hung")  # what the task's retry calls first
    assert len(live.urls) == 1 and live.urls != hung_pool.urls
    assert live.instance_ids == ("rollout:hung-1",)
    assert engine_registry.group_members(pgid) == []  # the hung instance was stopped
    assert [p.stem for p in pool.pid_dir.glob("*.pid")] == ["rollout:hung-1"]
    assert pool.unresponsive == set()
    assert rollout.live_pool("rollout:hung").urls == live.urls  # a healthy pool is left alone


def test_a_timed_out_control_call_is_unresponsive_and_other_errors_are_not(
    hung_pool: rollout.PoolInfo,
) -> None:
    (url,) = hung_pool.urls
    with (
        pytest.raises(EngineRequestError, match=r"/pause\?mode=keep: no answer within 0.5 s") as caught,
        rollout.replacing_unresponsive("rollout:hung"),
    ):
        EngineClient(url, timeout_s=0.5).pause()
    assert caught.value.unresponsive and caught.value.url == url
    pool = rollout._POOLS["rollout:hung"]
    assert pool.unresponsive == {url}
    pool.unresponsive.clear()
    # an engine that answers with an error is not hung: nothing is marked
    with pytest.raises(EngineRequestError), rollout.replacing_unresponsive("rollout:hung"):
        raise EngineRequestError(f"{url} completion failed (500): boom", url=url)
    # nor is a URL the pool does not hold (an instance already replaced)
    rollout.mark_unresponsive("rollout:hung", "http://127.0.0.1:1")
    assert pool.unresponsive == set()
    assert rollout.live_pool("rollout:hung").urls == hung_pool.urls
