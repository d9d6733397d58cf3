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
    503: "Service Unavailable",
}
_MAX_REQUEST_BYTES = 16 * 1024


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


def route(state: AdminState, path: str, query: Mapping[str, list[str]]) -> Response:
    """The response for one GET, from the server's state."""
    if path == "/ready":
        return Response.text("ready\n") if state.ready() else Response.text("not ready\n", 503)
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
    if path in ("/", "/debug"):
        pages = [
            "/ready",
            "/version",
            "/metrics",
            "/debug/syncz",
            "/debug/config_dump?proxyID=",
            "/debug/registryz",
            "/debug/configz",
        ]
        return Response.text("\n".join(pages) + "\n")
    return Response.json({"error": f"no page {path}"}, 404)


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

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response = await self._respond(reader, writer.get_extra_info("peername"))
            extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers)
            head = (
                f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
                f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
                f"{extra}Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + response.body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:
            logger.exception("admin request failed")
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader, peer: object) -> Response:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        return self.answer(head, peer)

    def answer(self, head: bytes, peer: object = None) -> Response:
        """The response to a request head (request line and headers), without I/O."""
        if len(head) > _MAX_REQUEST_BYTES:
            return Response.json({"error": "request too large"}, 400)
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split()
        if len(parts) != 3:
            return Response.json({"error": "bad request line"}, 400)
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return Response.json({"error": "only GET"}, 405)
        url = urlsplit(target)
        if is_debug_page(url.path):
            fields = (line.partition(":") for line in header_lines)
            authorization = next((v.strip() for k, _, v in fields if k.strip().lower() == "authorization"), None)
            refusal = debug_access(authorization, self._token, self._loopback)
            if refusal is not None:
                logger.info("refused %s to %s: %d", url.path, peer, refusal.status)
                return refusal
        return route(self._state, url.path, parse_qs(url.query))
