"""`search`: open-domain question answering with a BM25 search tool over a local passage corpus.

The tool is an HTTP call to the search service (libra_core/envs/search_service.py), started on a
free local port on first use (or `service_url`). A call `search:QUERY` (optionally `QUERY | k=N`)
returns up to k passages `[i] Title: text`; payload sizes vary with k, how many passages score
above zero and passage lengths; latency with the service's injected delay. Status: `success`
with results, `failure` for an empty query, no hit, an HTTP error or an answer of the wrong shape
or over `MAX_RESPONSE_BYTES`, `timeout` past `request_timeout_s`. k and `max_passage_chars` are
enforced here too, whatever the service sends.

Questions: the NQ sample (`nq`; most answers are not in the 1,000-passage sample, measured in
docs/environments.md) and `passage_titles`, generated from the corpus: 'Which article contains:
"<a sentence of a passage>"?', answered by that passage's title (searchable, so warm-up has signal).
Reward: exact match (SQuAD normalisation) -> `correct`; otherwise max(`well_formed`, token F1 x
`correct`), the F1 credit capped at `MAX_F1_CREDIT` x `correct` (F1 ignores word order).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from libra_core.config.environments import SearchEnvConfig
from libra_core.envs.answer_check import exact_match, token_f1
from libra_core.envs.base import Problem, Segment, ToolResult, TurnAction, unknown_tool
from libra_core.envs.datasets import (
    Passage,
    QARecord,
    load_passages,
    load_questions,
    resolve_data_path,
    stable_id,
)
from libra_core.envs.protocol import text_format
from libra_core.envs.search_service import cut_at_sentence, shared_service
from libra_core.envs.splits import demonstration_texts

SYSTEM_PROMPT = (
    "Answer the question. You may search a Wikipedia sample with the search tool, e.g. <tool_call>\n"
    '{"name": "search", "arguments": "first nobel prize physics"}\n</tool_call>. '
    "Finish with 'Answer: <short answer>'."
)
MAX_QUERY_CHARS = 2000  # a query is a question's worth of text; a longer one cannot go in a URL
_K_SUFFIX = re.compile(r"^(.*?)\s*\|\s*k\s*=\s*(\d+)\s*$", re.S)
_MAX_K_DIGITS = 9
# The final answer of a chatml turn: the last line that starts with `Answer:` (markdown emphasis
# allowed), else the last "answer is X" / "answer: X" phrase; "the answer isn't" is no answer.
_ANSWER_LINE = re.compile(r"^[ \t*_#>]*(?:final\s+)?answer[\s*_]*:[\s*_]*(\S.*)$", re.I | re.M)
_ANSWER_PHRASE = re.compile(r"\banswer(?:\s+is\b|\s*:)[\s:*_]*(?=\S)", re.I)
MAX_RESPONSE_BYTES = 1 << 20  # a search answer is a few passages; a bigger body is a service fault
# Token F1 ignores word order ("Röntgen Conrad Wilhelm" scores 1.0): partial credit stays below
# `correct`, which only an exact match earns, so accuracy (reward >= correct) counts exact matches.
MAX_F1_CREDIT = 0.99
_SENTENCE = re.compile(r"(?:^|(?<=[.!?] ))[A-Z][^.!?]{40,160}[.!?]")  # whole sentences only


def title_question(passage: Passage, rng: random.Random) -> str | None:
    """A 'which article' question quoting one sentence of the passage (None if it has none)."""
    sentences = [s.strip() for s in _SENTENCE.findall(passage.text) if passage.title.lower() not in s.lower()]
    if not sentences:
        return None
    return f'Which Wikipedia article contains: "{rng.choice(sentences)}"?'


def final_answer_of(text: str) -> str | None:
    """The short answer a chatml turn gives (see `_ANSWER_LINE`), or None if it names none."""
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1].strip()
    phrases = list(_ANSWER_PHRASE.finditer(text))
    return text[phrases[-1].end() :].splitlines()[0].strip() if phrases else None


def parse_results(body: bytes, k: int, max_passage_chars: int) -> list[dict[str, str]]:
    """The first `k` passages of a service's answer {"results": [{"title", "text"}...]}, each title
    and text cut to `max_passage_chars` - enforced here, not trusted to the service (`service_url`
    may name any server). ValueError for a body of any other shape."""
    try:
        payload = json.loads(body)
    except RecursionError as exc:  # thousands of nested brackets
        raise ValueError("search answer nested too deeply") from exc
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list):
        raise ValueError("search answer has no list of results")
    out = []
    for r in results[:k]:
        if not (isinstance(r, dict) and isinstance(r.get("title"), str) and isinstance(r.get("text"), str)):
            raise ValueError("a search result is not an object with title and text strings")
        out.append(
            {
                "title": cut_at_sentence(r["title"], max_passage_chars),
                "text": cut_at_sentence(r["text"], max_passage_chars),
            }
        )
    return out


class SearchEnv:
    name = "search"

    def __init__(self, cfg: SearchEnvConfig) -> None:
        self.cfg = cfg
        self.format = text_format(cfg.prompt_format)
        self.special_tokens = self.format.special_tokens
        self.stop_tokens = self.format.stop_tokens
        self.max_turns = cfg.max_turns
        self.passages = load_passages(cfg.data_dir, cfg.passages_file)
        if not self.passages:  # the service could not index it, and each search would restart it
            path = resolve_data_path(cfg.data_dir, cfg.passages_file)
            raise ValueError(f"passages file {path} holds no passages; set environment.passages_file")
        self._by_title = {p.title: p for p in self.passages}
        self.problems = self._build_problems()
        self._url = cfg.service_url
        self.tools = ("search",)

    def _build_problems(self) -> list[Problem]:
        problems: list[Problem] = []
        if "nq" in self.cfg.question_sources:
            questions: tuple[QARecord, ...] = load_questions(self.cfg.data_dir, self.cfg.questions_file)
            problems += [Problem(f"nq-{q.id}", q.question, json.dumps(list(q.answers)), 2) for q in questions]
        if "passage_titles" in self.cfg.question_sources:
            rng = random.Random(0)  # fixed: the question set is part of the dataset, not of the run
            for p in self.passages:
                question = title_question(p, rng)
                if question is not None and p.title:
                    problems.append(Problem(stable_id("title", question), question, json.dumps([p.title]), 1))
        return problems

    # -- problems -------------------------------------------------------------------------------
    def sample_problems(self, n: int, seed: int, *, min_difficulty: int | None = None) -> list[Problem]:
        from libra_core.envs.datasets import sample_records

        return sample_records(self.problems, n, seed, min_difficulty)

    # -- agent-loop protocol --------------------------------------------------------------------
    def render_prompt(self, problem: Problem) -> str:
        return self.format.prompt(SYSTEM_PROMPT, problem.question)

    def parse_turn(self, turn_text: str) -> TurnAction:
        action = self.format.parse(turn_text, self.tools)
        if action.kind == "answer" and self.format.name == "chatml" and action.answer is not None:
            found = final_answer_of(action.answer)
            if found is not None:
                return TurnAction("answer", answer=found)
        return action

    def service_url(self) -> str:
        if self._url is None:
            path = resolve_data_path(self.cfg.data_dir, self.cfg.passages_file)
            service = shared_service(
                path,
                latency_ms=self.cfg.latency_ms,
                max_passage_chars=self.cfg.max_passage_chars,
                max_top_k=self.cfg.max_top_k,
            )
            self._url = service.url
        return self._url

    def run_tool(self, action: TurnAction) -> ToolResult:
        start = time.perf_counter()
        if action.tool != "search" or action.arguments is None:
            return unknown_tool(action.tool)
        query, k = action.arguments.strip(), self.cfg.top_k
        suffix = _K_SUFFIX.match(query)
        if suffix is not None:
            # More digits than any useful k means "as many as allowed": int() of a huge string would
            # raise (Python's 4,300-digit limit), and a tool must never raise.
            digits = suffix.group(2).lstrip("0") or "0"
            wanted = int(digits) if len(digits) <= _MAX_K_DIGITS else self.cfg.max_top_k
            query, k = suffix.group(1).strip(), max(1, min(wanted, self.cfg.max_top_k))
        if not query:
            return ToolResult("search", "failure", "error: empty query", time.perf_counter() - start)
        if len(query) > MAX_QUERY_CHARS:
            return ToolResult(
                "search",
                "failure",
                f"error: query over {MAX_QUERY_CHARS} characters",
                time.perf_counter() - start,
            )
        try:
            results = self._search(query, k, self.cfg.request_timeout_s)
        except (httpx.TimeoutException, TimeoutError):
            return ToolResult("search", "timeout", "error: search timed out", time.perf_counter() - start)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, KeyError, RuntimeError, OSError) as exc:
            if isinstance(exc, httpx.ConnectError) and self.cfg.service_url is None:
                self._url = None  # the shared service died: the next call starts it again
            return ToolResult(
                "search",
                "failure",
                f"error: search failed ({type(exc).__name__})",
                time.perf_counter() - start,
            )
        if not results:
            return ToolResult("search", "failure", "no results", time.perf_counter() - start)
        text = "\n".join(f"[{i + 1}] {r['title']}: {r['text']}" for i, r in enumerate(results))
        return ToolResult("search", "success", text, time.perf_counter() - start)

    def _search(self, query: str, k: int, timeout_s: float) -> list[dict[str, str]]:
        """The service's results; `TimeoutError` past `timeout_s` in total. httpx's timeouts bound
        each read, so a service trickling its headers or body a byte at a time never timed out
        (headers until 2026-12-06): the whole request runs under one `asyncio.wait_for`, on a thread
        of its own when this thread runs an event loop. The shared service starts on a process's
        first search, before the clock starts (its start counted against the deadline until
        2026-12-06, so a first, healthy search under a short request_timeout_s read as a timeout)."""
        url = self.service_url()
        body = _call_async(lambda: asyncio.wait_for(_fetch(url, query, k), timeout_s))
        return parse_results(body, k, self.cfg.max_passage_chars)

    def format_observation(self, result: ToolResult) -> str:
        return self.format.observation(result.observation)

    def reward(self, reference_answer: str, final_answer: str | None) -> float:
        weights = self.cfg.reward
        if final_answer is None or not final_answer.strip():
            return weights.malformed
        golds = json.loads(reference_answer)
        if exact_match(final_answer, golds):
            return weights.correct
        credit = min(token_f1(final_answer, golds), MAX_F1_CREDIT) * weights.correct
        return max(weights.well_formed, credit)

    # -- supervision ----------------------------------------------------------------------------
    def demonstration(self, problem: Problem) -> list[Segment]:
        golds = json.loads(problem.reference_answer)
        query = problem.question
        if problem.question.startswith("Which Wikipedia article contains:"):
            query = problem.question.split(":", 1)[1].strip().strip('?"')
        # The observation is a representative result (the corpus passage); a demonstration must not
        # depend on a running service.
        hits = [self._by_title[golds[0]]] if golds[0] in self._by_title else []
        hits = hits or [p for p in self.passages if golds[0].lower() in p.text.lower()][:1]
        shown = (
            "\n".join(f"[1] {p.title}: {p.text[: self.cfg.max_passage_chars]}" for p in hits) or "no results"
        )
        answer = golds[0] if self.format.name == "markers" else f"Answer: {golds[0]}"
        return [
            Segment(self.render_prompt(problem), trainable=False),
            Segment(self.format.call("search", query), trainable=True),
            Segment(self.format.observation(shown), trainable=False),
            Segment(self.format.answer(answer), trainable=True),
        ]

    def corpus(self, n: int, seed: int) -> list[str]:
        texts = demonstration_texts(self, n, seed)
        texts += [self.format.observation(f"{p.title}: {p.text}") for p in self.passages]
        texts.append(self.format.observation("error: search timed out\nerror: empty query\nno results"))
        return texts


async def _fetch(url: str, query: str, k: int) -> bytes:
    body = bytearray()
    async with (
        httpx.AsyncClient(timeout=None) as client,  # the caller's wait_for bounds the whole request
        client.stream("GET", f"{url}/search", params={"q": query, "k": k}) as response,
    ):
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise ValueError(f"the search service answered over {MAX_RESPONSE_BYTES} bytes")
    return bytes(body)


def _call_async(make: Callable[[], Coroutine[Any, Any, bytes]]) -> bytes:
    """Run the coroutine `make()` returns to completion from synchronous code (the agent loop calls
    tools on worker threads; a caller on an event loop's thread gets a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
