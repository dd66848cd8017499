"""search: the final answer of a chatml turn, a service that does not follow the contract, the F1
cap and bad configuration (no shared data needed; the service tests need bm25s)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from libra_core.config.environments import SearchEnvConfig
from libra_core.envs.base import TurnAction
from libra_core.envs.search import MAX_RESPONSE_BYTES, SearchEnv, final_answer_of

PASSAGE = {"id": "1", "title": "Nobel Prize", "text": "The Nobel Prize is awarded every year in Stockholm."}


def _cfg(tmp_path: Path, **overrides: object) -> SearchEnvConfig:
    (tmp_path / "passages.jsonl").write_text(json.dumps(PASSAGE) + "\n")
    fields = {
        "type": "search",
        "data_dir": str(tmp_path),
        "passages_file": "passages.jsonl",
        "question_sources": ("passage_titles",),
        "prompt_format": "chatml",
        **overrides,
    }
    return SearchEnvConfig.model_validate(fields)


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        ("I think the answer is Paris, but let me check.\nAnswer: Lyon", "Lyon"),
        ("The answer isn't obvious.\nAnswer: Lyon", "Lyon"),
        ("Answer: Paris\nOn reflection:\nAnswer: Lyon", "Lyon"),
        ("**Answer:** Lyon", "Lyon"),
        ("Final answer: Lyon", "Lyon"),
        ("Some say the answer is Paris. Others: the answer is Lyon", "Lyon"),
        ("The answer isn't known.", None),
        ("Lyon", None),
    ],
)
def test_the_final_answer_is_the_last_answer_line(turn: str, expected: str | None) -> None:
    assert final_answer_of(turn) == expected


def test_parse_turn_reads_the_last_answer_line(tmp_path: Path) -> None:
    env = SearchEnv(_cfg(tmp_path))
    action = env.parse_turn("The answer is Paris, I guess.\nAnswer: Lyon<|im_end|>")
    assert (action.kind, action.answer) == ("answer", "Lyon")
    no_line = env.parse_turn("The answer isn't clear to me.<|im_end|>")
    assert no_line.answer == "The answer isn't clear to me."  # the whole turn, as before


def test_partial_credit_stays_below_correct(tmp_path: Path) -> None:
    env = SearchEnv(_cfg(tmp_path))
    gold = json.dumps(["Wilhelm Conrad Röntgen"])
    assert env.reward(gold, "Wilhelm Conrad Röntgen") == 1.0
    permuted = env.reward(gold, "Röntgen Conrad Wilhelm")  # token F1 1.0: order is ignored
    assert 0.1 < permuted < 1.0
    assert env.reward(gold, "Röntgen") == pytest.approx(0.5)


@pytest.fixture
def fake_service() -> Iterator[tuple[str, dict[str, object]]]:
    state: dict[str, object] = {"body": b"{}"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:  # noqa: N802
            body = state["body"]
            assert isinstance(body, bytes)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def _search(env: SearchEnv, query: str = "nobel"):  # noqa: ANN202
    return env.run_tool(TurnAction("tool_call", tool="search", arguments=query))


def test_k_and_passage_length_are_enforced_on_the_service_answer(
    tmp_path: Path, fake_service: tuple[str, dict[str, object]]
) -> None:
    url, state = fake_service
    env = SearchEnv(_cfg(tmp_path, service_url=url, top_k=2, max_passage_chars=40))
    long_text = "A sentence of the passage. " * 40
    results = [{"title": f"T{i}", "text": long_text, "score": 1.0} for i in range(20)]
    state["body"] = json.dumps({"results": results}).encode()
    result = _search(env)
    assert result.status == "success"
    lines = result.observation.splitlines()
    assert [line.split(":")[0] for line in lines] == ["[1] T0", "[2] T1"]  # k=2, not the 20 sent
    assert all(len(line.split(": ", 1)[1]) <= 40 for line in lines)
    three = _search(env, "nobel | k=3")  # a call's own k is capped by max_top_k (5) and kept
    assert three.observation.count("\n") == 2


@pytest.mark.parametrize(
    "body",
    [
        b'["not", "an", "object"]',
        b'{"results": ["a string, not a passage"]}',
        b'{"results": [{"title": 1, "text": "x"}]}',
        b'{"results": {"title": "x"}}',
        b"not json",
        b"[" * 100_000,
        json.dumps({"results": [{"title": "T", "text": "word " * 1000}] * 300}).encode(),  # > 1 MiB
    ],
)
def test_a_service_answer_of_the_wrong_shape_is_a_failure_not_an_exception(
    tmp_path: Path, fake_service: tuple[str, dict[str, object]], body: bytes
) -> None:
    url, state = fake_service
    env = SearchEnv(_cfg(tmp_path, service_url=url))
    state["body"] = body
    result = _search(env)
    assert result.status == "failure" and result.observation.startswith("error: search failed")
    assert len(body) < 200_000 or len(body) > MAX_RESPONSE_BYTES


def test_an_empty_passages_file_is_refused_at_build_time(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    cfg = _cfg(tmp_path).model_copy(update={"passages_file": "empty.jsonl"})
    with pytest.raises(ValueError, match=r"empty\.jsonl holds no passages"):
        SearchEnv(cfg)


def test_negative_latency_is_refused() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        SearchEnvConfig(type="search", latency_ms=(-5.0, 3.0))
    assert SearchEnvConfig(type="search", latency_ms=(0.0, 0.0)).latency_ms == (0.0, 0.0)
