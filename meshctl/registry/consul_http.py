"""How meshctl reaches Consul's HTTP API: the options (flags, else Consul's own CONSUL_*
environment) and a keep-alive connection that another thread can cut.

Every Consul client of meshctl (the catalog registry, the KV config source, `meshctl kv push`,
replicas' shared health and rollout state) talks through `ConsulConnection`, so TLS, the ACL token
and the answer's byte limit are handled once. It is apart from the blocking-query loop
(`consul_watch`) because one-shot writes and reads need the transport without the loop.

Each connection is owned by one caller, and `abort()` shuts its socket down, which ends a blocking
read at once instead of waiting out a 5-minute `wait`. (py-consul's client keeps its sockets
inside requests' pool, where nothing can interrupt them, and lets CONSUL_HTTP_TOKEN override an
explicit token; hence this small http.client transport.)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode, urlsplit

from meshctl.errors import RegistryError, UsageError
from meshctl.registry.consul_convert import ConsulMapping
from meshctl.registry.model import Protocol

MAX_WAIT: Final = 600.0  # Consul caps `wait` at 10 minutes

#: The status of an answer over the byte limit a request gave (its body is left unread), as
#: HTTP's "content too large".
OVERSIZED: Final = 413


@dataclass(frozen=True, slots=True)
class ConsulOptions:
    """How to reach Consul and how to map it; plain data, passed down (see `from_env`).

    `address` is `http(s)://host:port` or `host:port` (http; the port defaults to 8500, 8501 for
    https). Hosts are `NAME.<domain>`. `warning_is_healthy` keeps instances whose checks warn in
    the load balancing pool, as Consul's DNS and Envoy integration do. Durations are seconds.
    """

    address: str = "127.0.0.1:8500"
    token: str = ""
    ca_file: str = ""
    client_cert: str = ""
    client_key: str = ""
    tls_verify: bool = True
    datacenter: str = ""
    domain: str = "service.consul"
    namespace: str = "default"
    default_protocol: Protocol = Protocol.TCP
    warning_is_healthy: bool = True
    wait: float = 300.0  # how long Consul may hold a blocking query
    wait_jitter: float = 1 / 16  # up to this fraction is taken off each wait, at random
    request_timeout: float = 10.0  # connecting, and reading an answer beyond the wait
    backoff_min: float = 1.0  # after a failure; doubles up to backoff_max
    backoff_max: float = 30.0
    rate_burst: int = 4  # queries a watch may make at once ...
    rate_interval: float = 5.0  # ... before it is held to one per interval

    def __post_init__(self) -> None:
        split_address(self.address)
        if not 0 < self.wait <= MAX_WAIT:
            raise UsageError(f"consul wait must be more than 0 and at most {MAX_WAIT:.0f} s, not {self.wait}")
        if not 0 < self.backoff_min <= self.backoff_max or self.request_timeout <= 0:
            raise UsageError("consul backoff needs 0 < min <= max, and the request timeout must be positive")
        if self.rate_burst < 1 or self.rate_interval < 0 or not 0 <= self.wait_jitter < 1:
            raise UsageError("consul rate limit needs a burst of at least 1 and a non-negative interval")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        address: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        datacenter: str | None = None,
    ) -> ConsulOptions:
        """Options from flags, falling back to Consul's own environment variables, as its CLI does:
        CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE,
        CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY and CONSUL_HTTP_SSL_VERIFY."""
        env = os.environ if environ is None else environ
        addr = address or env.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
        if "://" not in addr and env.get("CONSUL_HTTP_SSL", "").lower() in ("1", "true"):
            addr = f"https://{addr}"
        if token is None:
            token = env.get("CONSUL_HTTP_TOKEN", "")
            if not token and env.get("CONSUL_HTTP_TOKEN_FILE"):
                try:
                    with open(env["CONSUL_HTTP_TOKEN_FILE"], encoding="utf-8") as f:
                        token = f.read().strip()
                except OSError as exc:
                    raise UsageError(f"cannot read CONSUL_HTTP_TOKEN_FILE: {exc}") from exc
        return cls(
            address=addr,
            token=token,
            ca_file=ca_file or env.get("CONSUL_CACERT", ""),
            client_cert=env.get("CONSUL_CLIENT_CERT", ""),
            client_key=env.get("CONSUL_CLIENT_KEY", ""),
            tls_verify=env.get("CONSUL_HTTP_SSL_VERIFY", "true").lower() not in ("0", "false"),
            datacenter=datacenter or "",
        )

    @property
    def url(self) -> str:
        scheme, host, port = split_address(self.address)
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    @property
    def mapping(self) -> ConsulMapping:
        return ConsulMapping(self.domain, self.namespace, self.default_protocol, self.warning_is_healthy)


def split_address(address: str) -> tuple[str, str, int]:
    text = address.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise UsageError(f"invalid consul address {address!r}: use http(s)://host:port or host:port")
    return parts.scheme, parts.hostname, port or (8501 if parts.scheme == "https" else 8500)


def describe_error(exc: BaseException) -> str:
    """A failed request in one line: a RegistryError's own words, else the exception's type and text."""
    if isinstance(exc, RegistryError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class ConnectionAborted(Exception):
    """The connection was cut by `ConsulConnection.abort()` (a watch being stopped)."""


@dataclass(frozen=True, slots=True)
class ConsulReply:
    """One answer of Consul: its status, headers (names in lower case) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def index(self) -> int:
        text = self.headers.get("x-consul-index", "")
        if not text.isdigit():
            raise RegistryError(f"consul sent no valid X-Consul-Index header ({text!r})")
        return int(text)

    def json(self, path: str) -> object:
        if self.status == 403:
            raise RegistryError(f"GET {path}: permission denied (HTTP 403, check the ACL token): {self._text()}")
        if self.status != 200:
            raise RegistryError(f"GET {path}: HTTP {self.status}: {self._text()}")
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise RegistryError(f"GET {path}: consul sent invalid JSON: {exc}") from exc

    def _text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()[:200]


class ConsulConnection:
    """One keep-alive HTTP connection to Consul that another thread can cut (`abort`)."""

    def __init__(self, options: ConsulOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def get(
        self, path: str, params: Mapping[str, str], timeout: float, *, retry_stale: bool = True, limit: int = 0
    ) -> ConsulReply:
        """GET `path`; a kept-alive connection that the server closed meanwhile is retried once.
        With `limit`, an answer of more bytes is not read: it comes back as status `OVERSIZED`."""
        return self.request("GET", path, params, timeout, retry_stale=retry_stale, limit=limit)

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        timeout: float,
        body: bytes | None = None,
        *,
        retry_stale: bool = True,
        limit: int = 0,
    ) -> ConsulReply:
        """`method` on `path`; a kept-alive connection the server closed meanwhile is retried once
        (a request that never reached Consul, so retrying a write cannot apply it twice)."""
        with self._lock:
            if self._aborted:
                raise ConnectionAborted
            reused = self._conn is not None
            conn = self._conn = self._conn or self._open()
        try:
            return self._exchange(conn, method, path, params, timeout, body=body, limit=limit)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self._drop(conn)
            if reused and retry_stale:
                return self.request(method, path, params, timeout, body, retry_stale=False, limit=limit)
            raise
        except BaseException:
            self._drop(conn)
            raise

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        params: Mapping[str, str],
        timeout: float,
        *,
        body: bytes | None,
        limit: int = 0,
    ) -> ConsulReply:
        if conn.sock is None:
            conn.connect()
        with self._lock:
            if self._aborted:
                raise ConnectionAborted
        conn.sock.settimeout(timeout)
        headers = {"Accept": "application/json", "User-Agent": "meshctl"}
        if self._options.token:
            headers["X-Consul-Token"] = self._options.token
        conn.request(method, f"{path}?{urlencode(params)}" if params else path, body=body, headers=headers)
        response = conn.getresponse()
        body = response.read(limit + 1) if limit else response.read()
        if limit and len(body) > limit:
            self._drop(conn)  # the rest of the answer is left unread
            return ConsulReply(OVERSIZED, {k.lower(): v for k, v in response.getheaders()}, b"")
        reply = ConsulReply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        if response.will_close:
            self._drop(conn)
        return reply

    def _open(self) -> http.client.HTTPConnection:
        o = self._options
        scheme, host, port = split_address(o.address)
        if scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=o.request_timeout)
        context = ssl.create_default_context(cafile=o.ca_file or None)
        if o.client_cert:
            context.load_cert_chain(o.client_cert, o.client_key or None)
        if not o.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(host, port, timeout=o.request_timeout, context=context)

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def abort(self) -> None:
        """End the request in flight now (shutting the socket down wakes a blocked read)."""
        with self._lock:
            self._aborted = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
