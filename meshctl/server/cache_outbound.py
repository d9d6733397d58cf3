"""The outbound part of a proxy's config (the services it calls: nearly all of it), found once
per `OutboundProxy` and config version, and kept or brought up to date across changes from the
part before it (see `cache.py`'s docstring for how sharing works as a whole).

A part is two halves: the clusters, kept while `CLUSTER_KINDS` stay as they were, and the
listeners and routes, kept while every other kind does; both kept across DestinationRule
changes that leave every rule they asked for as it was (`TRACED_KINDS`), and a sidecar's across
service changes that leave every service they read as it was (`SCOPED_SERVICES`). Apart from
the cache so that the cache's module says how a proxy's view is put together and this one how
its largest part is kept."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import MappingProxyType

from google.protobuf.message import Message

from meshctl.server.cache_eds import Assignments
from meshctl.server.cache_parts import (
    Part,
    Recent,
    ServicesRead,
    TracedPart,
    kept_entry,
    rules_digest,
)
from meshctl.snapshot.binding import outbound_of
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import types
from meshctl.xds.generate import (
    BOUND_KINDS,
    CLUSTER_KINDS,
    PATCH_KINDS,
    SCOPED_SERVICES,
    TRACED_KINDS,
    Assembled,
    GenerationMemos,
    generate_outbound_clusters,
    generate_outbound_listeners_and_routes,
)
from meshctl.xds.names import eds_cluster_names
from meshctl.xds.resources import Resource, ResourceSet, to_resource

_CONFIG_TYPES = (types.CLUSTER, types.LISTENER, types.ROUTE)

#: The cache's interning of a set of resources (`ResourceCache._set`).
SetOf = Callable[..., ResourceSet]


class OutboundParts:
    """The outbound parts of every `OutboundProxy`, by config version, and the halves they are
    joined from; safe to call from several threads (under the cache's lock)."""

    def __init__(
        self,
        lock: threading.Lock,
        memos: GenerationMemos,
        *,
        set_of: SetOf,
        intern: Callable[[str, Resource], Resource],
        assignments: Assignments,
        keep_versions: int,
    ) -> None:
        self._lock = lock
        self._memos = memos
        self._set = set_of
        #: called with the lock held
        self._intern = intern
        self._assignments = assignments
        #: outbound listeners and routes by their key, per version of what they read (every kind
        #: but the traced, patch and binding ones); outbound clusters by their key per version of
        #: what they read (`CLUSTER_KINDS`), so a change to anything else keeps them
        self._outbound_parts: Recent[OutboundProxy, TracedPart] = Recent(keep_versions)
        self._cluster_parts: Recent[OutboundProxy, TracedPart] = Recent(keep_versions)
        #: the whole outbound part by its key, per config version: found (generated, or kept
        #: after checking its traces) once per version, not once per proxy
        self._outbound_now: Recent[OutboundProxy, Part] = Recent(keep_versions)
        #: Counters for the cache's own (see `ResourceCache`).
        self.generations = 0
        self.outbound_generations = 0
        self.cluster_generations = 0
        self.cluster_resources_made = 0

    def part_for(self, snapshot: Snapshot, proxy: Proxy) -> Part:
        """The outbound part for the proxy, from its two halves: clusters, kept while
        `CLUSTER_KINDS` stay as they were, and listeners and routes, kept while every other kind
        does; both kept across DestinationRule changes that leave every rule they asked for as
        it was (`TRACED_KINDS`), and a sidecar's across service changes that leave every service
        they read as it was (`SCOPED_SERVICES`; a router's are keyed on every service). The
        OutboundProxy is the key of both: generation reads nothing of the proxy beyond it."""
        outbound_key = outbound_of(proxy, snapshot)
        with self._lock:
            found = self._outbound_now.get(snapshot.config_version, outbound_key)
        if found is not None:
            return found
        whole = self._parts_for(snapshot, outbound_key)
        with self._lock:
            self._outbound_now.put(snapshot.config_version, outbound_key, whole)
        return whole

    def _parts_for(self, snapshot: Snapshot, outbound_key: OutboundProxy) -> Part:
        # A sidecar's parts check what they read of the registry (`SCOPED_SERVICES`), so a
        # service outside their scope regenerates none of them; a router's are keyed on it all.
        scoped = outbound_key.type in SCOPED_SERVICES
        clusters_version = snapshot.version_of(CLUSTER_KINDS - TRACED_KINDS, services=not scoped)
        rest_version = snapshot.version_of(
            frozenset(snapshot.kind_digests) - TRACED_KINDS - PATCH_KINDS - BOUND_KINDS, services=not scoped
        )
        with self._lock:
            clusters_entry = self._cluster_parts.get(clusters_version, outbound_key)
            rest_entry = self._outbound_parts.get(rest_version, outbound_key)
        scope = ProxyScope(snapshot, outbound_key)  # answers the traces' questions, once each

        def found_at(entry: TracedPart) -> TracedPart | None:
            return entry.found_at(scope)

        parts, lock = self._cluster_parts, self._lock
        kept = kept_entry(parts, lock, clusters_version, outbound_key, clusters_entry, found_at=found_at)
        clusters = kept.part if kept is not None else None
        kept = kept_entry(self._outbound_parts, lock, rest_version, outbound_key, rest_entry, found_at=found_at)
        rest = kept.part if kept is not None else None
        if clusters is not None and rest is not None:
            return self._whole(clusters, rest)
        if clusters is None:
            traced = self._clusters_updated(scope, clusters_entry) if clusters_entry is not None else None
            if traced is None:
                rules: dict[str, object] = {}
                names: set[tuple[str, str]] = set()
                hosts: dict[str, tuple[str, ...]] | None = {} if scoped else None
                made = generate_outbound_clusters(snapshot, outbound_key, self._memos, rules, names, host_trace=hosts)
                clusters = generated_part(self._set, {types.CLUSTER: made})
                with self._lock:
                    self.cluster_resources_made += len(made)
                read = _services_read(scope, names, scoped)
                traced = TracedPart(clusters, rules, rules_digest(snapshot), read, hosts)
            clusters = traced.part
            traced = clusters_entry.replaced_by(traced) if clusters_entry is not None else traced
            with self._lock:
                self.cluster_generations += 1
                if self._cluster_parts.put(clusters_version, outbound_key, traced):
                    self._forget_assignments()
        if rest is None:
            rules = {}
            names = set()
            generated = generate_outbound_listeners_and_routes(snapshot, outbound_key, self._memos, rules, names)
            rest = generated_part(self._set, generated)
            traced = TracedPart(rest, rules, rules_digest(snapshot), _services_read(scope, names, scoped))
            traced = rest_entry.replaced_by(traced) if rest_entry is not None else traced
            with self._lock:
                self._outbound_parts.put(rest_version, outbound_key, traced)
        with self._lock:
            self.generations += 1
            self.outbound_generations += 1
        return self._whole(clusters, rest)

    def _clusters_updated(self, scope: ProxyScope, entry: TracedPart) -> TracedPart | None:
        """A sidecar's cluster part brought up to date from `entry` where only services of its
        scope changed (`ServicesRead.touched`): the clusters of the hosts that did not change
        are kept as they are, those of the changed hosts and the catch-alls made again. Equal
        to the part made whole (each cluster is a function of its own service port's view), at
        the cost of the services that changed instead of all the scope sees: one ServiceEntry
        added to a namespace of thousands makes its own clusters alone."""
        read, hosts = entry.services, entry.hosts
        if read is None or hosts is None or not entry.holds_rules(scope):
            return None
        touched = read.touched(scope)
        if touched is None:
            return None
        snapshot = scope.snapshot
        # A changed host's rule is asked for again where its service is still seen.
        rules: dict[str, object] = {h: d for h, d in entry.rules.items() if h not in touched}
        names: set[tuple[str, str]] = set(read.names)
        made_hosts: dict[str, tuple[str, ...]] = {}
        made = generate_outbound_clusters(
            snapshot, scope.proxy, self._memos, rules, names, only=touched, host_trace=made_hosts
        )
        before = entry.part.by_type[types.CLUSTER]
        kept_hosts = {h: n for h, n in hosts.items() if h not in touched}
        kept = [before[n] for ns in kept_hosts.values() for n in ns if n in before]
        serialized = [to_resource(m, types.CLUSTER) for m in made]
        with self._lock:
            fresh = [self._intern(types.CLUSTER, r) for r in serialized]
        # The clusters of a service win over a catch-all of the same name, as in a whole part.
        present = {r.name for r in kept}
        resources = [*kept, *(r for r in fresh if r.name not in present)]
        gone = {n for h, ns in hosts.items() if h in touched for n in ns}
        eds = {n for n in entry.part.eds_names if n not in gone and n in present}
        eds.update(eds_cluster_names([m for m, r in zip(made, fresh, strict=True) if r.name not in present]))
        by_type = MappingProxyType({types.CLUSTER: self._set(types.CLUSTER, resources, interned=True)})
        part = Part(by_type, tuple(sorted(eds)))
        with self._lock:
            self.cluster_resources_made += len(made)
        services = ServicesRead(snapshot.services, snapshot.index.loopback, scope.services, frozenset(names))
        return TracedPart(part, rules, rules_digest(snapshot), services, kept_hosts | made_hosts)

    @staticmethod
    def _whole(clusters: Part, rest: Part) -> Part:
        by_type = {types.CLUSTER: clusters.by_type[types.CLUSTER]}
        by_type |= {t: rest.by_type[t] for t in (types.LISTENER, types.ROUTE)}
        return Part(MappingProxyType(by_type), clusters.eds_names)

    def _forget_assignments(self) -> None:
        """Drop the assignments of clusters no kept outbound part has: they would otherwise stay
        forever. (Inbound parts have no EDS clusters.) Called with the lock held."""
        self._assignments.forget({n for p in self._cluster_parts.values() for n in p.part.eds_names})


def generated_part(set_of: SetOf, generated: Assembled) -> Part:
    """A generated part as shared sets of serialized resources (some of them serialized
    already: a sidecar's route configurations, `Serialized`)."""
    by_type = {t: set_of(t, (to_resource(m, t) for m in generated.get(t, ()))) for t in _CONFIG_TYPES}
    clusters = [c for c in generated.get(types.CLUSTER, ()) if isinstance(c, Message)]  # never `Serialized`
    return Part(MappingProxyType(by_type), tuple(sorted(eds_cluster_names(clusters))))


def _services_read(scope: ProxyScope, names: set[tuple[str, str]], scoped: bool) -> ServicesRead | None:
    """What a part generated in `scope` read of the registry, for a part not keyed on it."""
    if not scoped:
        return None
    snapshot = scope.snapshot
    return ServicesRead(snapshot.services, snapshot.index.loopback, scope.services, frozenset(names))
