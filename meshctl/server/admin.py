"""The admin HTTP server: readiness, Prometheus metrics and the debug pages operators read.

A small HTTP/1.1 server on asyncio streams (GET only, one request per connection): the pages are
few, small and read by curl, Prometheus and `meshctl proxy-status`, so a web framework would be
all weight. Pages are computed from the server's state on request; nothing here blocks the loop
for long.

    /ready                      200 once config and registries have loaded, else 503
    /version                    meshctl's version and the snapshot version being served
    /metrics                    Prometheus text, Istio's metric names
    /debug/syncz                per proxy and type: sent and acked versions, nonce, NACK
    /debug/config_dump?proxyID= the proxy's config, as `meshctl dump -o json`
    /debug/registryz            services and endpoints, and each registry's status
    /debug/configz              loaded resources and the errors of files that failed to load
    /debug/history[?version=V]  the push history: versions, their changes and git commit, per proxy
    /debug/rollout              the staged rollout: fleet and candidate versions, held, pinned
    POST /debug/rollout?action=promote|hold|resume|rollback[&version=V]   an operator's action

Connections are untrusted: a client has `REQUEST_TIMEOUT` seconds to send its request head, and
at most `MAX_CONNECTIONS` are open at once; a new one past that closes the connection that has
waited longest for its head (an idle one), so a flood of idle connections cannot keep curl or
Prometheus out, nor use up the process's file descriptors. Connections closed that way, or that
broke, are not logged one by one: one line a minute at most says how many there were.

Access: `/ready`, `/version` and `/metrics` are always open (health checks and Prometheus hold no secret).
The `/debug` pages show every proxy's config and the whole registry, so with a bearer token
(`--admin-token-file`) they answer 401 unless the request carries `Authorization: Bearer TOKEN`;
without one they are open only when the server listens on loopback, and answer 403 otherwise
(listening beyond loopback must not publish the mesh's config by accident).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from meshctl.server.auth import BearerToken, is_loopback

logger = logging.getLogger("meshctl.server.admin")

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    503: "Service Unavailable",
}
_MAX_REQUEST_BYTES = 16 * 1024
#: Seconds a client has to send its request head once connected.
REQUEST_TIMEOUT = 5.0
#: Connections open at once; past this the one idle longest is closed.
MAX_CONNECTIONS = 128
#: The least time between two lines about connections closed unanswered.
_QUIET_LOG_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        return cls(status, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
        return cls(status, text.encode(), content_type)


class AdminState(Protocol):
    """What the admin pages read from the running server."""

    def ready(self) -> bool: ...

    def version(self) -> dict[str, Any]: ...

    def metrics_text(self) -> str: ...

    def syncz(self) -> list[dict[str, Any]]: ...

    def config_dump(self, proxy_id: str) -> dict[str, Any] | None: ...

    def registryz(self) -> dict[str, Any]: ...

    def configz(self) -> dict[str, Any]: ...

    def ready_note(self) -> str: ...

    def history(self, version: str = "") -> Any: ...

    def rollout(self) -> dict[str, Any]: ...

    def rollout_act(self, action: str, version: str = "") -> str: ...


def route(state: AdminState, path: str, query: Mapping[str, list[str]]) -> Response:
    """The response for one GET, from the server's state."""
    if path == "/ready":
        note = state.ready_note()
        note = f"{note}\n" if note else ""
        return Response.text(f"ready\n{note}") if state.ready() else Response.text(f"not ready\n{note}", 503)
    if path == "/version":
        return Response.json(state.version())
    if path == "/metrics":
        return Response.text(state.metrics_text(), content_type="text/plain; version=0.0.4; charset=utf-8")
    if path == "/debug/syncz":
        return Response.json(state.syncz())
    if path == "/debug/config_dump":
        proxy_id = (query.get("proxyID") or query.get("proxyId") or [""])[0]
        if not proxy_id:
            return Response.json({"error": "give ?proxyID=NODE_ID or NAME.NAMESPACE (see /debug/syncz)"}, 400)
        dump = state.config_dump(proxy_id)
        if dump is None:
            return Response.json({"error": f"no proxy {proxy_id!r} is connected"}, 404)
        return Response.json(dump)
    if path == "/debug/registryz":
        return Response.json(state.registryz())
    if path == "/debug/configz":
        return Response.json(state.configz())
    if path == "/debug/history":
        version = (query.get("version") or [""])[0]
        found = state.history(version)
        if found is None:
            return Response.json({"error": f"no version {version!r} in the push history"}, 404)
        return Response.json(found)
    if path == "/debug/rollout":
        return Response.json(state.rollout())
    if path in ("/", "/debug"):
        pages = [
            "/ready",
            "/version",
            "/metrics",
            "/debug/syncz",
            "/debug/config_dump?proxyID=",
            "/debug/registryz",
            "/debug/configz",
            "/debug/history",
            "/debug/rollout",
        ]
        return Response.text("\n".join(pages) + "\n")
    return Response.json({"error": f"no page {path}"}, 404)


def rollout_action(state: AdminState, query: Mapping[str, list[str]]) -> Response:
    """`POST /debug/rollout?action=...`: 200 with what was done, 409 with why it cannot be."""
    from meshctl.server.rollout import RolloutError

    action = (query.get("action") or [""])[0]
    version = (query.get("version") or [""])[0]
    try:
        done = state.rollout_act(action, version)
    except RolloutError as exc:
        return Response.json({"error": str(exc)}, 409)
    logger.info("rollout %s%s: %s", action, f" {version}" if version else "", done)
    return Response.json({"done": done, "rollout": state.rollout()})


def is_debug_page(path: str) -> bool:
    return path == "/debug" or path.startswith("/debug/")


def debug_access(authorization: str | None, token: BearerToken | None, loopback: bool) -> Response | None:
    """None when a request may read the /debug pages, else the refusal (see the module docstring)."""
    if token is not None:
        if token.verify(authorization):
            return None
        error = "invalid_token" if authorization else "invalid_request"
        refusal = Response.json(
            {"error": "the /debug pages need Authorization: Bearer TOKEN (--admin-token-file)"}, 401
        )
        return replace(refusal, headers=(("WWW-Authenticate", f'Bearer realm="meshctl", error="{error}"'),))
    if loopback:
        return None
    return Response.json(
        {
            "error": "the /debug pages are off: the admin server listens beyond loopback and no "
            "--admin-token-file was given (/ready and /metrics stay open)"
        },
        403,
    )


class AdminServer:
    """Serves `route` over HTTP on a host and port (port 0 picks a free one); the /debug pages
    only to requests `debug_access` lets through."""

    def __init__(self, state: AdminState, host: str, port: int, token: BearerToken | None = None) -> None:
        self._state = state
        self._host, self._port = host, port
        self._token = token
        self._loopback = is_loopback(host)
        self._server: asyncio.Server | None = None
        #: Open connections, oldest first, each True while it waits for its request head.
        self._open: dict[asyncio.StreamWriter, bool] = {}
        #: Connections closed without an answer (idle, evicted, broken) since the last line said so.
        self.unanswered = 0
        self._unanswered_total = 0
        self._said_at = 0.0

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def unanswered_total(self) -> int:
        """Connections closed without an answer since start (idle, evicted over the limit, broken)."""
        return self._unanswered_total

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        self._say_unanswered(force=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._make_room()
        self._open[writer] = True
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=REQUEST_TIMEOUT)
            except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                self._unanswered()
                return
            self._open[writer] = False
            try:
                response = self.answer(head, writer.get_extra_info("peername"))
            except Exception:
                logger.exception("admin request failed")  # a page's own bug, not the client's doing
                response = Response.json({"error": "internal error"}, 500)
            extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers)
            status = f"{response.status} {_REASONS.get(response.status, 'Error')}"
            head_out = (
                f"HTTP/1.1 {status}\r\n"
                f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
                f"{extra}Connection: close\r\n\r\n"
            )
            try:
                writer.write(head_out.encode() + response.body)
                await asyncio.wait_for(writer.drain(), timeout=REQUEST_TIMEOUT * 6)
            except (OSError, TimeoutError):
                self._unanswered()
        finally:
            self._open.pop(writer, None)
            writer.close()

    def _make_room(self) -> None:
        """Close the connection idle longest when `MAX_CONNECTIONS` are open (see the module docstring)."""
        if len(self._open) < MAX_CONNECTIONS:
            return
        oldest = next((w for w, idle in self._open.items() if idle), None)
        if oldest is not None:
            self._open.pop(oldest)
            oldest.close()  # its pending read ends, and counts it

    def _unanswered(self) -> None:
        self.unanswered += 1
        self._unanswered_total += 1
        self._say_unanswered()

    def _say_unanswered(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.unanswered or (not force and now - self._said_at < _QUIET_LOG_SECONDS):
            return
        logger.info(
            "closed %d admin connection(s) without an answer: no request within %gs, over the limit of %d "
            "open, or broken (%d since start)",
            self.unanswered,
            REQUEST_TIMEOUT,
            MAX_CONNECTIONS,
            self._unanswered_total,
        )
        self.unanswered, self._said_at = 0, now

    def answer(self, head: bytes, peer: object = None) -> Response:
        """The response to a request head (request line and headers), without I/O."""
        if len(head) > _MAX_REQUEST_BYTES:
            return Response.json({"error": "request too large"}, 400)
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split()
        if len(parts) != 3:
            return Response.json({"error": "bad request line"}, 400)
        method, target, _ = parts
        url = urlsplit(target)
        if method not in ("GET", "HEAD") and not (method == "POST" and url.path == "/debug/rollout"):
            return Response.json({"error": "only GET"}, 405)
        if is_debug_page(url.path):
            fields = (line.partition(":") for line in header_lines)
            authorization = next((v.strip() for k, _, v in fields if k.strip().lower() == "authorization"), None)
            refusal = debug_access(authorization, self._token, self._loopback)
            if refusal is not None:
                logger.info("refused %s to %s: %d", url.path, peer, refusal.status)
                return refusal
        if method == "POST":
            return rollout_action(self._state, parse_qs(url.query))
        return route(self._state, url.path, parse_qs(url.query))
