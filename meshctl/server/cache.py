"""Generated resources as shared bytes: each resource is serialized once and reused by every stream.

Three levels of sharing, from the most to the least expensive to redo:

- clusters, listeners and routes are generated once per (snapshot config version, proxy
  generation key): proxies with the same inputs share one generation, and an endpoint-only change
  (same config version) regenerates nothing of them;
- a ClusterLoadAssignment is built once per (config version, cluster, that service's endpoints)
  and shared by every proxy with the cluster, so an endpoint change rebuilds only its service's;
- a proxy's complete view (`ProxyResources`) is assembled once per (snapshot version, key).

A resource's version is a hash of its serialized bytes, so two replicas fed the same inputs give
Envoy the same versions. Entries of older versions are dropped as new snapshots arrive.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from google.protobuf.message import Message

from meshctl.server.encode import encode_any
from meshctl.server.subscription import Resource
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


def _by_name(messages: Iterable[Message], type_url: str) -> Mapping[str, Resource]:
    return MappingProxyType({r.name: r for r in (to_resource(m, type_url) for m in messages)})


K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A small bounded map: old versions fall out as new ones come in."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True, slots=True)
class _Config:
    by_type: Mapping[str, Mapping[str, Resource]]
    eds_names: tuple[str, ...]


class ResourceCache:
    """Shared, serialized resources for every proxy; safe to call from several threads."""

    def __init__(
        self,
        *,
        config_generator: ConfigGenerator | None = None,
        endpoint_generator: EndpointGenerator | None = None,
        max_keys: int = 4096,
    ) -> None:
        if config_generator is None or endpoint_generator is None:
            from meshctl.xds.generate import generate_config, load_assignment

            config_generator = config_generator or generate_config
            endpoint_generator = endpoint_generator or load_assignment
        self._generate = config_generator
        self._endpoints = endpoint_generator
        self._lock = threading.Lock()
        self._config: _Lru[tuple[str, tuple[object, ...]], _Config] = _Lru(max_keys)
        #: cluster -> (config version, endpoints digest of its service, resource)
        self._eds: dict[str, tuple[str, str, Resource]] = {}
        #: endpoints digest per host, for the snapshot version in `_digest_version`
        self._digests: dict[str, str] = {}
        self._digest_version = ""
        self._views: _Lru[tuple[str, tuple[object, ...]], ProxyResources] = _Lru(max_keys)
        #: Counters for /metrics and the benchmarks: how often work was done vs. shared.
        self.generations = 0
        self.eds_builds = 0

    def resources(self, snapshot: Snapshot, proxy: Proxy) -> ProxyResources:
        key = proxy.generation_key()
        view_key = (snapshot.version, key)
        with self._lock:
            view = self._views.get(view_key)
        if view is not None:
            return view
        config = self._config_for(snapshot, proxy, key)
        eds = MappingProxyType({name: self._eds_for(snapshot, name) for name in config.eds_names})
        by_type = dict(config.by_type)
        by_type[types.ENDPOINT] = eds
        view = ProxyResources(snapshot.version, snapshot.config_version, MappingProxyType(by_type))
        with self._lock:
            self._views.put(view_key, view)
        return view

    def _config_for(self, snapshot: Snapshot, proxy: Proxy, key: tuple[object, ...]) -> _Config:
        config_key = (snapshot.config_version, key)
        with self._lock:
            cached = self._config.get(config_key)
        if cached is not None:
            return cached
        generated = self._generate(snapshot, proxy)
        self.generations += 1
        by_type = {t: _by_name(generated.get(t, ()), t) for t in (types.CLUSTER, types.LISTENER, types.ROUTE)}
        result = _Config(MappingProxyType(by_type), tuple(sorted(eds_cluster_names(generated.get(types.CLUSTER, ())))))
        with self._lock:
            self._config.put(config_key, result)
        return result

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
        self.eds_builds += 1
        with self._lock:
            self._eds[cluster] = (snapshot.config_version, digest, resource)
        return resource
