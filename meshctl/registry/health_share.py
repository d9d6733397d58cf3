"""Health and registrations shared between replicas through Consul KV, under a session each.

Replicas that share a Consul share what their health streams tell them, so a workload reads the
same health on every replica whichever replica its Envoy's stream is on, and a VM registered on
one replica is an endpoint on all. Each replica writes only its own keys, one per workload it
holds a stream of (its *view*):

    meshctl/health/NAMESPACE/NAME/SESSION          {"replica", "healthy", "reason", "reportedAt",
                                                    "streams", "goneSince", "expired", "at"}
    meshctl/registrations/NAMESPACE/NAME/SESSION   {"replica", "group", "address", "streams",
                                                    "goneSince", "at"}

Keys are acquired under the replica's Consul session (TTL `session_ttl`, behaviour `delete`,
no lock delay, no node checks), renewed every third of the TTL: a replica that dies has its keys
deleted by Consul (after between one and two TTLs, Consul's rule), one that stops cleanly
destroys its session and they go at once. A key per replica rather than one per workload means
no replica ever waits for another's lock: an Envoy that reconnects to another replica while the
first has not yet noticed its old stream is gone is reported at once, and readers merge the
views (`meshctl.registry.health.merge_views`, `meshctl.server.autoregister`): a connected view
beats a gone one, the latest report wins. No consensus is built here: each key has one writer.

Every replica follows both prefixes with blocking queries and hands the other replicas' views to
its `on_health` and `on_registrations` (workload -> session -> value) on every answer. When
Consul cannot be reached the last views are kept (nothing is taken for gone), writes are retried,
and `status()` says what fails; the server shows it in `/debug/registryz` and `meshctl services`.
When Consul forgets the session (its TTL ran out during an outage) a new one is made and every
key of this replica is written again.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import http.client
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from meshctl.errors import RegistryError
from meshctl.registry.consul_http import ConnectionAborted, ConsulConnection, ConsulOptions, ConsulReply
from meshctl.registry.consul_watch import BlockingQuery

logger = logging.getLogger("meshctl.registry.health_share")

HEALTH_PREFIX: Final = "meshctl/health/"
REGISTRATIONS_PREFIX: Final = "meshctl/registrations/"
#: Consul's least session TTL unless its agent is told otherwise (`session_ttl_min`).
DEFAULT_SESSION_TTL: Final = 10.0
#: The pace of the blocking queries that follow the prefixes (`meshctl.registry.consul_watch`'s bucket).
FOLLOW_BURST: Final = 16
FOLLOW_INTERVAL: Final = 0.25
#: How long `start` waits for the first answers before serving without them.
FIRST_READ_TIMEOUT: Final = 5.0

WorkloadKey = tuple[str, str]
#: Other replicas' views: workload -> session id -> the value it wrote.
Views = Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]]
ViewsListener = Callable[[Views], None]


@dataclass(frozen=True, slots=True)
class ShareOptions:
    consul: ConsulOptions
    session_ttl: float = DEFAULT_SESSION_TTL
    #: How this replica names itself in the values it writes (for people reading KV).
    replica: str = ""


def replica_name() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def parse_views(data: object, prefix: str, own: Callable[[str], bool]) -> dict[WorkloadKey, dict[str, Any]]:
    """Consul's JSON for `GET PREFIX?recurse` (None for no keys) as views, leaving out this
    replica's own (`own(session)`) and keys that are not `PREFIX/NS/NAME/SESSION` with a JSON
    object as value (someone else's data: ignored, never fatal)."""
    views: dict[WorkloadKey, dict[str, Any]] = {}
    if not isinstance(data, list):
        return views
    for item in data:
        if not isinstance(item, Mapping) or not isinstance(item.get("Key"), str):
            continue
        parts = item["Key"][len(prefix) :].split("/") if item["Key"].startswith(prefix) else []
        if len(parts) != 3 or not all(parts) or own(parts[2]):
            continue
        try:
            raw = item.get("Value")
            value = json.loads(base64.b64decode(raw, validate=True)) if isinstance(raw, str) else None
        except (binascii.Error, ValueError):
            value = None
        if isinstance(value, dict):
            views.setdefault((parts[0], parts[1]), {})[parts[2]] = value
    return views


class ConsulShare:
    """This replica's views written under its session, and the others' followed (module doc)."""

    def __init__(self, options: ShareOptions, on_health: ViewsListener, on_registrations: ViewsListener) -> None:
        self._options = options
        self._replica = options.replica or replica_name()
        self._listeners = {HEALTH_PREFIX: on_health, REGISTRATIONS_PREFIX: on_registrations}
        self._cond = threading.Condition()
        #: (prefix, workload) -> the value this replica holds now (None: delete it).
        self._own: dict[tuple[str, WorkloadKey], dict[str, Any] | None] = {}
        self._dirty: set[tuple[str, WorkloadKey]] = set()
        self._session = ""
        self._sessions: set[str] = set()  # every session this process made: its keys are its own
        self._renew_at = 0.0
        self._stopped = False
        self._errors: dict[str, str] = {}
        #: Told True when reads or writes start failing, False when Consul answers again.
        self.on_failing: Callable[[bool], None] | None = None
        self._known: dict[str, bool] = {}  # prefixes whose last answer held other replicas' views
        self._failing_since: float | None = None
        self._read = {HEALTH_PREFIX: threading.Event(), REGISTRATIONS_PREFIX: threading.Event()}
        self._first = {HEALTH_PREFIX: threading.Event(), REGISTRATIONS_PREFIX: threading.Event()}  # answered or failed
        self._conn = ConsulConnection(options.consul)
        # A health change must reach the other replicas in well under a probe period: the
        # queries may answer in bursts (each replica's writes wake them), paced at 4 a second.
        follow = dataclasses.replace(options.consul, rate_burst=FOLLOW_BURST, rate_interval=FOLLOW_INTERVAL)
        self._queries = [
            BlockingQuery(
                follow,
                _kv_path(prefix),
                functools.partial(self._on_data, prefix),
                functools.partial(self._on_error, prefix),
                params={"recurse": "true"},
                missing_is_none=True,
            )
            for prefix in (HEALTH_PREFIX, REGISTRATIONS_PREFIX)
        ]
        self._writer = threading.Thread(target=self._write_loop, name="meshctl-share", daemon=True)

    @property
    def replica(self) -> str:
        return self._replica

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = FIRST_READ_TIMEOUT) -> None:
        """Follow both prefixes and start writing; wait up to `timeout` for the first answers."""
        for query in self._queries:
            query.start()
        self._writer.start()
        deadline = time.monotonic() + timeout
        for event in self._first.values():
            event.wait(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop following and destroy the session: this replica's keys go at once, and the other
        replicas apply the grace to the workloads whose streams were here."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for query in self._queries:
            query.stop()
        self._writer.join(timeout)
        session = self._session
        if session:
            try:
                self._request("PUT", f"/v1/session/destroy/{session}")
            except RegistryError as exc:
                logger.warning("could not end the Consul session of this replica (%s): its keys go with its TTL", exc)
        for query in self._queries:
            query.join(timeout)
        self._conn.close()

    def synced(self) -> bool:
        """Whether both prefixes were read once."""
        return all(e.is_set() for e in self._read.values())

    def status(self) -> tuple[bool, str]:
        """(healthy, why not): whether Consul answers this replica's reads and writes."""
        with self._cond:
            # Only while something is shared: a mesh without checked or registered workloads
            # loses nothing when Consul's KV cannot be reached.
            if not self._errors or not (self._own or self._known):
                return True, ""
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._failing_since or time.time()))
            errors = "; ".join(dict.fromkeys(self._errors.values()))
            return (
                False,
                f"replicas' shared health in consul KV failing since {since} ({errors}); keeping the last known state",
            )

    # -- this replica's views ----------------------------------------------------------------

    def put(self, prefix: str, key: WorkloadKey, value: Mapping[str, Any] | None) -> None:
        """Hold `value` as this replica's view of `key` under `prefix` (None: hold none)."""
        with self._cond:
            stored = None if value is None else {"replica": self._replica, **value}
            if self._own.get((prefix, key)) == stored and (prefix, key) not in self._dirty:
                return
            self._own[(prefix, key)] = stored
            self._dirty.add((prefix, key))
            self._cond.notify_all()

    def _write_loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not (self._stopped or self._dirty or (self._session and time.monotonic() >= self._renew_at)):
                    wait = self._renew_at - time.monotonic() if self._session else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
            try:
                self._write_once()
            except ConnectionAborted:
                return
            except (RegistryError, OSError, http.client.HTTPException) as exc:
                failures += 1
                self._failed("write", str(exc) if isinstance(exc, RegistryError) else f"{type(exc).__name__}: {exc}")
                with self._cond:
                    self._cond.wait(min(30.0, 2 ** min(failures - 1, 5)))
                continue
            failures = 0
            self._recovered("write")

    def _write_once(self) -> None:
        """Renew (or make) the session, then write every view that changed."""
        ttl = self._options.session_ttl
        if self._session and time.monotonic() >= self._renew_at:
            reply = self._request("PUT", f"/v1/session/renew/{self._session}")
            if reply.status == 404:
                logger.warning("consul forgot this replica's session: making a new one and writing its views again")
                with self._cond:
                    self._session = ""
                    self._dirty |= {k for k, v in self._own.items() if v is not None}
            else:
                _check(reply, "renew the session")
                self._renew_at = time.monotonic() + ttl / 3
        if not self._session:
            with self._cond:
                if not any(v is not None for v in self._own.values()):
                    self._dirty.clear()
                    self._own.clear()
                    return  # nothing to hold: no session needed yet
            body = {"Name": f"meshctl {self._replica}", "TTL": f"{ttl:g}s", "Behavior": "delete", "LockDelay": "0s",
                    "Checks": []}  # fmt: skip
            reply = self._request("PUT", "/v1/session/create", json.dumps(body).encode())
            created = _check(reply, "make a session")
            session = created.get("ID") if isinstance(created, dict) else None
            if not isinstance(session, str) or not session:
                raise RegistryError("consul made a session without an ID")
            with self._cond:
                self._session = session
                self._sessions.add(session)
            self._renew_at = time.monotonic() + ttl / 3
        while True:
            with self._cond:
                if not self._dirty or self._stopped:
                    return
                item = next(iter(self._dirty))
                value = self._own.get(item)
                session = self._session
            prefix, (namespace, name) = item
            path = _kv_path(f"{prefix}{namespace}/{name}/{session}")
            if value is None:
                _check(self._request("DELETE", path), f"delete {path}")
            else:
                reply = self._request("PUT", path, json.dumps({**value, "at": time.time()}).encode(), acquire=session)
                if _check(reply, f"write {path}") is not True:
                    raise RegistryError(f"consul refused the lock of {path} to this replica's session")
            with self._cond:
                if self._own.get(item) == value:
                    self._dirty.discard(item)
                    if value is None:
                        self._own.pop(item, None)

    def _request(self, method: str, path: str, body: bytes | None = None, *, acquire: str = "") -> ConsulReply:
        o = self._options.consul
        params = ({"dc": o.datacenter} if o.datacenter else {}) | ({"acquire": acquire} if acquire else {})
        try:
            return self._conn.request(method, path, params, o.request_timeout, body)
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"cannot reach consul at {o.url}: {exc}") from exc

    # -- the other replicas' views -----------------------------------------------------------

    def _own_session(self, session: str) -> bool:
        with self._cond:
            return session in self._sessions

    def _on_data(self, prefix: str, data: object, reply: ConsulReply) -> None:
        views = parse_views(data, prefix, self._own_session)
        with self._cond:
            self._known[prefix] = bool(views)
            self._known = {p: k for p, k in self._known.items() if k}
        self._recovered(prefix)
        self._read[prefix].set()
        self._first[prefix].set()
        try:
            self._listeners[prefix](views)
        except Exception:
            logger.exception("a shared %s listener failed", prefix)

    def _on_error(self, prefix: str, message: str) -> None:
        self._failed(prefix, message)
        self._first[prefix].set()  # start-up waits no longer: it serves what it has

    def _failed(self, what: str, message: str) -> None:
        with self._cond:
            first = not self._errors
            self._errors[what] = message
            if first:
                self._failing_since = time.time()
        if first and self.on_failing is not None:
            self.on_failing(True)
        if first:
            logger.warning(
                "replicas' shared health in consul KV is failing (%s): keeping the last known state", message
            )

    def _recovered(self, what: str) -> None:
        with self._cond:
            if what not in self._errors:
                return
            del self._errors[what]
            back = not self._errors
        if back:
            logger.info("replicas' shared health in consul KV answers again")
            if self.on_failing is not None:
                self.on_failing(False)


def _kv_path(key: str) -> str:
    return f"/v1/kv/{quote(key, safe='/')}"


def _check(reply: ConsulReply, what: str) -> object:
    if reply.status == 200:
        try:
            return json.loads(reply.body) if reply.body else None
        except ValueError as exc:
            raise RegistryError(f"could not {what}: consul sent invalid JSON: {exc}") from exc
    text = reply.body.decode("utf-8", "replace").strip()[:200]
    if reply.status == 403:
        raise RegistryError(f"could not {what}: permission denied (HTTP 403, check the ACL token): {text}")
    raise RegistryError(f"could not {what}: HTTP {reply.status}: {text}")
