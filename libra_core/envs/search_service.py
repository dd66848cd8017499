"""Local retrieval service: BM25 (the `bm25s` library) over a JSONL passage corpus, over HTTP.

Runs in its own process (`python -m libra_core.envs.search_service --passages FILE`), so retrieval
CPU and the injected latency are outside the agent loop, as with a real remote search API. It
binds a free local port and prints `PORT <n>` as its first stdout line. Endpoints:

    GET /health                      -> {"ok": true, "passages": N}
    GET /search?q=QUERY&k=K          -> {"results": [{"id", "title", "text", "score"}...]}

Results are the top-k passages with a positive BM25 score (so fewer than k for rare queries, none
for a query with no known word), each cut at a sentence end before `--max-passage-chars`; each
request sleeps a uniformly drawn extra latency. `SearchService` starts and stops the process; one
per (corpus, settings) is shared by all environments of a process and stopped at exit. The service
holds the read end of a pipe as its stdin and exits when it closes (`--exit-on-stdin-eof`), so it
never outlives the process that started it, even one killed by SIGKILL (which runs no atexit
handler). Started by hand without that flag, it runs until stopped.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


def cut_at_sentence(text: str, max_chars: int) -> str:
    """`text` if short enough, else its longest prefix ending a sentence (or a word) within `max_chars`."""
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = max(head.rfind(". "), head.rfind("? "), head.rfind("! "))
    if end >= max_chars // 3:
        return head[: end + 1]
    return head.rsplit(" ", 1)[0] + " ..."


class BM25Index:
    """bm25s index over passages; `search` is read-only and safe to call from several threads."""

    def __init__(self, passages: list[dict[str, str]]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.passages = passages
        corpus = [f"{p['title']} {p['text']}" for p in passages]
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        self._lock = threading.Lock()

    def search(self, query: str, k: int, max_chars: int) -> list[dict[str, Any]]:
        tokens = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:  # only stopwords or punctuation
            return []
        k = max(1, min(k, len(self.passages)))
        with self._lock:  # bm25s's retrieve keeps scratch state; serialise it
            docs, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        out = []
        for idx, score in zip(docs[0].tolist(), scores[0].tolist(), strict=True):
            if score > 0:
                p = self.passages[idx]
                text = cut_at_sentence(p["text"], max_chars)
                out.append({"id": p["id"], "title": p["title"], "text": text, "score": round(score, 3)})
        return out


def _handler(index: BM25Index, latency_ms: tuple[float, float], max_chars: int, max_k: int) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
            return

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            if url.path == "/health":
                self._send(200, {"ok": True, "passages": len(index.passages)})
                return
            if url.path != "/search":
                self._send(404, {"error": f"unknown path {url.path}"})
                return
            params = parse_qs(url.query)
            query = params.get("q", [""])[0]
            try:
                k = int(params.get("k", ["3"])[0])
            except ValueError:
                self._send(400, {"error": "k must be an integer"})
                return
            lo, hi = latency_ms
            time.sleep(random.uniform(lo, hi) / 1000.0)
            self._send(200, {"results": index.search(query, min(k, max_k), max_chars)})

    return Handler


def serve(
    passages_path: Path,
    latency_ms: tuple[float, float],
    max_chars: int,
    max_k: int,
    *,
    exit_on_stdin_eof: bool = False,
) -> None:
    from libra_core.envs.datasets import load_passages

    passages = [
        {"id": p.id, "title": p.title, "text": p.text}
        for p in load_passages(str(passages_path.parent), passages_path.name)
    ]
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), _handler(BM25Index(passages), latency_ms, max_chars, max_k)
    )
    server.daemon_threads = True
    if exit_on_stdin_eof:
        threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


def _exit_when_stdin_closes() -> None:
    """Block on stdin (a pipe from the starting process, which never writes); its end of file
    means that process is gone. The service holds no state worth a graceful shutdown."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


class SearchService:
    """The service process: started on a free port, stopped by `stop()` or at interpreter exit."""

    def __init__(
        self, passages_path: Path, *, latency_ms: tuple[float, float], max_passage_chars: int, max_top_k: int
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "libra_core.envs.search_service",
            "--passages",
            str(passages_path),
            "--latency-ms",
            str(latency_ms[0]),
            str(latency_ms[1]),
            "--max-passage-chars",
            str(max_passage_chars),
            "--max-top-k",
            str(max_top_k),
            "--exit-on-stdin-eof",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.process = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
        )
        atexit.register(self.stop)
        self.url = f"http://127.0.0.1:{self._read_port()}"
        logger.info("search service for %s at %s (pid %d)", passages_path, self.url, self.process.pid)

    def _read_port(self) -> int:
        assert self.process.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(STARTUP_TIMEOUT_S)
        line = result[0] if result else ""
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(
                f"search service did not start within {STARTUP_TIMEOUT_S:.0f} s (first line {line!r}); "
                "is bm25s installed (pip install bm25s)?"
            )
        return int(line.split()[1])

    def stop(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_SERVICES: dict[tuple[Any, ...], SearchService] = {}
_SERVICES_LOCK = threading.Lock()


def shared_service(
    passages_path: Path, *, latency_ms: tuple[float, float], max_passage_chars: int, max_top_k: int
) -> SearchService:
    """The process-wide service for these settings, started on first use (restarted if it died)."""
    key = (str(passages_path), latency_ms, max_passage_chars, max_top_k)
    with _SERVICES_LOCK:
        service = _SERVICES.get(key)
        if service is None or service.process.poll() is not None:
            service = SearchService(
                passages_path, latency_ms=latency_ms, max_passage_chars=max_passage_chars, max_top_k=max_top_k
            )
            _SERVICES[key] = service
        return service


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="BM25 search service over a JSONL passage file.")
    parser.add_argument("--passages", type=Path, required=True)
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(0.0, 0.0))
    parser.add_argument("--max-passage-chars", type=int, default=600)
    parser.add_argument("--max-top-k", type=int, default=10)
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="exit when stdin closes (set by SearchService, whose pipe closes when it dies)",
    )
    args = parser.parse_args(argv)
    serve(
        args.passages.resolve(),
        tuple(args.latency_ms),
        args.max_passage_chars,
        args.max_top_k,
        exit_on_stdin_eof=args.exit_on_stdin_eof,
    )


if __name__ == "__main__":
    main()
