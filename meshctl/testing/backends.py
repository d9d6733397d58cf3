"""Real HTTP backends on loopback addresses, and a client that keeps sending requests through Envoy.

End-to-end tests need to know which workload answered a request that Envoy routed, and whether
any request failed while the config changed underneath. `Backend` is a threaded HTTP/1.1 server
bound to one address of 127.0.0.0/8 (each workload of a test mesh gets its own address, as each
VM has its own) that names itself in the `x-backend` header and in the body; it can be told to
answer 503 the next n times or to answer slowly, to exercise retries and timeouts, and it counts
the requests it is sent and keeps the headers of the last one, to show what reached the upstream
(a retry, a header Envoy passed on).

`RequestLoop` sends requests one after the other on a thread, each on a new connection, so every
request goes through the listener config Envoy holds at that moment (a reused keep-alive
connection would stay on a listener being drained), and counts answers by backend and every
failure: an error status, a refused or reset connection, a timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BACKEND_HEADER = "x-backend"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    backend: Backend


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.1 so Envoy's upstream connections are kept alive, as with a real application.
    protocol_version = "HTTP/1.1"
    # The status line and headers go out in one write and the body in another; with Nagle on,
    # the body waits for Envoy's delayed ACK (40 ms a request).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.server.backend._opened(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.backend._closed(self.connection)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, delay = self.server.backend._next_answer(self.headers.items())
        if delay:
            time.sleep(delay)
        name = self.server.backend.name
        body = b"" if self.command == "HEAD" else f"{name}\n".encode()
        # A client that gave up on a slow answer (Envoy at a route timeout) has closed the connection.
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header(BACKEND_HEADER, name)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a loop of requests would flood the test output."""


class Backend:
    """One workload's HTTP server on `host:port`; a context manager.

    Every answer carries the backend's name (`x-backend` header and body). `fail_next(n)` makes
    the next n requests answer an error status; `delay` makes every answer wait that long.
    `served` counts the requests and `last_headers` keeps the headers of the last one; `reset()`
    starts both afresh for a test that shares the backend with others.
    """

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0, *, delay: float = 0.0) -> None:
        self.name = name
        self.host = host
        self._port = port
        self.delay = delay
        self._failures = 0
        self._failure_status = 503
        self._served = 0
        self._last_headers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def served(self) -> int:
        """Requests answered so far, errors included."""
        with self._lock:
            return self._served

    @property
    def last_headers(self) -> dict[str, str]:
        """The headers of the last request, names lower-cased; empty before the first."""
        with self._lock:
            return dict(self._last_headers)

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next `count` requests with `status` instead of 200."""
        with self._lock:
            self._failures, self._failure_status = count, status

    def reset(self) -> None:
        """Forget the requests served and the failures still to come."""
        with self._lock:
            self._served = 0
            self._failures = 0

    def start(self) -> None:
        server = _Server((self.host, self._port), _Handler)
        server.backend = self
        self._port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), name=f"backend-{self.name}", daemon=True).start()

    def stop(self) -> None:
        """Stop listening and close every open connection (Envoy keeps upstream ones alive)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_answer(self, headers: Iterable[tuple[str, str]]) -> tuple[int, float]:
        with self._lock:
            self._served += 1
            self._last_headers = {name.lower(): value for name, value in headers}
            if self._failures > 0:
                self._failures -= 1
                return self._failure_status, self.delay
            return 200, self.delay

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)


@dataclass(frozen=True, slots=True)
class Reply:
    """One request's outcome: the status (0 when no response came), who answered, and any error.

    The response's headers (names lower-cased) and body come along for a test that looks at them
    (a redirect's `location`, Envoy's own answer); two replies compare by the outcome alone.
    """

    status: int
    backend: str
    error: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, compare=False)
    body: str = field(default="", compare=False)

    @property
    def ok(self) -> bool:
        return self.status == 200


def send(
    port: int,
    host: str,
    *,
    path: str = "/",
    headers: Mapping[str, str] | None = None,
    address: str = "127.0.0.1",
    timeout: float = 5.0,
) -> Reply:
    """One GET to `address:port` with `Host: host`, on a new connection; never raises."""
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        response = conn.getresponse()
        body = response.read()
        backend = response.getheader(BACKEND_HEADER) or ""
        headers = {name.lower(): value for name, value in response.getheaders()}
        text = body.decode(errors="replace")
        # Envoy says why in the body of its own replies ("no healthy upstream").
        error = body[:200].decode(errors="replace").strip() if response.status != 200 else ""
        return Reply(response.status, backend, error, headers, text)
    except (OSError, http.client.HTTPException) as exc:
        return Reply(0, "", f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed request of a loop: when (monotonic seconds) and what happened."""

    at: float
    status: int
    error: str


class RequestLoop:
    """Sends GETs through Envoy one after another on a thread until stopped; a context manager.

    Counts answers by backend and records every failure, so a test can assert that nothing
    failed while it changed the config, and see where traffic went since a `mark()`.
    """

    def __init__(
        self,
        port: int,
        host: str,
        *,
        headers: Mapping[str, str] | None = None,
        address: str = "127.0.0.1",
        timeout: float = 5.0,
        pause: float = 0.0,
    ) -> None:
        self._send: Callable[[], Reply] = lambda: send(port, host, headers=headers, address=address, timeout=timeout)
        self._pause = pause
        self._lock = threading.Lock()
        self._replies: list[str] = []
        self._failures: list[Failure] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="request-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def __enter__(self) -> RequestLoop:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            reply = self._send()
            with self._lock:
                if reply.ok:
                    self._replies.append(reply.backend)
                else:
                    self._failures.append(Failure(time.monotonic(), reply.status, reply.error))
            if self._pause:
                self._stop.wait(self._pause)

    @property
    def succeeded(self) -> int:
        with self._lock:
            return len(self._replies)

    @property
    def failures(self) -> list[Failure]:
        with self._lock:
            return list(self._failures)

    def mark(self) -> int:
        """A position in the answers, for `since`."""
        with self._lock:
            return len(self._replies)

    def since(self, mark: int) -> Counter[str]:
        """Successful answers by backend after `mark`."""
        with self._lock:
            return Counter(self._replies[mark:])

    def settled_on(self, backend: str, mark: int, count: int = 5) -> bool:
        """True when at least `count` answers came after `mark` and the last `count` all came
        from `backend`: traffic has moved there (answers in flight during a switch may not)."""
        with self._lock:
            recent = self._replies[mark:][-count:]
        return len(recent) == count and all(name == backend for name in recent)

    def wait_for_answers(self, count: int, *, timeout: float = 30.0) -> None:
        """Block until `count` more requests have succeeded; raises TimeoutError otherwise."""
        target = self.succeeded + count
        deadline = time.monotonic() + timeout
        while self.succeeded < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.succeeded} answers, wanted {target}; failures: {self.failures[-5:]}")
            time.sleep(0.01)


class TcpEcho:
    """One workload's plain TCP server on `host:port`; a context manager. It answers each
    connection's first read with its name and what it read (`pg-a:hello`), then closes: what a
    test of TCP routing needs to see which backend a connection reached. Nothing in the bytes
    names a service, so only the address the client dialled can choose the backend."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.name = name
        self.host = host
        self.port = port
        self._socket: socket.socket | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self._socket = sock
        threading.Thread(target=self._serve, args=(sock,), name=f"tcp-echo-{self.name}", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            data = conn.recv(4096)
            conn.sendall(self.name.encode() + b":" + data)

    def stop(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> TcpEcho:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tcp_exchange(host: str, port: int, data: bytes = b"hello", timeout: float = 5.0) -> bytes:
    """Send `data` on a new connection to `host:port` and read until the peer closes; b"" when
    the connection fails or is closed unanswered (no route, no listener)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(data)
            chunks = []
            while chunk := conn.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return b""
