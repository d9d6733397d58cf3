"""Generated resources as shared bytes: each resource is serialized once and reused by every stream.

Three levels of sharing, from the most to the least expensive to redo:

- clusters, listeners and routes are generated once per (snapshot config version, proxy
  generation key): proxies with the same inputs share one generation, and an endpoint-only change
  (same config version) regenerates nothing of them;
- a ClusterLoadAssignment is built once per (config version, cluster, that service's endpoints)
  and shared by every proxy with the cluster, so an endpoint change rebuilds only its service's;
- a proxy's complete view (`ProxyResources`) is assembled once per (snapshot version, key).

Proxies with different keys still often get equal resources (every sidecar of a namespace gets
the same route config and the same outbound clusters). Equal resources are interned, so a
thousand proxies hold one copy of each, and equal sets of them are one `ResourceSet`, whose set
version is computed once for every stream that is sent it.

A resource's version is a hash of its serialized bytes, so two replicas fed the same inputs give
Envoy the same versions. Only the two most recent config and snapshot versions are kept (the
current one, and the one before for a change that is undone): a fleet-wide change otherwise
leaves a full copy of every proxy's config behind per version.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from google.protobuf.message import Message

from meshctl.server.encode import encode_any
from meshctl.server.subscription import Resource, ResourceSet
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types
from meshctl.xds.names import eds_cluster_names, parse_cluster_name, resource_name

ConfigGenerator = Callable[[Snapshot, Proxy], Mapping[str, tuple[Message, ...]]]
EndpointGenerator = Callable[[Snapshot, str], Message]


@dataclass(frozen=True, slots=True, eq=False)
class ProxyResources:
    """Everything one proxy may be sent at one snapshot, by type URL then name."""

    snapshot_version: str
    config_version: str
    by_type: Mapping[str, Mapping[str, Resource]]

    def of(self, type_url: str) -> Mapping[str, Resource]:
        return self.by_type.get(type_url, MappingProxyType({}))


def to_resource(message: Message, type_url: str) -> Resource:
    """Serialize once: the `Any` bytes every stream sends, and a content version."""
    value = message.SerializeToString(deterministic=True)
    version = hashlib.blake2b(value, digest_size=8).hexdigest()
    return Resource(resource_name(message), version, encode_any(type_url, value))


K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """Entries keyed by (version, key), for the `keep` most recently used versions only: when a
    new version comes in, the entries of the least recently used one go."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._versions: list[str] = []  # least recently used first
        self._data: dict[tuple[str, K], V] = {}

    def get(self, version: str, key: K) -> V | None:
        return self._data.get((version, key))

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

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(self._versions)

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True, slots=True)
class _Config:
    by_type: Mapping[str, ResourceSet]
    eds_names: tuple[str, ...]


class ResourceCache:
    """Shared, serialized resources for every proxy; safe to call from several threads."""

    def __init__(
        self,
        *,
        config_generator: ConfigGenerator | None = None,
        endpoint_generator: EndpointGenerator | None = None,
        keep_versions: int = 2,
    ) -> None:
        if config_generator is None or endpoint_generator is None:
            from meshctl.xds.generate import generate_config, load_assignment

            config_generator = config_generator or generate_config
            endpoint_generator = endpoint_generator or load_assignment
        self._generate = config_generator
        self._endpoints = endpoint_generator
        self._lock = threading.Lock()
        self._config: _Recent[tuple[object, ...], _Config] = _Recent(keep_versions)
        #: cluster -> (config version, endpoints digest of its service, resource)
        self._eds: dict[str, tuple[str, str, Resource]] = {}
        #: endpoints digest per host, for the snapshot version in `_digest_version`
        self._digests: dict[str, str] = {}
        self._digest_version = ""
        self._views: _Recent[tuple[object, ...], ProxyResources] = _Recent(keep_versions)
        #: the EDS set of each distinct list of EDS clusters, per snapshot version
        self._eds_sets: _Recent[tuple[str, ...], ResourceSet] = _Recent(keep_versions)
        # Equal resources and equal sets, shared while anything holds them.
        self._resources: weakref.WeakValueDictionary[tuple[str, str, str], Resource] = weakref.WeakValueDictionary()
        self._sets: weakref.WeakValueDictionary[tuple[str, str], ResourceSet] = weakref.WeakValueDictionary()
        #: Counters for /metrics and the benchmarks: how often work was done vs. shared.
        self.generations = 0
        self.eds_builds = 0

    def resources(self, snapshot: Snapshot, proxy: Proxy) -> ProxyResources:
        key = proxy.generation_key()
        with self._lock:
            view = self._views.get(snapshot.version, key)
        if view is not None:
            return view
        config = self._config_for(snapshot, proxy, key)
        by_type: dict[str, Mapping[str, Resource]] = dict(config.by_type)
        by_type[types.ENDPOINT] = self._eds_set(snapshot, config.eds_names)
        view = ProxyResources(snapshot.version, snapshot.config_version, MappingProxyType(by_type))
        with self._lock:
            self._views.put(snapshot.version, key, view)
        return view

    def _config_for(self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]) -> _Config:
        with self._lock:
            cached = self._config.get(snapshot.config_version, key)
        if cached is not None:
            return cached
        generated = self._generate(snapshot, proxy)
        by_type = {
            t: self._set(t, (to_resource(m, t) for m in generated.get(t, ())))
            for t in (types.CLUSTER, types.LISTENER, types.ROUTE)
        }
        result = _Config(MappingProxyType(by_type), tuple(sorted(eds_cluster_names(generated.get(types.CLUSTER, ())))))
        with self._lock:
            self.generations += 1
            dropped = self._config.put(snapshot.config_version, key, result)
            if dropped:
                kept = set(self._config.versions)
                self._eds = {c: e for c, e in self._eds.items() if e[0] in kept}
        return result

    def _set(self, type_url: str, resources: Iterable[Resource]) -> ResourceSet:
        """The set of `resources`, each interned, and the set itself interned."""
        serialized = list(resources)
        with self._lock:
            fresh = ResourceSet(self._intern(type_url, r) for r in serialized)
            found = self._sets.get((type_url, fresh.version))
            if found is not None and found.ordered == fresh.ordered:
                return found
            self._sets[(type_url, fresh.version)] = fresh
            return fresh

    def _intern(self, type_url: str, resource: Resource) -> Resource:
        key = (type_url, resource.name, resource.version)
        found = self._resources.get(key)
        # Equal versions are equal bytes but for a hash collision; the bytes decide.
        if found is not None and found.body == resource.body:
            return found
        self._resources[key] = resource
        return resource

    def _eds_set(self, snapshot: Snapshot, names: tuple[str, ...]) -> ResourceSet:
        """The assignments of `names` at this snapshot: one set for every proxy with those clusters."""
        with self._lock:
            found = self._eds_sets.get(snapshot.version, names)
        if found is not None:
            return found
        eds = self._set(types.ENDPOINT, [self._eds_for(snapshot, name) for name in names])
        with self._lock:
            self._eds_sets.put(snapshot.version, names, eds)
        return eds

    def _eds_for(self, snapshot: Snapshot, cluster: str) -> Resource:
        parsed = parse_cluster_name(cluster)
        host = parsed.host if parsed is not None else ""
        with self._lock:
            if self._digest_version != snapshot.version:
                self._digests.clear()
                self._digest_version = snapshot.version
            digest = self._digests.get(host)
            if digest is None:
                digest = self._digests[host] = snapshot.services.endpoints_digest(host)
            found = self._eds.get(cluster)
        # A new config version can change any assignment (subsets, ports), so it is part of the key.
        if found is not None and found[0] == snapshot.config_version and found[1] == digest:
            return found[2]
        resource = to_resource(self._endpoints(snapshot, cluster), types.ENDPOINT)
        with self._lock:
            self.eds_builds += 1
            self._eds[cluster] = (snapshot.config_version, digest, resource)
        return resource
