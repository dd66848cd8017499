"""A lone UTF-16 surrogate in a tool's output (a search service's JSON `\\ud800`) costs at most its
own trajectory: the observation is written with `?` for it, and an observation that still cannot be
tokenised ends that trajectory as `error`. Until 2026-12-07 the tokenizer's exception escaped the
agent loop's gather and the whole iteration's rollout was lost."""

from __future__ import annotations

import http.server
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from libra_core.config.environments import SearchEnvConfig
from libra_core.config.models import RolloutConfig
from libra_core.data.schema import table_from_rows
from libra_core.envs.base import Problem, ToolResult, TurnAction
from libra_core.envs.protocol import CHATML, MARKERS, TextFormat
from libra_core.envs.search import SearchEnv
from libra_core.model.tokenizer import train_tokenizer
from libra_core.rollout.agent_loop import AgentLoop, RolloutRequest
from libra_core.rollout.client import Completion
from libra_core.rollout.router import static_router
from tests.rollout.builders import CharTokenizer, OneToolEnv
from tests.support import serving

BAD_BODY = b'{"results": [{"title": "Paris\\ud800", "text": "Capital of France."}]}'
GOOD_BODY = json.dumps({"results": [{"title": "Nobel Prize", "text": "Awarded in Stockholm."}]}).encode()
BAD_CALL = '<tool_call>\n{"name": "search", "arguments": "paris"}\n</tool_call><|im_end|>'
GOOD_CALL = '<tool_call>\n{"name": "search", "arguments": "nobel"}\n</tool_call><|im_end|>'
ANSWER = "Answer: Paris<|im_end|>"
SHOWN = ("[1] Paris?: Capital of France.", "[1] Nobel Prize: Awarded in Stockholm.")  # as observed


class _Service(http.server.BaseHTTPRequestHandler):
    """A `service_url` server that answers a search for "paris" with a lone surrogate escape."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = BAD_BODY if "q=paris" in self.path else GOOD_BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _SearchEngine:
    """A scripted engine: a first turn searches ("paris" for the France question, "nobel" for the
    other), a turn after a tool response answers."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    async def complete(self, http: Any, prompt_ids: Sequence[int], **_: Any) -> Completion:
        context = self.tok.decode(prompt_ids, skip_special_tokens=False)
        first = BAD_CALL if "France" in context else GOOD_CALL
        text = ANSWER if "<tool_response>" in context else first
        ids = self.tok.encode(text, add_special_tokens=False)
        return Completion(ids, [-0.5] * len(ids), "stop")


def test_a_surrogate_in_search_results_is_replaced_and_the_batch_finishes(tmp_path: Path) -> None:
    (tmp_path / "passages.jsonl").write_text(json.dumps({"id": "1", "title": "T", "text": "x"}) + "\n")
    problems = [Problem("bad", "Capital of France?", '["Paris"]', 1), Problem("good", "Nobel?", '["x"]', 1)]
    with serving(_Service) as url:
        env = SearchEnv(
            SearchEnvConfig.model_validate(
                {
                    "type": "search",
                    "data_dir": str(tmp_path),
                    "passages_file": "passages.jsonl",
                    "question_sources": ("passage_titles",),
                    "prompt_format": "chatml",
                    "service_url": url,
                }
            )
        )
        # A real (HF fast) tokenizer: it raises on a lone surrogate, as SmolLM2's does.
        corpus = [env.render_prompt(p) for p in problems] + [BAD_CALL, GOOD_CALL, ANSWER]
        corpus += [env.format_observation(ToolResult("search", "success", t, 0.0)) for t in SHOWN]
        tok = train_tokenizer(corpus, env.special_tokens, 300)
        loop = AgentLoop(env, tok, [_SearchEngine(tok)], RolloutConfig(), policy_version=0, iteration=0)
        requests = [RolloutRequest(p, p.prompt_id, s) for p in problems for s in range(2)]
        rows = loop.run(requests, static_router())

    assert [(r["prompt_id"], r["finish_reason"], r["final_answer"]) for r in rows] == [
        ("bad", "answer", "Paris"),
        ("bad", "answer", "Paris"),
        ("good", "answer", "Paris"),
        ("good", "answer", "Paris"),
    ]
    assert [[e["status"] for e in r["tool_events"]] for r in rows] == [["success"]] * 4
    responses = [tok.decode(r["response_ids"], skip_special_tokens=False) for r in rows]
    assert all(f"<tool_response>\n{SHOWN[0]}\n</tool_response>" in t for t in responses[:2])
    assert all(f"<tool_response>\n{SHOWN[1]}\n</tool_response>" in t for t in responses[2:])
    table_from_rows(rows)  # every row, the sanitised one included, is a valid trajectory row


@pytest.mark.parametrize("fmt", [MARKERS, CHATML], ids=lambda f: f.name)
def test_every_observation_is_encodable_text(fmt: TextFormat) -> None:
    # The python and calculator tools' outputs pass here too: one choke point for every tool.
    text = fmt.observation("[1] T\ud800itle\udfff: text")
    assert "[1] T?itle?: text" in text
    assert text.encode("utf-8").decode("utf-8") == text


class _StrictCharTokenizer(CharTokenizer):
    """Character ids, but refuses text that is not valid UTF-8, as real tokenizers do."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        text.encode("utf-8")
        return super().encode(text, add_special_tokens)


class _RawSurrogateEnv(OneToolEnv):
    """`CALLBAD|` returns an observation with a lone surrogate, written without sanitising (an
    environment that bypasses the text protocol)."""

    def parse_turn(self, text: str) -> TurnAction:
        if text.startswith("CALLBAD"):
            return TurnAction("tool_call", tool="calc", arguments="bad")
        return super().parse_turn(text)

    def run_tool(self, action: TurnAction) -> ToolResult:
        if action.arguments == "bad":
            return ToolResult("calc", "success", "x\ud800", 0.0)
        return super().run_tool(action)


class _PerPromptEngine:
    """`CALLBAD|` for a prompt starting BAD, `CALL|` for any other; `ANS|` after an observation."""

    async def complete(self, http: Any, prompt_ids: Sequence[int], **_: Any) -> Completion:
        context = "".join(chr(i) for i in prompt_ids)
        text = "ANS|" if "|" in context else ("CALLBAD|" if context.startswith("BAD") else "CALL|")
        return Completion([ord(c) for c in text], [-0.5] * len(text), "stop")


def test_an_observation_that_cannot_be_encoded_ends_only_its_trajectory() -> None:
    loop = AgentLoop(
        _RawSurrogateEnv(4),
        _StrictCharTokenizer(),
        [_PerPromptEngine()],
        RolloutConfig(),
        policy_version=0,
        iteration=0,
    )
    requests = [RolloutRequest(Problem(p, p.upper(), "2", 1), p, 0) for p in ("good", "bad", "fine")]
    rows = loop.run(requests, static_router())
    assert [(r["prompt_id"], r["finish_reason"], r["num_turns"]) for r in rows] == [
        ("good", "answer", 2),
        ("bad", "error", 1),
        ("fine", "answer", 2),
    ]
    bad = rows[1]
    # The call turn is kept (trainable); no observation and no tool event follow it.
    assert (bad["response_ids"], bad["loss_mask"], bad["tool_events"]) == (
        [ord(c) for c in "CALLBAD|"],
        [1] * 8,
        [],
    )
    assert rows[0]["response_ids"] == [ord(c) for c in "CALL|xxxxxANS|"]
    table_from_rows(rows)
