"""The snapshot: everything generation reads, frozen, with a content version.

A snapshot is built by a pure function from the configs in the store and the registries' model,
and never changes afterwards. Generators take it (and a proxy) as their only inputs, so a cache
keyed by the snapshot version and the proxy's generation key can never miss an input. The
indexes are the few lookups every proxy needs; anything proxy-specific lives in `scope`.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from meshctl.config import mesh as mesh_config
from meshctl.config.gateway_api import Translation, with_translation
from meshctl.config.model import Config, ConfigKey
from meshctl.registry import serviceentry
from meshctl.registry.model import ServiceModel
from meshctl.snapshot.index import SnapshotIndex

#: Mesh-wide settings live with the MeshConfig they are read from; generators find them here.
MeshSettings = mesh_config.MeshSettings
DEFAULT_ROOT_NAMESPACE: Final = mesh_config.DEFAULT_ROOT_NAMESPACE


#: Kinds that reach generation only through the registry model (services and endpoints), so a
#: new WorkloadEntry changes the config version only if it changes a service, not just endpoints.
_REGISTRY_KINDS: Final = serviceentry.KINDS


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
    #: A content hash of each kind's configs, which the next snapshot keeps for kinds unchanged.
    kind_digests: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    #: A hash of the registry's services (but endpoints of EDS services) and their identities:
    #: the part of `config_version` that is not config kinds or mesh settings.
    registry_digest: bytes = b""
    #: `version_of` results, by (kinds, endpoints, services): computed once per snapshot.
    _versions: dict[tuple[frozenset[str], bool, bool], str] = field(default_factory=dict)
    _index: SnapshotIndex | None = None
    #: The snapshot this one was built from, until its index is built (which reuses parts of
    #: the one before); then forgotten, so snapshots do not keep each other alive.
    _previous: Snapshot | None = None
    #: The config keys changed since `_previous` (None: unknown), likewise kept until the index.
    _changed: frozenset[ConfigKey] | None = None
    #: What the Gateway API resources gave (their Istio configs are among `configs`): the
    #: conditions and attachments that `validate`, `dump` and the server report.
    gateway_api: Translation = field(default_factory=Translation)

    @property
    def index(self) -> SnapshotIndex:
        """Lookups shared by every proxy's generation, built once (on first use)."""
        if self._index is None:
            previous = self._previous._index if self._previous is not None else None
            index = SnapshotIndex(self.by_kind, self.services, self.mesh, previous, self._changed)
            object.__setattr__(self, "_index", index)
            object.__setattr__(self, "_previous", None)
            object.__setattr__(self, "_changed", None)
        assert self._index is not None
        return self._index

    def of_kind(self, kind: str) -> tuple[Config, ...]:
        return self.by_kind.get(kind, ())

    def version_of(self, kinds: frozenset[str], *, endpoints: bool = False, services: bool = True) -> str:
        """A content hash of what a part of generation reads: the configs of `kinds` (registry
        kinds reach it only through the services), the registry's services and identities, the
        mesh settings and, with `endpoints`, every endpoint. Equal for two snapshots exactly
        when those inputs are equal, so a part keyed on it is shared by every snapshot that
        changed something else (a VirtualService edit builds no cluster). Without `services`,
        the registry is left out: for a part that checks what it read of it instead (a
        sidecar's outbound part, `TracedPart`)."""
        found = self._versions.get((kinds, endpoints, services))
        if found is None:
            h = hashlib.blake2b(digest_size=12)
            for kind in sorted(kinds - _REGISTRY_KINDS):
                h.update(kind.encode() + b"\0" + self.kind_digests.get(kind, b""))
            h.update(repr(self.mesh).encode())
            if services:
                h.update(self.registry_digest)
            if endpoints:
                h.update(self.services.digest().encode())
            found = self._versions[(kinds, endpoints, services)] = h.hexdigest()
        return found

    def get(self, kind: str, namespace: str, name: str) -> Config | None:
        return self.configs.get(ConfigKey(kind, namespace, name))


def build_snapshot(
    configs: Mapping[ConfigKey, Config] | Iterable[Config],
    services: ServiceModel,
    mesh: MeshSettings | None = None,
    *,
    previous: Snapshot | None = None,
    changed: Collection[ConfigKey] | None = None,
) -> Snapshot:
    """A frozen snapshot of `configs` and `services`; the version is a hash of their content,
    so two replicas fed the same inputs give Envoy the same versions.

    With `previous` and the keys `changed` since it was built (the config store's
    `changed_since`), only the kinds that changed are grouped and hashed again; the others, and
    the parts of the index that depend on nothing that changed, are taken from `previous`. The
    result is the same snapshot a full build makes."""
    mesh = mesh or MeshSettings()
    if isinstance(configs, MappingProxyType):  # read-only already (the store's view): shared
        by_key: Mapping[ConfigKey, Config] = configs
    elif isinstance(configs, Mapping):
        by_key = MappingProxyType(dict(configs))
    else:
        by_key = MappingProxyType({c.key: c for c in configs})
    # The Gateway API is served as the Istio configs it translates to (`config.gateway_api`).
    by_key, changed, gateway_api = with_translation(
        by_key, services.services.__contains__, previous.by_kind if previous is not None else None, changed
    )
    if previous is None or changed is None:
        grouped: dict[str, list[Config]] = defaultdict(list)
        for key in sorted(by_key):
            grouped[key.kind].append(by_key[key])
        by_kind = {k: tuple(v) for k, v in grouped.items()}
        kind_digests = {k: _kind_digest(v) for k, v in by_kind.items()}
    else:
        by_kind = dict(previous.by_kind)
        kind_digests = dict(previous.kind_digests)
        for kind in {k.kind for k in changed}:
            # The configs of the kind stay sorted by key: each changed key is found by bisection
            # and its config taken out or put in, and the kind's digest (a sum) follows it.
            configs = list(previous.by_kind.get(kind, ()))
            total = _digest_sum(kind_digests.get(kind))
            for key in sorted(k for k in changed if k.kind == kind):
                at = bisect.bisect_left(configs, key, key=_key_of)
                if at < len(configs) and configs[at].key == key:
                    total -= _digest_term(configs[at])
                    del configs[at]
                config = by_key.get(key)
                if config is not None:
                    configs.insert(at, config)
                    total += _digest_term(config)
            if configs:
                by_kind[kind] = tuple(configs)
                kind_digests[kind] = _digest_bytes(total)
            else:
                by_kind.pop(kind, None)
                kind_digests.pop(kind, None)
    base = previous if previous is not None and previous._index is not None else None
    base_changed = frozenset(changed) if changed is not None else None
    if base is None and previous is not None and previous._changed is not None and base_changed is not None:
        # `previous` was never indexed (a build that changed nothing, dropped: two inputs told
        # of one edit): index from the snapshot it was built from, for the changes of both.
        base, base_changed = previous._previous, previous._changed | base_changed
    definitions = services.digest(definitions=True).encode()
    registry_digest = hashlib.blake2b(definitions + services.identities_digest(), digest_size=16).digest()
    h = hashlib.blake2b(digest_size=12)
    for kind in sorted(kind_digests):
        if kind not in _REGISTRY_KINDS:
            h.update(kind_digests[kind])
    for part in (repr(mesh).encode(), definitions, services.identities_digest()):
        h.update(part)
    config_version = h.hexdigest()
    for kind in sorted(kind_digests):
        if kind in _REGISTRY_KINDS:
            h.update(kind_digests[kind])
    h.update(services.digest().encode())
    return Snapshot(
        version=h.hexdigest(),
        config_version=config_version,
        configs=by_key,
        services=services,
        mesh=mesh,
        by_kind=MappingProxyType(by_kind),
        kind_digests=MappingProxyType(kind_digests),
        registry_digest=registry_digest,
        gateway_api=gateway_api,
        # Only an indexed snapshot is a base for the index: one never indexed (a build that
        # changed nothing, dropped) would otherwise keep the chain of snapshots before it alive.
        _previous=base,
        _changed=base_changed if base is not None else None,
    )


def _kind_digest(configs: tuple[Config, ...]) -> bytes:
    """A hash of one kind's configs: the sum of their content digests (mod 2**128), so the next
    snapshot's follows a change by adding and subtracting the configs it touched."""
    return _digest_bytes(sum(_digest_term(c) for c in configs))


_DIGEST_MODULUS: Final = 1 << 128


def _digest_term(config: Config) -> int:
    return int(config.content_digest(), 16)


def _digest_sum(digest: bytes | None) -> int:
    return int.from_bytes(digest, "big") if digest else 0


def _digest_bytes(total: int) -> bytes:
    return (total % _DIGEST_MODULUS).to_bytes(16, "big")


def _key_of(config: Config) -> ConfigKey:
    return config.key


def spec(config: Config) -> Any:
    """A config's spec, typed loosely: generated protobuf classes have no static types here."""
    return config.spec
