"""A fake Consul agent over real HTTP, for tests that need Consul without installing it.

`FakeConsul` serves the part of Consul's HTTP API that meshctl uses, as Consul documents it:

- `GET /v1/catalog/services` and `GET /v1/health/service/NAME` (with `passing`, `dc`), both as
  blocking queries: with `index` and `wait` a request is held until the data it covers changes
  past `index` or `wait` passes (5 minutes by default, at most 10), then answered with
  `X-Consul-Index`; one raft-like index counts every write;
- `PUT /v1/catalog/register` and `PUT /v1/catalog/deregister` with Consul's bodies (field names
  in any case, as Consul's JSON decoding allows), so the same test code can drive a real agent
  (`meshctl.testing.fake_consul_catalog`);
- the KV store: `GET /v1/kv/KEY` (JSON with base64 values, `?raw`, `?recurse`, `?keys`), as a
  blocking query on a key or prefix (its index is the highest ModifyIndex under it, deletions
  included, as Consul's tombstones make it); `PUT /v1/kv/KEY` (`?cas=`, `?flags=`), `DELETE
  /v1/kv/KEY` (`?recurse`, `?cas=`), and `PUT /v1/txn` with the KV verbs set, cas, get, delete,
  delete-cas and check-index: all-or-nothing at one index, at most 64 operations, and Consul's
  409 with `{"Errors": [{"OpIndex", "What"}]}` when one fails (`meshctl.testing.fake_consul_kv`);
- sessions, `?acquire=` and `?release=` on KV writes, and the `lock` and `unlock` transaction
  verbs, with TTLs, lock delays and the release and delete behaviours
  (`meshctl.testing.fake_consul_sessions`);
- ACL tokens (`X-Consul-Token`, a bearer token or `?token=`) when built with `acl_token`: a
  request without it gets 403. (A real Consul answers anonymous reads with results filtered
  by ACLs rather than 403; the fake is stricter so a missing token cannot go unnoticed.)

Tests also get controls a real agent lacks: `stop()`/`start()` (the port is kept, so clients see
an outage and a recovery), `set_index()` (indexes go backwards, as after a snapshot restore),
`zero_index` (answer at once with index 0, an old Consul bug), and a log of every request.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from meshctl.testing.fake_consul_catalog import CatalogMixin
from meshctl.testing.fake_consul_kv import KvMixin, kv_json
from meshctl.testing.fake_consul_sessions import ConsulAPIError, SessionsMixin, SessionTable, route_session

_MAX_WAIT: Final = 600.0
_DEFAULT_WAIT: Final = 300.0
_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    token: str


class FakeConsul(CatalogMixin, KvMixin, SessionsMixin):
    """A Consul agent's catalog and health API on 127.0.0.1; use as a context manager."""

    def __init__(
        self,
        *,
        datacenter: str = "dc1",
        acl_token: str | None = None,
        port: int = 0,
        session_ttl_min: float = 10.0,
        node_name: str = "fake-agent",
    ) -> None:
        self.datacenter = datacenter
        #: Sessions (`session_ttl_min` is the agent's setting of that name: the least TTL taken).
        self.sessions = SessionTable(node_name, session_ttl_min)
        self.acl_token = acl_token
        self.zero_index = False
        self.requests: list[RecordedRequest] = []
        #: Bytes of every answer's body so far: what clients were made to read.
        self.bytes_sent = 0
        self._port = port
        self._cond = threading.Condition()
        self._index = 1
        self._catalog_index = 1
        self._service_index: dict[str, int] = {}
        self._epoch = 0  # bumped by set_index: wakes every blocked query, as a restore does
        self._nodes: dict[str, dict[str, Any]] = {}
        self._services: dict[tuple[str, str], dict[str, Any]] = {}
        self._checks: dict[tuple[str, str], dict[str, Any]] = {}
        self._kv: dict[str, dict[str, Any]] = {}  # key -> entry, Value as bytes
        self._kv_tombstones: dict[str, int] = {}  # deleted key -> index of its deletion
        self._kv_index = 1  # the KV table's index: of the last KV write
        self._server: _Server | None = None
        self._generation = 0  # bumped by stop: requests of a stopped server are dropped
        self._connections: set[socket.socket] = set()
        self._in_flight: dict[str, int] = {}

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> None:
        """Listen (again) on the same port; the catalog survives a stop."""
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.fake = self
        self._port = server.server_address[1]
        with self._cond:
            self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-consul", daemon=True).start()

    def stop(self) -> None:
        """Stop listening and drop every connection, answered or not, as a dying agent does."""
        with self._cond:
            server, self._server = self._server, None
            self._generation += 1
            self._cond.notify_all()
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._cond:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 5
        with self._cond:
            while self._connections and time.monotonic() < deadline:
                self._cond.wait(0.05)

    def __enter__(self) -> FakeConsul:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test controls ----------------------------------------------------------------------

    def set_index(self, index: int) -> None:
        """Move every index back to at most `index` and wake all blocked queries."""
        with self._cond:
            self._index = index
            self._catalog_index = min(self._catalog_index, index)
            self._service_index = {k: min(v, index) for k, v in self._service_index.items()}
            self._kv_index = min(self._kv_index, index)
            self._kv_tombstones = {k: min(v, index) for k, v in self._kv_tombstones.items()}
            for entry in self._kv.values():
                entry["ModifyIndex"] = min(entry["ModifyIndex"], index)
                entry["CreateIndex"] = min(entry["CreateIndex"], index)
            self._epoch += 1
            self._cond.notify_all()

    def request_count(self, path: str | None = None) -> int:
        with self._cond:
            return sum(1 for r in self.requests if path is None or r.path == path)

    def in_flight(self, path: str) -> int:
        """Requests on `path` being served now (blocked queries included)."""
        with self._cond:
            return self._in_flight.get(path, 0)

    # --- blocking reads ---------------------------------------------------------------------

    def _kv_read(
        self, handler: _Handler, key: str, query: Mapping[str, str]
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """A blocking KV read (see `_blocking_read`): the index and the entries it covers."""
        recurse = "recurse" in query or "keys" in query
        index = int(query["index"]) if query.get("index", "").isdigit() else 0
        deadline = time.monotonic() + (_duration(query.get("wait", "")) if index else 0.0)
        with self._cond:
            epoch, generation = self._epoch, handler.generation
            while not self.zero_index and self.kv_index_of(key, recurse) <= index and epoch == self._epoch:
                if self._reap_sessions():
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or generation != self._generation or handler.client_gone():
                    break
                self._cond.wait(min(remaining, 0.2))
            if generation != self._generation or handler.client_gone():
                return None
            keys = sorted(k for k in self._kv if k.startswith(key)) if recurse else [key] if key in self._kv else []
            entries = [dict(self._kv[k]) for k in keys]
            return (0 if self.zero_index else max(self.kv_index_of(key, recurse), 1)), entries

    def _blocking_read(self, handler: _Handler, path: str, query: Mapping[str, str]) -> tuple[int, object] | None:
        """Hold until the data changes past `index` or `wait` passes; None if the server stopped
        or the client went away."""
        name = unquote(path.rsplit("/", 1)[1]) if path.startswith("/v1/health/") else ""
        passing = "passing" in query and query["passing"] != "false"
        index = int(query["index"]) if query.get("index", "").isdigit() else 0
        deadline = time.monotonic() + (_duration(query.get("wait", "")) if index else 0.0)
        with self._cond:
            epoch, generation = self._epoch, handler.generation
            while not self.zero_index and self.index_of(name) <= index and epoch == self._epoch:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or generation != self._generation or handler.client_gone():
                    break
                self._cond.wait(min(remaining, 0.2))
            if generation != self._generation or handler.client_gone():
                return None
            data = self.health_entries(name, passing) if name else self.catalog_services()
            return (0 if self.zero_index else max(self.index_of(name), 1)), data

    def _authorize(self, token: str) -> None:
        if self.acl_token is not None and token != self.acl_token:
            raise ConsulAPIError(403, "ACL not found" if token else "Permission denied")


def _duration(text: str) -> float:
    """A Go duration (`5m`, `10s`, `1500ms`); Consul's default and cap when absent or too long."""
    found = _DURATION.findall(text)
    if not found:
        return _DEFAULT_WAIT
    return min(sum(float(n) * _UNITS[u] for n, u in found), _MAX_WAIT)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeConsul

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # skip HTTPServer's reverse DNS lookup of the host
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that hang up mid-request are normal here (outages, stopped watches)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Consul's API speaks it
    server: _Server

    def setup(self) -> None:
        super().setup()
        fake = self.server.fake
        with fake._cond:
            self.generation = fake._generation
            fake._connections.add(self.connection)
            accepted_before_stop = fake._server is not self.server
        if accepted_before_stop:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        fake = self.server.fake
        with fake._cond:
            fake._connections.discard(self.connection)
            fake._cond.notify_all()
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read the request log instead."""

    def client_gone(self) -> bool:
        """True when the client closed its end (a blocked query nobody waits for any more)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        fake = self.server.fake
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        bearer = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        token = self.headers.get("X-Consul-Token") or bearer or query.get("token", "")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with fake._cond:
            fake._reap_sessions()
            fake.requests.append(RecordedRequest(method, parts.path, query, token))
            fake._in_flight[parts.path] = fake._in_flight.get(parts.path, 0) + 1
        try:
            fake._authorize(token)
            if "dc" in query and query["dc"] != fake.datacenter:
                raise ConsulAPIError(500, f"No path to datacenter {query['dc']}")
            self._route(method, parts.path, query, body)
        except ConsulAPIError as exc:
            self._send(exc.status, str(exc).encode(), {})
        finally:
            with fake._cond:
                fake._in_flight[parts.path] -= 1

    def _route(self, method: str, path: str, query: Mapping[str, str], body: bytes) -> None:
        fake = self.server.fake
        if method == "GET" and (path == "/v1/catalog/services" or path.startswith("/v1/health/service/")):
            answer = fake._blocking_read(self, path, query)
            if answer is None:
                self.close_connection = True  # dropped unanswered, as by a dying agent
                return
            index, data = answer
            self._send(200, json.dumps(data).encode(), {"X-Consul-Index": str(index)})
        elif path.startswith("/v1/kv/"):
            self._route_kv(method, unquote(path[len("/v1/kv/") :]), query, body)
        elif method == "PUT" and path == "/v1/txn":
            try:
                ops = json.loads(body or b"[]")
            except ValueError as exc:
                raise ConsulAPIError(400, f"Failed to parse body: {exc}") from exc
            results = fake.txn(ops)
            self._send(
                200, json.dumps({"Results": results, "Errors": None}).encode(), {"X-Consul-Index": str(fake._index)}
            )
        elif path.startswith("/v1/session/"):
            route_session(self, fake, method, path[len("/v1/session/") :], body)
        elif method == "GET" and path == "/v1/status/leader":
            self._send(200, b'"127.0.0.1:8300"', {})
        elif method == "PUT" and path in ("/v1/catalog/register", "/v1/catalog/deregister"):
            try:
                payload = json.loads(body or b"{}")
            except ValueError as exc:
                raise ConsulAPIError(400, f"Request decode failed: {exc}") from exc
            (fake.register if path.endswith("/register") else fake.deregister)(payload)
            self._send(200, b"true", {})
        else:
            raise ConsulAPIError(404, f"no such endpoint: {method} {path}")

    def _route_kv(self, method: str, key: str, query: Mapping[str, str], body: bytes) -> None:
        fake = self.server.fake
        cas = int(query["cas"]) if query.get("cas", "").isdigit() else None
        if "cas" in query and cas is None:
            raise ConsulAPIError(400, "Invalid CAS index")
        if method == "GET":
            answer = fake._kv_read(self, key, query)
            if answer is None:
                self.close_connection = True
                return
            index, entries = answer
            headers = {"X-Consul-Index": str(index)}
            if not entries:
                self._send(404, b"", headers)
            elif "keys" in query:
                separator = query.get("separator", "")
                keys: list[str] = []
                for entry in entries:
                    k = entry["Key"]
                    cut = k.find(separator, len(key)) if separator else -1
                    shown = k[: cut + len(separator)] if cut >= 0 else k
                    if shown not in keys:
                        keys.append(shown)
                self._send(200, json.dumps(keys).encode(), headers)
            elif "raw" in query:
                self._send(200, bytes(entries[0]["Value"]), headers, content_type="application/octet-stream")
            else:
                self._send(200, json.dumps([kv_json(e) for e in entries]).encode(), headers)
        elif method == "PUT":
            flags = int(query["flags"]) if query.get("flags", "").isdigit() else 0
            if "acquire" in query or "release" in query:
                session = query.get("acquire") or query.get("release", "")
                done = fake.kv_lock(key, body, session, release="acquire" not in query, flags=flags)
            else:
                done = fake.kv_put(key, body, cas=cas, flags=flags)
            self._send(200, json.dumps(done).encode(), {})
        elif method == "DELETE":
            done = fake.kv_delete(key, recurse="recurse" in query, cas=cas)
            self._send(200, json.dumps(done).encode(), {})
        else:
            raise ConsulAPIError(405, f"method {method} not allowed")

    def _send(self, status: int, body: bytes, headers: Mapping[str, str], content_type: str = "") -> None:
        self.send_response(status)
        json_body = status == 200 or body.startswith(b"{")
        self.send_header("Content-Type", content_type or ("application/json" if json_body else "text/plain"))
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        with self.server.fake._cond:
            self.server.fake.bytes_sent += len(body)
