"""Consul's catalog as a registry: blocking queries in, a complete ServiceModel out.

One thread watches `/v1/catalog/services`; each service it lists gets its own thread watching
`/v1/health/service/NAME` (every instance with its checks, so health is mapped rather than
filtered away). A watch starts when a service appears in the catalog and stops when it leaves.
The mapping from Consul's JSON to the model is in `consul_convert`; each watch is a
`consul_watch.BlockingQuery` (Consul's index, jitter, rate and backoff rules) over a
`consul_http.ConsulConnection`, which `stop()` cuts at once.

When Consul is unreachable or answers errors, nothing is removed: the model keeps every last
known service and endpoint, `status()` says what fails, and each loop carries on from the index
it had, so nothing is lost or repeated when Consul comes back.

Each watched service holds one connection; Consul limits connections per client address
(`limits.http_max_conns_per_client`, 200 by default), so more than a few hundred services needs
that limit raised; the model carries a note when the count gets close.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote

from meshctl.errors import RegistryError
from meshctl.registry.aggregate import model_change
from meshctl.registry.base import Listener
from meshctl.registry.consul_convert import ConvertedService, assemble_model, convert_service
from meshctl.registry.consul_http import ConsulConnection, ConsulOptions, ConsulReply, describe_error
from meshctl.registry.consul_watch import BlockingQuery
from meshctl.registry.model import RegistryStatus, ServiceModel

logger = logging.getLogger("meshctl.registry.consul")

CATALOG_PATH: Final = "/v1/catalog/services"
CONNECTION_NOTE_AT: Final = 190  # Consul's default limits.http_max_conns_per_client is 200


def health_path(service: str) -> str:
    return f"/v1/health/service/{quote(service, safe='')}"


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
        self._catalog: BlockingQuery | None = None
        self._catalog_read = False
        self._watches: dict[str, BlockingQuery] = {}
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
            self._catalog = BlockingQuery(self._options, CATALOG_PATH, self._on_catalog, self._on_catalog_error)
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

    def _on_catalog(self, data: object, reply: ConsulReply) -> None:
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

    def _health_query(self, name: str) -> BlockingQuery:
        def on_data(data: object, reply: ConsulReply) -> None:
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

        query = BlockingQuery(self._options, health_path(name), on_data, on_error)
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
    conn = ConsulConnection(options)
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
        raise RegistryError(f"cannot read consul at {options.url}: {describe_error(exc)}") from exc
    finally:
        conn.close()
    return assemble_model(converted, options.mapping)
