"""The small values `ResourceCache` keeps its generations in: per-version maps, generated
parts with what their generation read (the DestinationRules an outbound part or an EDS set asked
for), and what changed between two snapshots when a proxy's generation fails. Apart from the
cache so that its module says how sharing works and this one what is shared."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from meshctl.config.model import ConfigKey
from meshctl.registry.model import Service, ServiceModel
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.scope import ProxyScope, rule_digest
from meshctl.xds.endpoints import subset_labels
from meshctl.xds.generate import TRACED_KINDS
from meshctl.xds.resources import Resource, ResourceSet

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Entries keyed by (version, key), for the `keep` most recently used versions only: when a
    new version comes in, the entries of the least recently used one go."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._versions: list[str] = []  # least recently used first
        self._data: dict[tuple[str, K], V] = {}

    def get(self, version: str, key: K) -> V | None:
        """The entry, if held; a hit at an older version makes that version the most recently
        used, so a change undone (the snapshot back at a version already held) keeps its entries
        when the next change comes, rather than dropping the ones every proxy is served from."""
        value = self._data.get((version, key))
        if value is not None and self._versions[-1] != version:
            self._versions.remove(version)
            self._versions.append(version)
        return value

    def put(self, version: str, key: K, value: V) -> list[str]:
        """Store `value`; returns the versions dropped to make room for a new one."""
        dropped: list[str] = []
        if not self._versions or self._versions[-1] != version:
            if version in self._versions:
                self._versions.remove(version)
            self._versions.append(version)
            while len(self._versions) > self._keep:
                dropped.append(self._versions.pop(0))
            if dropped:
                gone = set(dropped)
                self._data = {k: v for k, v in self._data.items() if k[0] not in gone}
        self._data[(version, key)] = value
        return dropped

    def values(self) -> list[V]:
        return list(self._data.values())

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(self._versions)

    def __len__(self) -> int:
        return len(self._data)


def kept_entry(
    recent: Recent[K, V],
    lock: AbstractContextManager[object],
    version: str,
    key: K,
    entry: V | None,
    *,
    found_at: Callable[[V], V | None],
) -> V | None:
    """`entry` (what `recent` held under `version` and `key`) as `found_at` finds it now: itself,
    the entry it replaced (a change undone; it is put back in its place), or None."""
    kept = found_at(entry) if entry is not None else None
    if kept is not None and kept is not entry:
        with lock:
            recent.put(version, key, kept)
    return kept


@dataclass(frozen=True, slots=True)
class Part:
    """A generated part (or a whole config): its resource sets by type, and the EDS names its
    clusters ask for."""

    by_type: Mapping[str, ResourceSet]
    eds_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TracedEds:
    """An EDS set, and the labels each subset cluster in it was built with (host, subset, labels):
    the only part of a DestinationRule an assignment reads (`subset_labels`); and the model it
    was made (or last checked) at with the hosts of its clusters, whose services and endpoints
    are all an assignment reads of the registry."""

    eds: ResourceSet
    subsets: tuple[tuple[str, str, tuple[tuple[str, str], ...] | None], ...]
    #: the DestinationRules' content digest when it was made: the same rules, the same answers
    rules_digest: bytes
    model: ServiceModel
    hosts: frozenset[str]
    #: the set this one replaced under its key, tried when this one does not hold: a change
    #: undone finds its set there, not made again
    before: TracedEds | None = None

    def holds(self, snapshot: Snapshot) -> bool:
        if snapshot.services is not self.model and not snapshot.index.endpoints_changed(self.model).isdisjoint(
            self.hosts
        ):
            return False
        if rules_digest(snapshot) == self.rules_digest:
            return True
        for host, subset, labels in self.subsets:
            now = subset_labels(snapshot, host, subset)
            if (tuple(sorted(now.items())) if now is not None else None) != labels:
                return False
        return True

    def reusable(self, snapshot: Snapshot) -> dict[str, Resource]:
        """The assignments of this set that read the same at `snapshot` (same DestinationRules,
        their host's service and endpoints unchanged), by cluster name: what a set for another
        list of clusters at the same version takes instead of making them again."""
        if rules_digest(snapshot) != self.rules_digest:
            return {}
        changed = snapshot.index.endpoints_changed(self.model) if snapshot.services is not self.model else frozenset()
        # An outbound cluster's name ends with its host; any other name's assignment reads
        # nothing of the registry (`assignment_view`), so it is kept whatever its last part.
        return {r.name: r for r in self.eds.ordered if not changed or r.name.rpartition("|")[2] not in changed}

    def checked_at(self, snapshot: Snapshot) -> TracedEds:
        """The set as of `snapshot`, where `holds` found it kept (see `TracedPart.checked_at`)."""
        digest = rules_digest(snapshot)
        if digest == self.rules_digest and snapshot.services is self.model:
            return self
        return replace(self, rules_digest=digest, model=snapshot.services)

    def found_at(self, snapshot: Snapshot) -> TracedEds | None:
        """This set or the one before it, whichever holds at `snapshot`, as of it (the other
        kept as the one before), or None."""
        if self.holds(snapshot):
            return self.checked_at(snapshot)
        if self.before is not None and self.before.holds(snapshot):
            return replace(self.before.checked_at(snapshot), before=replace(self, before=None))
        return None

    def replaced_by(self, new: TracedEds) -> TracedEds:
        """`new`, with this one as the one before it."""
        return replace(new, before=replace(self, before=None))


@dataclass(frozen=True, slots=True)
class ServicesRead:
    """What an outbound part read of the registry, for a part kept across service changes
    (`SCOPED_SERVICES`): the model and loopback allocation it was made (or last checked) at,
    the services its scope saw, and the short names its generation resolved."""

    model: ServiceModel
    loopback: Mapping[str, str]
    services: tuple[Service, ...]
    names: frozenset[tuple[str, str]]

    def holds(self, scope: ProxyScope, rules: Mapping[str, object]) -> bool:
        """Whether no host that changed since `model` is one the part read: its scope sees the
        same services, and no changed host is one of them, a collector, a rule asked for
        (`rules`) or a short name's resolution."""
        snapshot = scope.snapshot
        if snapshot.services is self.model:
            return True
        changed = snapshot.index.changed_hosts(self.model, self.loopback)
        if not changed:
            return True
        if scope.services != self.services:
            return False
        if not changed.isdisjoint(scope.service_hosts) or not changed.isdisjoint(rules):
            return False
        if any(c.hostname in changed for c in scope.proxy.collectors):
            return False
        names = {(parts[0], parts[1]) for h in changed if len(parts := h.split(".")) >= 3}
        return names.isdisjoint(self.names) and names.isdisjoint(snapshot.index.short_hosts())

    def touched(self, scope: ProxyScope) -> frozenset[str] | None:
        """The hosts that changed since `model`, where they are all a part read differently:
        services of its scope that came, went or changed, and no collector, short name, or
        other service of the scope. A part made of one piece per service (the clusters) is then
        brought up to date by making those hosts' pieces again; None where it cannot be. (The
        rules the part asked for are checked apart, `TracedPart.holds_rules`: a service's pieces
        ask for their own host's rule alone, asked again when they are made again.)"""
        snapshot = scope.snapshot
        changed = snapshot.index.changed_hosts(self.model, self.loopback)
        if any(c.hostname in changed for c in scope.proxy.collectors):
            return None
        names = {(parts[0], parts[1]) for h in changed if len(parts := h.split(".")) >= 3}
        if not names.isdisjoint(self.names) or not names.isdisjoint(snapshot.index.short_hosts()):
            return None
        was = [s.hostname for s in self.services if s.hostname not in changed]
        now = [s.hostname for s in scope.services if s.hostname not in changed]
        return changed if was == now else None

    def at(self, scope: ProxyScope) -> ServicesRead:
        """The same reads, as of `scope`'s snapshot (where `holds` found them unchanged)."""
        snapshot = scope.snapshot
        return ServicesRead(snapshot.services, snapshot.index.loopback, scope.services, self.names)


@dataclass(frozen=True, slots=True)
class TracedPart:
    """An outbound part and the DestinationRules its generation asked for (host -> digest), and
    for a part not keyed on the registry, what it read of it."""

    part: Part
    rules: Mapping[str, object]
    #: the DestinationRules' content digest when it was made: the same rules, the same answers
    rules_digest: bytes
    services: ServicesRead | None = None
    #: the names of each service's resources in the part, by host, where it is made of one piece
    #: per service (a sidecar's clusters): what `ServicesRead.touched` lets be made again alone
    hosts: Mapping[str, tuple[str, ...]] | None = None
    #: the part this one replaced under its key, tried when this one does not hold: a change
    #: undone finds its part there, not generated again
    before: TracedPart | None = None

    def holds(self, scope: ProxyScope) -> bool:
        """Whether every rule asked for is, in `scope`'s snapshot, the one it was, and (for a
        part not keyed on the registry) every service it read."""
        return self.holds_rules(scope) and (self.services is None or self.services.holds(scope, self.rules))

    def holds_rules(self, scope: ProxyScope) -> bool:
        """Whether every rule asked for is, in `scope`'s snapshot, the one it was."""
        snapshot = scope.snapshot
        if rules_digest(snapshot) == self.rules_digest:
            return True
        return all(rule_digest(snapshot, scope.destination_rule(h)) == d for h, d in self.rules.items())

    def checked_at(self, scope: ProxyScope) -> TracedPart:
        """The part as of `scope`'s snapshot, where `holds` found it kept: later checks compare
        against this snapshot's rules and services (a snapshot with the same rules then needs
        no rule asked again), and the model it was made at is let go."""
        snapshot = scope.snapshot
        digest = rules_digest(snapshot)
        services = self.services
        if services is not None and services.model is not snapshot.services:
            services = services.at(scope)
        if digest == self.rules_digest and services is self.services:
            return self
        return replace(self, rules_digest=digest, services=services)

    def found_at(self, scope: ProxyScope) -> TracedPart | None:
        """This part or the one before it, whichever holds in `scope`, as of its snapshot (the
        other kept as the one before), or None."""
        if self.holds(scope):
            return self.checked_at(scope)
        if self.before is not None and self.before.holds(scope):
            return replace(self.before.checked_at(scope), before=replace(self, before=None))
        return None

    def replaced_by(self, new: TracedPart) -> TracedPart:
        """`new`, with this one as the one before it."""
        return replace(new, before=replace(self, before=None))


def rules_digest(snapshot: Snapshot) -> bytes:
    return b"".join(snapshot.kind_digests.get(kind, b"") for kind in sorted(TRACED_KINDS))


def changed_inputs(before: Snapshot, now: Snapshot) -> list[str]:
    """The inputs that differ between two snapshots, each as `kind namespace/name (file:line)`
    (or `MeshConfig`): what a generation error that did not happen at `before` comes from."""
    out: list[str] = []
    if before.mesh != now.mesh:
        out.append("MeshConfig")
    for kind in sorted(set(before.kind_digests) | set(now.kind_digests)):
        if before.kind_digests.get(kind) == now.kind_digests.get(kind):
            continue
        old: dict[ConfigKey, str] = {c.key: c.content_digest() for c in before.of_kind(kind)}
        for config in now.of_kind(kind):
            if old.get(config.key) != config.content_digest():
                out.append(f"{config.key} ({config.source})")
    if before.registry_digest != now.registry_digest:
        out.append("the registry's services")
    return out
