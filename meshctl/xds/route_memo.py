"""Translated VirtualService routes kept across snapshots, and checked against what they read.

Translating a VirtualService's HTTP routes (`route_actions.http_routes`) is the largest part of a
route configuration, and one VirtualService edit used to translate every VirtualService of every
namespace again. What a translation reads is in two parts:

- what is known before it starts: the VirtualService (key, content, API version), and the plain
  fields of its `RouteContext` (listener port, gateways, the proxy's labels and namespace, TLS);
  these are the memo's key;
- what it asks as it goes, through the context's three functions: which host a destination
  names, which service that is, and which consistent hash its DestinationRule gives. The answers
  depend on the services and DestinationRules of the moment, and only those asked about matter.

So a translation runs with the functions wrapped to record each question and answer (a trace),
and is reused for a later context with the same key when every recorded question gets the same
answer there: asked again, in order, as a build system checks a trace. Nothing the translation
reads escapes both: `RouteContext` has no other fields (a test holds its fields to this list),
and translation reads nothing but the VirtualService, its routes and the context.

VirtualServices with delegates are translated each time: their routes come from other
VirtualServices as well, and they are rare.

A service without a VirtualService gets a default route, a function of its host, the listener
port, the port it serves and its DestinationRule's consistent hash: those are its key, and one
route is made per key.

The virtual hosts made of these routes are kept too, serialized (`route_assembly`), and each
sidecar route configuration's last build, for the next to take over (`route_drafts`).

Kept like `GenerationMemo`: what was not asked for during the last two config versions goes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc

from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Service
from meshctl.snapshot.model import spec
from meshctl.xds.route_actions import ConsistentHash, RouteContext, http_routes
from meshctl.xds.route_assembly import VirtualHostMemo
from meshctl.xds.route_drafts import DraftKey, RouteDraftState

#: The fields of `RouteContext` the key holds; the others are the traced functions.
KEY_FIELDS = ("listen_port", "gateways", "proxy_labels", "proxy_namespace", "is_tls")
TRACED_FIELDS = ("resolve_host", "lookup_service", "lookup_hash")


@dataclass(frozen=True, slots=True)
class RoutesKey:
    """What a translation reads that is known before it starts."""

    vs: ConfigKey
    digest: str
    api_version: str
    listen_port: int
    gateways: frozenset[str]
    proxy_labels: tuple[tuple[str, str], ...]
    proxy_namespace: str
    is_tls: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    #: (function, arguments, answer), in the order asked
    trace: tuple[tuple[str, tuple[Any, ...], Any], ...]
    routes: tuple[rc.Route, ...]

    def holds(self, ctx: RouteContext) -> bool:
        """Whether `ctx` answers every question of the trace as it was answered."""
        return all(
            (now := getattr(ctx, function)(*args)) is answer or now == answer for function, args, answer in self.trace
        )


class _Tracing:
    """A context whose functions record what they are asked, and what they answer."""

    def __init__(self, ctx: RouteContext) -> None:
        self.trace: list[tuple[str, tuple[Any, ...], Any]] = []

        def resolve_host(host: str, namespace: str) -> str:
            answer = ctx.resolve_host(host, namespace)
            self.trace.append(("resolve_host", (host, namespace), answer))
            return answer

        def lookup_service(host: str) -> Service | None:
            answer = ctx.lookup_service(host)
            self.trace.append(("lookup_service", (host,), answer))
            return answer

        def lookup_hash(destination: vs_pb2.Destination, host: str) -> ConsistentHash | None:
            answer = ctx.lookup_hash(destination, host)
            copy = vs_pb2.Destination()
            copy.CopyFrom(destination)  # held by the trace: never the caller's message
            self.trace.append(("lookup_hash", (copy, host), answer))
            return answer

        self.ctx = replace(ctx, resolve_host=resolve_host, lookup_service=lookup_service, lookup_hash=lookup_hash)


class RouteMemo:
    """Translated routes by `RoutesKey`, each with its trace; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[RoutesKey, _Entry] = {}
        self._previous: dict[RoutesKey, _Entry] = {}
        #: translations run / reused (for the benchmarks and tests)
        self.made = 0
        self.reused = 0
        #: services' default routes, by everything they are made of (`routes._default_route`)
        self._defaults: dict[Hashable, rc.Route] = {}
        self._defaults_previous: dict[Hashable, rc.Route] = {}
        #: sidecar virtual hosts' bytes, keyed by the identities of the routes above they hold
        self.virtual_hosts = VirtualHostMemo()
        #: each sidecar route configuration's last build, for the next to take over
        #: (`route_drafts`), by (OutboundProxy, port, whether an egress listener's)
        self._drafts: dict[DraftKey, RouteDraftState] = {}
        self._drafts_previous: dict[DraftKey, RouteDraftState] = {}
        #: VirtualService groups and default routes taken over from the build before / made
        self.groups_kept = 0
        self.groups_made = 0
        self.defaults_kept = 0

    def draft(self, key: DraftKey) -> RouteDraftState | None:
        """The last build of the route configuration `key` names, if kept."""
        with self._lock:
            found = self._drafts.get(key)
            return found if found is not None else self._drafts_previous.get(key)

    def keep_draft(self, key: DraftKey, state: RouteDraftState) -> None:
        with self._lock:
            self._drafts[key] = state

    def default_route(self, key: Hashable, make: Callable[[], rc.Route]) -> rc.Route:
        """The default route `key` names (the caller's key is all `make` reads), made once."""
        with self._lock:
            found = self._defaults.get(key) or self._defaults_previous.get(key)
            if found is not None:
                self._defaults[key] = found
                return found
        made = make()
        with self._lock:
            self._defaults[key] = made
        return made

    def routes(
        self,
        vs: Config,
        ctx: RouteContext,
        http: Sequence[vs_pb2.HTTPRoute],
        noted: list[tuple[RoutesKey, _Entry]] | None = None,
    ) -> list[rc.Route]:
        """`http_routes(vs, ctx, http)`, reused when a translation with the same key read the
        same answers. `http` must be the VirtualService's own routes (no delegates merged): a
        VirtualService with delegates is translated every time. The entry used is appended to
        `noted`, for a caller that takes the routes over later without asking (`kept`)."""
        if any(r.HasField("delegate") for r in spec(vs).http):
            return http_routes(vs, ctx, http)
        key = RoutesKey(
            vs.key,
            vs.content_digest(),
            vs.api_version,
            ctx.listen_port,
            ctx.gateways,
            tuple(sorted(ctx.proxy_labels.items())),
            ctx.proxy_namespace,
            ctx.is_tls,
        )
        with self._lock:
            entry = self._current.get(key) or self._previous.get(key)
        if entry is not None and entry.holds(ctx):
            with self._lock:
                self._current[key] = entry
                self.reused += 1
            if noted is not None:
                noted.append((key, entry))
            return list(entry.routes)
        tracing = _Tracing(ctx)
        made = http_routes(vs, tracing.ctx, http)
        entry = _Entry(tuple(tracing.trace), tuple(made))
        with self._lock:
            self._current[key] = entry
            self.made += 1
        if noted is not None:
            noted.append((key, entry))
        return list(made)

    def kept(self, noted: Sequence[tuple[RoutesKey, _Entry]]) -> None:
        """Translations taken over from a build before without asking (`route_drafts`): still in
        use, so kept for the next build that asks."""
        if noted:
            with self._lock:
                for key, entry in noted:
                    self._current.setdefault(key, entry)

    def advance(self) -> None:
        """A new config version: what the one before last used and this one has not yet is dropped."""
        with self._lock:
            self._previous, self._current = self._current, {}
            self._defaults_previous, self._defaults = self._defaults, {}
            self._drafts_previous, self._drafts = self._drafts, {}
        self.virtual_hosts.advance()
