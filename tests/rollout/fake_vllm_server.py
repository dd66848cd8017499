"""A stand-in for `python -m vllm.entrypoints.openai.api_server` (standard library only), for tests
of what the pool and the server wrapper do around an engine: it takes vLLM's command line (the
flags it needs; the rest ignored) and answers the endpoints the pool and the weight sync call.

- GET /health -> 200; GET /v1/models -> every `--served-model-name`, as vLLM lists them;
- GET /served -> the contents of `version.txt` in the model folder, read at start and at each reload
  (which weights this engine serves), "?" without one; GET /reloads -> how many reloads it had;
  GET /pid -> its pid;
- POST /pause, /resume, /reset_prefix_cache -> 200; POST /collective_rpc reloads `version.txt` from
  `kwargs.weights_path`.
Environment knobs: FAKE_DELAY_S (sleep before binding, as vLLM imports for seconds), FAKE_CHILD=1
(start an "engine core" child in the process group, which stays when the server exits),
FAKE_EXIT_AFTER_S (the server exits with code 9 after that many seconds, leaving the child),
FAKE_SIGTERM_LOG=PATH (each SIGTERM appends a line to PATH; the server exits 0.5 s after the first,
as vLLM shuts down gracefully, so a repeated signal in that time is recorded). A key, from
`--api-key`, VLLM_API_KEY or FAKE_API_KEY, makes every path under /v1 answer 401 without it (as
vLLM's middleware does; /health stays open).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _version(folder: str) -> str:
    path = Path(folder) / "version.txt"
    return path.read_text().strip() if path.exists() else "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", nargs="+", default=["model"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default=None)
    args, _ = parser.parse_known_args()
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or os.environ.get("FAKE_API_KEY")
    time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
    state = {"served": _version(args.model), "reloads": 0}
    if os.environ.get("FAKE_CHILD"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body: bytes = b"", status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if (
                api_key
                and self.path.startswith("/v1")
                and self.headers.get("Authorization") != f"Bearer {api_key}"
            ):
                self._reply(b'{"error": "Unauthorized"}', 401)
                return
            models = {
                "object": "list",
                "data": [{"id": n, "object": "model"} for n in args.served_model_name],
            }
            bodies = {
                "/health": b"",
                "/v1/models": json.dumps(models).encode(),
                "/served": str(state["served"]).encode(),
                "/reloads": str(state["reloads"]).encode(),
                "/pid": str(os.getpid()).encode(),
            }
            body = bodies.get(self.path)
            self._reply(body or b"", 200 if body is not None else 404)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            payload = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/collective_rpc":
                state["served"] = _version(payload["kwargs"]["weights_path"])
                state["reloads"] = int(state["reloads"]) + 1
            self._reply(b"{}" if self.path == "/collective_rpc" else b"")

        def log_message(self, *args: object) -> None:
            pass

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as err:
        print(f"fake vllm: cannot bind {args.host}:{args.port}: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"fake vllm pid {os.getpid()} on {args.port} serving {state['served']}", flush=True)
    if os.environ.get("FAKE_SIGTERM_LOG"):
        sigterm_log = Path(os.environ["FAKE_SIGTERM_LOG"])

        def on_sigterm(signum: int, frame: object) -> None:
            with sigterm_log.open("a") as f:
                f.write(f"SIGTERM {time.monotonic()}\n")
            threading.Timer(0.5, lambda: os._exit(0)).start()

        signal.signal(signal.SIGTERM, on_sigterm)
    if os.environ.get("FAKE_EXIT_AFTER_S"):
        threading.Timer(float(os.environ["FAKE_EXIT_AFTER_S"]), lambda: os._exit(9)).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
