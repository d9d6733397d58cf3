"""The snapshot: everything generation reads, frozen, with a content version.

A snapshot is built by a pure function from the configs in the store and the registries' model,
and never changes afterwards. Generators take it (and a proxy) as their only inputs, so a cache
keyed by the snapshot version and the proxy's generation key can never miss an input. The
indexes are the few lookups every proxy needs; anything proxy-specific lives in `scope`.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from meshctl.config import mesh as mesh_config
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Resolution, ServiceModel
from meshctl.snapshot.index import SnapshotIndex

#: Mesh-wide settings live with the MeshConfig they are read from; generators find them here.
MeshSettings = mesh_config.MeshSettings
DEFAULT_ROOT_NAMESPACE: Final = mesh_config.DEFAULT_ROOT_NAMESPACE


#: Kinds that reach generation only through the registry model (services and endpoints), so a
#: new WorkloadEntry changes the config version only if it changes a service, not just endpoints.
_REGISTRY_KINDS: Final = frozenset(("ServiceEntry", "WorkloadEntry", "WorkloadGroup"))
#: Kinds inbound generation reads (the Sidecar's ingress, the workload's DestinationRule).
_INBOUND_KINDS: Final = frozenset(("Sidecar", "DestinationRule"))


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """Configs, services and endpoints at one version."""

    version: str
    configs: Mapping[ConfigKey, Config]
    services: ServiceModel
    mesh: MeshSettings = field(default_factory=MeshSettings)
    #: Configs of each kind, sorted by (namespace, name) so every replica iterates alike.
    by_kind: Mapping[str, tuple[Config, ...]] = field(default_factory=lambda: MappingProxyType({}))
    #: A hash of everything but the endpoints of EDS (STATIC) services: when only those change,
    #: clusters, listeners and routes stay the same and only EDS is pushed.
    config_version: str = ""
    #: A hash of what a proxy's inbound config can depend on besides the proxy itself (Sidecars,
    #: DestinationRules, mesh settings, service definitions): a VirtualService or Gateway change
    #: leaves every inbound config as it was.
    inbound_version: str = ""
    _index: SnapshotIndex | None = None

    @property
    def index(self) -> SnapshotIndex:
        """Lookups shared by every proxy's generation, built once (on first use)."""
        if self._index is None:
            object.__setattr__(self, "_index", SnapshotIndex(self.by_kind, self.services, self.mesh))
        assert self._index is not None
        return self._index

    def of_kind(self, kind: str) -> tuple[Config, ...]:
        return self.by_kind.get(kind, ())

    def get(self, kind: str, namespace: str, name: str) -> Config | None:
        return self.configs.get(ConfigKey(kind, namespace, name))


def build_snapshot(configs: Iterable[Config], services: ServiceModel, mesh: MeshSettings | None = None) -> Snapshot:
    """A frozen snapshot of `configs` and `services`; the version is a hash of their content,
    so two replicas fed the same inputs give Envoy the same versions."""
    mesh = mesh or MeshSettings()
    by_key = {c.key: c for c in configs}
    grouped: dict[str, list[Config]] = defaultdict(list)
    for key in sorted(by_key):
        grouped[key.kind].append(by_key[key])
    keys = sorted(by_key)
    digests = {key: by_key[key].content_digest().encode() for key in keys}
    definitions = services.digest(endpoints_of=lambda s: s.resolution is not Resolution.STATIC).encode()
    h = hashlib.blake2b(digest_size=12)
    inbound = hashlib.blake2b(digest_size=12)
    for key in keys:
        if key.kind not in _REGISTRY_KINDS:
            h.update(digests[key])
        if key.kind in _INBOUND_KINDS:
            inbound.update(digests[key])
    for part in (repr(mesh).encode(), definitions):
        h.update(part)
        inbound.update(part)
    config_version = h.hexdigest()
    for key in keys:
        if key.kind in _REGISTRY_KINDS:
            h.update(digests[key])
    h.update(services.digest().encode())
    return Snapshot(
        version=h.hexdigest(),
        config_version=config_version,
        inbound_version=inbound.hexdigest(),
        configs=MappingProxyType(by_key),
        services=services,
        mesh=mesh,
        by_kind=MappingProxyType({k: tuple(v) for k, v in grouped.items()}),
    )


def spec(config: Config) -> Any:
    """A config's spec, typed loosely: generated protobuf classes have no static types here."""
    return config.spec
