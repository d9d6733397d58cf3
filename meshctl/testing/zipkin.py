"""A Zipkin collector's stand-in for tests: an HTTP server that takes `POST /api/v2/spans`
(Zipkin v2 JSON, what Envoy's Zipkin tracer sends) and keeps the spans; a context manager.

It answers 202 as Zipkin does, and 400 to a body that is not a JSON list of spans, so a tracer
that sends something else is seen to fail rather than counted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SPANS_PATH = "/api/v2/spans"


class ZipkinCollector:
    """Spans received on `host:port` (port 0: a free one), oldest first."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._spans: list[dict[str, Any]] = []
        self._posts = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._spans)

    @property
    def posts(self) -> int:
        """How many span batches were accepted."""
        with self._lock:
            return self._posts

    def paths(self) -> list[str]:
        """The `http.url` tag of every span received (the URL the traced request asked for)."""
        return [str(span.get("tags", {}).get("http.url", "")) for span in self.spans]

    def wait_for(self, found: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0) -> bool:
        """Whether `found(spans)` becomes true within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found(self.spans):
                return True
            time.sleep(0.1)
        return found(self.spans)

    def _received(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            self._spans.extend(batch)
            self._posts += 1

    def __enter__(self) -> ZipkinCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self._body()
                try:
                    batch = json.loads(body)
                except ValueError:
                    batch = None
                if self.path != SPANS_PATH or not isinstance(batch, list):
                    self.send_response(400 if self.path == SPANS_PATH else 404)
                    self.end_headers()
                    return
                collector._received([span for span in batch if isinstance(span, dict)])
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _body(self) -> bytes:
                if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                chunks: list[bytes] = []
                while True:  # Envoy's async client sends a body of unknown length in chunks
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="zipkin-collector", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
