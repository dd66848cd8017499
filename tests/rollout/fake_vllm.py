"""`FakeVllmServer`: the real VllmServer (watchdog, health and identity checks, stop) running
fake_vllm_server.py instead of vLLM, for tests of our side of an engine's life in a second; and
`other_engine`, a server that takes an engine's port first."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from libra_core.rollout.vllm_server import VllmServer

FAKE_SERVER = Path(__file__).with_name("fake_vllm_server.py")


class FakeVllmServer(VllmServer):
    def command(self) -> list[str]:
        real = super().command()
        args = real[real.index("vllm.entrypoints.openai.api_server") + 1 :]
        return [sys.executable, str(FAKE_SERVER), *args]


@contextmanager
def other_engine(port: int) -> Iterator[None]:
    """Another run's engine on `port`: healthy, and serving a model named "policy" too."""

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"data": [{"id": "policy"}]}).encode() if self.path == "/v1/models" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", port), Other)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        srv.shutdown()
        srv.server_close()
