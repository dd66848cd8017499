"""search on the FlashRAG passage sample: the BM25 service on a free local port, EM/F1 reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import SearchEnvConfig
from libra_core.envs.base import TurnAction
from libra_core.envs.registry import build_environment

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = [
    pytest.mark.skipif(not (DATA / "search").is_dir(), reason=f"shared data folder {DATA} is absent"),
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("bm25s") is None, reason="bm25s is not installed"
    ),
]


@pytest.fixture(scope="module")
def env():  # noqa: ANN201
    return build_environment(SearchEnvConfig(type="search", latency_ms=(1.0, 5.0)))


def _search(env, query: str):  # noqa: ANN001, ANN202
    return env.run_tool(TurnAction("tool_call", tool="search", arguments=query))


def test_service_runs_on_a_free_local_port(env) -> None:  # noqa: ANN001
    import httpx

    url = env.service_url()
    assert url.startswith("http://127.0.0.1:")
    health = httpx.get(f"{url}/health", timeout=5).json()
    assert health == {"ok": True, "passages": 1000}


def test_generated_title_questions_are_answerable_by_search(env) -> None:  # noqa: ANN001
    problems = [p for p in env.sample_problems(10, 0) if p.prompt_id.startswith("title-")]
    assert problems
    for problem in problems:
        title = json.loads(problem.reference_answer)[0]
        query = problem.question.split(":", 1)[1].strip().strip('?"')
        result = _search(env, query)
        assert result.status == "success"
        assert result.observation.startswith(f"[1] {title}:")  # BM25 ranks the quoted passage first


def test_payload_sizes_and_statuses_vary(env) -> None:  # noqa: ANN001
    one = _search(env, "BBC television channel | k=1")
    five = _search(env, "BBC television channel | k=5")
    none = _search(env, "zzzqqqxx")
    empty = _search(env, "   ")
    assert one.status == five.status == "success"
    assert one.observation.count("\n[") == 0 and five.observation.count("\n[") == 4
    assert len(five.observation) > 2 * len(one.observation)
    assert (none.status, none.observation) == ("failure", "no results")
    assert empty.status == "failure"
    assert 0.0 < one.latency_s < 5.0


def test_slow_service_returns_timeout(tmp_path: Path) -> None:
    slow = build_environment(
        SearchEnvConfig(type="search", latency_ms=(1500.0, 1500.0), request_timeout_s=0.3)
    )
    result = _search(slow, "BBC")
    assert result.status == "timeout"


@pytest.mark.parametrize(
    ("golds", "answer", "expected"),
    [
        (["Wilhelm Conrad Röntgen"], "Wilhelm Conrad Röntgen", 1.0),
        (["Wilhelm Conrad Röntgen"], "the wilhelm conrad röntgen.", 1.0),
        (["Olivia", "MFSK"], "MFSK", 1.0),
        (["Wilhelm Conrad Röntgen"], "Röntgen", 0.5),
        (["May 18, 2018"], "Albert Einstein", 0.1),
        (["May 18, 2018"], "", 0.0),
        (["May 18, 2018"], None, 0.0),
    ],
)
def test_reward_exact_match_and_f1(env, golds: list[str], answer: str | None, expected: float) -> None:  # noqa: ANN001
    assert env.reward(json.dumps(golds), answer) == pytest.approx(expected)


def test_nq_questions_are_loaded(env) -> None:  # noqa: ANN001
    nq = [p for p in env.problems if p.prompt_id.startswith("nq-")]
    assert len(nq) == 17
    assert json.loads(nq[0].reference_answer) == ["Wilhelm Conrad Röntgen"]


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_trickling_service_times_out_in_total_and_a_long_query_fails(tmp_path: Path, part: str) -> None:
    # httpx's timeout bounds each read; a service sending a byte every 0.2 s never trips it (its
    # headers so: blocked for good until 2026-12-06; its body was already cut at the deadline).
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
        try:
            if part == "body":
                conn.sendall(head)
            for byte in [head[i : i + 1] for i in range(len(head))] if part == "headers" else [b" "] * 100:
                conn.sendall(byte)
                time.sleep(0.2)
        except OSError:
            pass
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    cfg = SearchEnvConfig(type="search", service_url=f"http://127.0.0.1:{port}", request_timeout_s=1.0)
    slow = build_environment(cfg)
    t0 = time.perf_counter()
    result = _search(slow, "BBC")
    assert result.status == "timeout" and time.perf_counter() - t0 < 3.0
    listener.close()
    long = _search(slow, "世" * 7300)  # once a URL over 64 KiB: httpx.InvalidURL escaped the tool
    assert long.status == "failure" and "query over 2000 characters" in long.observation


def test_a_dead_shared_service_is_started_again(env) -> None:  # noqa: ANN001
    import httpx

    url = env.service_url()
    env._url = "http://127.0.0.1:9"  # as if the shared service had died: nothing listens there
    assert _search(env, "BBC").status == "failure"
    assert env._url is None  # forgotten, so the next call starts (or finds) the service
    assert _search(env, "BBC television channel").status == "success"
    assert httpx.get(f"{env.service_url()}/health", timeout=5).status_code == 200
    assert url.startswith("http://127.0.0.1:")
