"""Consul's catalog as a registry: blocking queries in, a complete ServiceModel out.

One thread watches `/v1/catalog/services`; each service it lists gets its own thread watching
`/v1/health/service/NAME` (every instance with its checks, so health is mapped rather than
filtered away). A watch starts when a service appears in the catalog and stops when it leaves.
The mapping from Consul's JSON to the model is in `consul_convert`.

Each loop follows Consul's rules for blocking queries (api-docs/features/blocking):

- the next `index` is the `X-Consul-Index` of the last answer; an index lower than the one sent
  resets it to 0 (one plain read, then blocking again), and an index of 0 is used as 1, so a
  buggy answer never turns the loop into a busy loop;
- `wait` (5 minutes by default) gets up to 1/16 of random jitter, so watches started together
  do not wake together;
- each loop is rate limited by a token bucket (a burst of 4, then one query per 5 s), which
  never delays the happy case but bounds a service that churns, or a Consul that answers at once;
- errors back off exponentially with jitter (1 s to 30 s by default) and never end the thread;
  the first query after an error keeps its index but waits at most a second, so an answer
  confirms the recovery (and clears the error from `status()`) without waiting out `wait`.

Stopping is prompt: each watch owns its HTTP connection, and `stop()` shuts the socket down,
which ends a blocking read at once instead of waiting out a 5-minute `wait`. (py-consul's client
keeps its sockets inside requests' pool, where nothing can interrupt them, and lets
CONSUL_HTTP_TOKEN override an explicit token; hence the small http.client transport here.)

When Consul is unreachable or answers errors, nothing is removed: the model keeps every last
known service and endpoint, `status()` says what fails, and each loop carries on from the index
it had, so nothing is lost or repeated when Consul comes back.

Each watched service holds one connection; Consul limits connections per client address
(`limits.http_max_conns_per_client`, 200 by default), so more than a few hundred services needs
that limit raised; the model carries a note when the count gets close.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlencode, urlsplit

from meshctl.errors import RegistryError, UsageError
from meshctl.registry.aggregate import model_change
from meshctl.registry.base import Listener
from meshctl.registry.consul_convert import ConsulMapping, ConvertedService, assemble_model, convert_service
from meshctl.registry.model import Protocol, RegistryStatus, ServiceModel

logger = logging.getLogger("meshctl.registry.consul")

CATALOG_PATH: Final = "/v1/catalog/services"
MAX_WAIT: Final = 600.0  # Consul caps `wait` at 10 minutes
RECOVERY_WAIT: Final = 1.0
CONNECTION_NOTE_AT: Final = 190  # Consul's default limits.http_max_conns_per_client is 200


#: The status of an answer over the byte limit a request gave (its body is left unread), as
#: HTTP's "content too large".
OVERSIZED: Final = 413


def health_path(service: str) -> str:
    return f"/v1/health/service/{quote(service, safe='')}"


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
        _split_address(self.address)
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
        scheme, host, port = _split_address(self.address)
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    @property
    def mapping(self) -> ConsulMapping:
        return ConsulMapping(self.domain, self.namespace, self.default_protocol, self.warning_is_healthy)


def _split_address(address: str) -> tuple[str, str, int]:
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


def next_index(sent: int, returned: int) -> int:
    """The index for the next query: 0 (a plain read) when Consul's index went backwards, and
    never below 1 after an answer, so a query that should block does block."""
    if returned < sent:
        return 0
    return max(returned, 1)


# --- transport -------------------------------------------------------------------------------


class _Aborted(Exception):
    """The connection was shut down by `stop()`."""


@dataclass(frozen=True, slots=True)
class _Reply:
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


class _Connection:
    """One keep-alive HTTP connection to Consul that another thread can cut (`abort`)."""

    def __init__(self, options: ConsulOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def get(
        self, path: str, params: Mapping[str, str], timeout: float, *, retry_stale: bool = True, limit: int = 0
    ) -> _Reply:
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
    ) -> _Reply:
        """`method` on `path`; a kept-alive connection the server closed meanwhile is retried once
        (a request that never reached Consul, so retrying a write cannot apply it twice)."""
        with self._lock:
            if self._aborted:
                raise _Aborted
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
    ) -> _Reply:
        if conn.sock is None:
            conn.connect()
        with self._lock:
            if self._aborted:
                raise _Aborted
        conn.sock.settimeout(timeout)
        headers = {"Accept": "application/json", "User-Agent": "meshctl"}
        if self._options.token:
            headers["X-Consul-Token"] = self._options.token
        conn.request(method, f"{path}?{urlencode(params)}" if params else path, body=body, headers=headers)
        response = conn.getresponse()
        body = response.read(limit + 1) if limit else response.read()
        if limit and len(body) > limit:
            self._drop(conn)  # the rest of the answer is left unread
            return _Reply(OVERSIZED, {k.lower(): v for k, v in response.getheaders()}, b"")
        reply = _Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        if response.will_close:
            self._drop(conn)
        return reply

    def _open(self) -> http.client.HTTPConnection:
        o = self._options
        scheme, host, port = _split_address(o.address)
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


# --- one blocking-query loop -----------------------------------------------------------------


class _TokenBucket:
    """Consul's advice for blocking loops: proceed at once in the happy case, and degrade to one
    query per `interval` when answers keep coming fast."""

    def __init__(self, burst: int, interval: float) -> None:
        self._burst, self._interval = float(burst), interval
        self._tokens, self._last = float(burst), time.monotonic()

    def take(self) -> float:
        """Take a token; return how long to wait before using it."""
        now = time.monotonic()
        if self._interval > 0:
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        else:
            self._tokens = self._burst
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens * self._interval

    def give_back(self) -> None:
        """Return the token of a failed query: backoff paces failures, the bucket paces answers."""
        self._tokens = min(self._burst, self._tokens + 1)


class _BlockingQuery:
    """A thread that keeps one Consul path's answer fresh and hands each answer to `on_data`."""

    def __init__(
        self,
        options: ConsulOptions,
        path: str,
        on_data: Callable[[object, _Reply], None],
        on_error: Callable[[str], None],
        *,
        params: Mapping[str, str] | None = None,
        missing_is_none: bool = False,
    ) -> None:
        self.path = path
        self._options = options
        #: Query parameters of every request (`recurse` for a KV prefix); `missing_is_none` hands
        #: a 404 that carries an index (a KV prefix with no keys) to `on_data` as None.
        self._params, self._missing_is_none = dict(params or {}), missing_is_none
        self._on_data, self._on_error = on_data, on_error
        self._conn = _Connection(options)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consul {path}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._conn.abort()

    def join(self, timeout: float) -> bool:
        if self._thread.ident is not None:
            self._thread.join(max(timeout, 0.0))
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except _Aborted:
            pass
        finally:
            self._conn.close()

    def _loop(self) -> None:
        o = self._options
        bucket = _TokenBucket(o.rate_burst, o.rate_interval)
        index, failures = 0, 0
        while not self._stop.wait(bucket.take()):
            params = self._params | ({"dc": o.datacenter} if o.datacenter else {})
            timeout = o.request_timeout
            if index > 0:
                # After a failure, a short wait: an answer is what shows Consul is back.
                wait = min(o.wait, RECOVERY_WAIT) if failures else o.wait * (1 - random.random() * o.wait_jitter)
                params |= {"index": str(index), "wait": f"{int(wait * 1000)}ms"}
                timeout += wait * 17 / 16  # Consul adds up to wait/16 of its own jitter
            try:
                reply = self._conn.get(self.path, params, timeout)
                missing = self._missing_is_none and reply.status == 404
                data, returned = None if missing else reply.json(self.path), reply.index
                if returned < index:
                    logger.info(
                        "consul index of %s went back from %d to %d: reading afresh", self.path, index, returned
                    )
                self._on_data(data, reply)
            except _Aborted:
                return
            except Exception as exc:  # anything at all: report it, back off, carry on from the same index
                if self._stop.is_set():
                    return
                failures += 1
                bucket.give_back()
                self._report_error(_describe(exc))
                ceiling = min(o.backoff_max, o.backoff_min * 2 ** min(failures - 1, 30))
                if self._stop.wait(random.uniform(ceiling / 2, ceiling)):
                    return
                continue
            failures = 0
            index = next_index(index, returned)

    def _report_error(self, message: str) -> None:
        try:
            self._on_error(message)
        except Exception:
            logger.exception("consul error of %s could not be reported", self.path)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RegistryError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the registry ----------------------------------------------------------------------------


class ConsulRegistry:
    """A Registry fed by Consul's catalog; `start()` it, `stop()` it (also as a context manager)."""

    def __init__(self, options: ConsulOptions, name: str = "consul") -> None:
        self._options, self._name = options, name
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()  # one model change reaches listeners at a time
        self._listeners: list[Listener] = []
        self._model = ServiceModel()
        self._synced = threading.Event()
        self._stopped = False
        self._catalog: _BlockingQuery | None = None
        self._catalog_read = False
        self._watches: dict[str, _BlockingQuery] = {}
        self._converted: dict[str, ConvertedService] = {}
        self._settled: set[str] = set()  # services whose watch has answered or failed once
        self._errors: dict[str, str] = {}  # path -> last error
        self._acl_filtered = False
        self._failing_logged = False  # the log last said Consul is failing

    @property
    def name(self) -> str:
        return self._name

    def model(self) -> ServiceModel:
        return self._model

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def watched(self) -> frozenset[str]:
        """The Consul services watched now, for debug pages."""
        with self._lock:
            return frozenset(self._watches)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Wait until the catalog and every service in it have been read once."""
        return self._synced.wait(timeout)

    def status(self) -> RegistryStatus:
        with self._lock:
            errors = dict(self._errors)
            services = len(self._watches)
            filtered = self._acl_filtered
        model = self._model
        count = sum(len(e) for e in model.endpoints.values())
        where = f"consul at {self._options.url}"
        if errors:
            path, error = sorted(errors.items())[0]
            message = (
                f"{where}: {len(errors)} of {services + 1} queries failing ({path}: {error}); "
                f"serving the last known {count} endpoints"
            )
        elif not self._synced.is_set():
            message = f"{where}: not read yet"
        else:
            message = f"{where}: watching {services} services"
        if filtered:
            message += "; results filtered by ACLs (the token may lack service:read or node:read)"
        healthy = not errors and self._synced.is_set()
        return RegistryStatus(self._name, healthy, message, len(model.services), count)

    def start(self) -> None:
        with self._lock:
            if self._catalog is not None or self._stopped:
                return
            self._catalog = _BlockingQuery(self._options, CATALOG_PATH, self._on_catalog, self._on_catalog_error)
            self._catalog.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop every watch; True when all threads ended within `timeout`."""
        with self._lock:
            self._stopped = True
            queries = [q for q in (self._catalog, *self._watches.values()) if q is not None]
            self._watches.clear()
        for query in queries:
            query.stop()
        deadline = time.monotonic() + timeout
        return all([q.join(deadline - time.monotonic()) for q in queries])  # noqa: C419 (join every one)

    def __enter__(self) -> ConsulRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_catalog(self, data: object, reply: _Reply) -> None:
        if not isinstance(data, Mapping):
            raise RegistryError(f"GET {CATALOG_PATH}: expected an object, got {type(data).__name__}")
        names = {n for n in data if isinstance(n, str)}
        with self._lock:
            if self._stopped:
                return
            self._catalog_read = True
            self._errors.pop(CATALOG_PATH, None)
            self._acl_filtered = reply.headers.get("x-consul-results-filtered-by-acls", "") == "true"
            for gone in set(self._watches) - names:
                query = self._watches.pop(gone)
                query.stop()
                self._errors.pop(query.path, None)
                self._converted.pop(gone, None)
                self._settled.discard(gone)
            for new in sorted(names - set(self._watches)):
                self._watches[new] = query = self._health_query(new)
                query.start()
        self._publish()

    def _health_query(self, name: str) -> _BlockingQuery:
        def on_data(data: object, reply: _Reply) -> None:
            if not isinstance(data, list):
                raise RegistryError(f"GET {query.path}: expected a list, got {type(data).__name__}")
            with self._lock:
                if self._watches.get(name) is not query:
                    return  # the service left the catalog while this answer was on its way
                previous = self._converted.get(name)
                self._converted[name] = convert_service(
                    name, data, self._options.mapping, previous.service if previous else None
                )
                self._errors.pop(query.path, None)
                self._settled.add(name)
            self._publish()

        def on_error(message: str) -> None:
            with self._lock:
                if self._watches.get(name) is query:
                    self._errors[query.path] = message
                    self._settled.add(name)
            self._publish()

        query = _BlockingQuery(self._options, health_path(name), on_data, on_error)
        return query

    def _on_catalog_error(self, message: str) -> None:
        with self._lock:
            self._errors[CATALOG_PATH] = message
        self._note_health()

    def _note_health(self) -> None:
        """Say in the log when Consul stops answering and when it answers again: one line per
        change of state (an hour-long outage is two lines), with the address and the reason, so an
        outage is seen without reading /debug/registryz."""
        with self._lock:
            if self._stopped or bool(self._errors) == self._failing_logged:
                return
            self._failing_logged = bool(self._errors)
            errors, queries = sorted(self._errors.items()), len(self._watches) + 1
        where = f"consul at {self._options.url}"
        if errors:
            path, error = errors[0]
            logger.warning(
                "%s is failing (%d of %d queries; %s: %s): keeping every endpoint last read from it",
                where, len(errors), queries, path, error,
            )  # fmt: skip
        else:
            logger.info("%s answers again", where)

    def _publish(self) -> None:
        self._note_health()
        with self._publish_lock:
            with self._lock:
                if self._stopped or not self._catalog_read:
                    return
                if not self._synced.is_set() and not self._settled >= set(self._watches):
                    return  # the first model is complete or not published at all
                notes = []
                if len(self._watches) >= CONNECTION_NOTE_AT:
                    notes.append(
                        f"watching {len(self._watches)} consul services holds as many connections to Consul; "
                        "raise Consul's limits.http_max_conns_per_client (200 by default) above that"
                    )
                old, new = self._model, assemble_model(self._converted, self._options.mapping, notes)
                first = not self._synced.is_set()
                if new == old and not first:
                    return  # an error report or an answer that changed nothing
                self._model = new
                listeners = tuple(self._listeners)
            self._synced.set()
            change = model_change(old, new)
            if change is None:
                return
            for listener in listeners:
                try:
                    listener(change)
                except Exception:
                    logger.exception("a consul registry listener failed")


def read_consul_once(options: ConsulOptions) -> ServiceModel:
    """Consul's catalog now, read once without watching (for `meshctl services --consul`)."""
    conn = _Connection(options)
    params = {"dc": options.datacenter} if options.datacenter else {}
    try:
        catalog = conn.get(CATALOG_PATH, params, options.request_timeout).json(CATALOG_PATH)
        if not isinstance(catalog, Mapping):
            raise RegistryError(f"GET {CATALOG_PATH}: expected an object, got {type(catalog).__name__}")
        converted: dict[str, ConvertedService] = {}
        for name in sorted(n for n in catalog if isinstance(n, str)):
            path = health_path(name)
            entries = conn.get(path, params, options.request_timeout).json(path)
            if not isinstance(entries, list):
                raise RegistryError(f"GET {path}: expected a list, got {type(entries).__name__}")
            converted[name] = convert_service(name, entries, options.mapping)
    except (OSError, http.client.HTTPException) as exc:
        raise RegistryError(f"cannot read consul at {options.url}: {_describe(exc)}") from exc
    finally:
        conn.close()
    return assemble_model(converted, options.mapping)


#: The transport and the blocking-query loop, for meshctl's other Consul clients (the KV config
#: source and `meshctl kv push`), so that every one follows the same rules.
ConsulConnection = _Connection
ConsulReply = _Reply
BlockingQuery = _BlockingQuery
ConnectionAborted = _Aborted
