"""One model of services and endpoints, whatever registry they come from.

ServiceEntry files and Consul both end up as these plain, frozen values; nothing Consul- or
Istio-shaped leaks past `meshctl.registry`. A `ServiceModel` is a complete, immutable picture of
every registry at one moment: the snapshot holds one, and generators read it without locks.

The shapes follow Istio's own model (`pilot/pkg/model/service.go`): a service is a hostname with
ports and a resolution; an endpoint is an address with one port per service port, labels (which
select subsets and workloads), a locality, a weight, a health status and an identity.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import itertools
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, TypeVar

from meshctl.config.references import is_exported


class Protocol(enum.StrEnum):
    """Application protocol of a service port, with Istio's names."""

    HTTP = "HTTP"
    HTTP2 = "HTTP2"
    GRPC = "GRPC"
    GRPC_WEB = "GRPC-Web"
    HTTPS = "HTTPS"
    TLS = "TLS"
    TCP = "TCP"
    MONGO = "Mongo"
    REDIS = "Redis"
    MYSQL = "MySQL"
    UDP = "UDP"
    UNSUPPORTED = "UNSUPPORTED"

    @property
    def is_http(self) -> bool:
        """Served through Envoy's HTTP connection manager and RDS."""
        return self in _HTTP_PROTOCOLS

    @property
    def is_http2(self) -> bool:
        """Needs HTTP/2 to the upstream (gRPC is HTTP/2)."""
        return self in (Protocol.HTTP2, Protocol.GRPC, Protocol.GRPC_WEB)

    @property
    def is_sniffed(self) -> bool:
        """Neither declared nor implied by the port name (Istio's `IsUnsupported`): a sidecar's
        outbound listener tells HTTP from other traffic by its first bytes (protocol sniffing);
        inbound and on gateways the port is TCP."""
        return self is Protocol.UNSUPPORTED

    @classmethod
    def parse(cls, text: str) -> Protocol:
        """Istio's case-insensitive protocol names; anything unknown is UNSUPPORTED (see `is_sniffed`)."""
        return _BY_LOWER.get(text.strip().lower(), Protocol.UNSUPPORTED)

    @classmethod
    def from_port_name(cls, name: str) -> Protocol:
        """Istio's protocol selection by port name: `http`, `http-web`, `grpc-api`, `tcp-db` ..."""
        prefix = name.strip().lower().split("-", 1)[0] if name else ""
        if name.lower().startswith("grpc-web"):
            return Protocol.GRPC_WEB
        return _BY_LOWER.get(prefix, Protocol.UNSUPPORTED)


_HTTP_PROTOCOLS: Final = frozenset((Protocol.HTTP, Protocol.HTTP2, Protocol.GRPC, Protocol.GRPC_WEB))
_BY_LOWER: Final = {p.value.lower(): p for p in Protocol if p is not Protocol.UNSUPPORTED}


class Resolution(enum.StrEnum):
    """How a proxy finds the endpoints of a service (Istio's ServiceEntry resolution)."""

    STATIC = "STATIC"  # endpoints are listed (EDS)
    DNS = "DNS"  # endpoints are hostnames resolved by Envoy, all addresses used (STRICT_DNS)
    DNS_ROUND_ROBIN = "DNS_ROUND_ROBIN"  # one hostname, first address used per connection (LOGICAL_DNS)
    NONE = "NONE"  # connect to the address the client asked for (ORIGINAL_DST)
    #: resolve the name the client asked for (HTTP Host, TLS SNI) per request: Envoy's dynamic
    #: forward proxy, for wildcard hosts; no endpoints
    DYNAMIC_DNS = "DYNAMIC_DNS"


class Location(enum.StrEnum):
    MESH_INTERNAL = "MESH_INTERNAL"
    MESH_EXTERNAL = "MESH_EXTERNAL"


class Health(enum.StrEnum):
    """Endpoint health as Envoy's EDS knows it."""

    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEGRADED = "DEGRADED"
    DRAINING = "DRAINING"


class TrafficDistribution(enum.StrEnum):
    """How a service's callers prefer its endpoints (Istio's `TrafficDistribution`, from the
    `networking.istio.io/traffic-distribution` annotation of a ServiceEntry, the counterpart of a
    Kubernetes Service's `spec.trafficDistribution`): anywhere, or close to the caller, failing
    over further away only when the close ones are unhealthy."""

    ANY = "Any"
    #: same network, then region, then zone (`PreferClose` is Kubernetes' older name for it)
    PREFER_SAME_ZONE = "PreferSameZone"
    #: same network, region, zone, subzone, then node (`kubernetes.io/hostname`)
    PREFER_SAME_NODE = "PreferSameNode"

    @classmethod
    def parse(cls, text: str) -> TrafficDistribution | None:
        """Istio's case-insensitive values; None for one it does not know (served as ANY)."""
        return _DISTRIBUTIONS.get(text.strip().lower())


_DISTRIBUTIONS: Final = {
    "any": TrafficDistribution.ANY,
    "preferclose": TrafficDistribution.PREFER_SAME_ZONE,
    "prefersamezone": TrafficDistribution.PREFER_SAME_ZONE,
    "prefersamenode": TrafficDistribution.PREFER_SAME_NODE,
}


class TlsMode(enum.StrEnum):
    """Whether an endpoint's proxy accepts mutual TLS from the mesh (Istio's `security.istio.io/tlsMode`)."""

    ISTIO = "istio"
    DISABLED = "disabled"


K = TypeVar("K")
V = TypeVar("V")

#: Whole-model digests are sums of per-host hashes of 128 bits, modulo this.
_DIGEST_MODULUS: Final = 1 << 128

#: The one empty mapping every endpoint without labels (or ports) shares.
_EMPTY: Final[Mapping[Any, Any]] = MappingProxyType({})


def frozen(mapping: Mapping[K, V] | None) -> Mapping[K, V]:
    """A read-only copy of `mapping`, or `mapping` itself when it is already read-only.

    A mesh has tens of thousands of endpoints and most of their labels and port maps are equal
    (every endpoint of a service usually has the same ports): the builders make one read-only
    mapping and hand it to each, and a copy per endpoint would undo that. So a `MappingProxyType`
    is taken as is; whoever builds one must not change the dict behind it afterwards.
    """
    if type(mapping) is MappingProxyType:
        return mapping
    if not mapping:
        return _EMPTY
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class ServicePort:
    """A port clients call: its name, number and protocol."""

    name: str
    number: int
    protocol: Protocol


@dataclass(frozen=True, slots=True)
class Service:
    """A hostname clients call, its ports, and how its endpoints are found.

    `origin` says where it came from for people (`ServiceEntry bookinfo/reviews`, `consul`);
    `registry` names the registry (`files`, `consul`) for the merge rule and debug pages.
    """

    hostname: str
    namespace: str
    ports: tuple[ServicePort, ...]
    resolution: Resolution = Resolution.STATIC
    location: Location = Location.MESH_INTERNAL
    #: Namespaces that may see the service: `*` everyone (the default), `.` its own, or names.
    export_to: frozenset[str] = frozenset({"*"})
    addresses: tuple[str, ...] = ()
    registry: str = "files"
    origin: str = ""
    traffic_distribution: TrafficDistribution = TrafficDistribution.ANY

    def port(self, number: int) -> ServicePort | None:
        for p in self.ports:
            if p.number == number:
                return p
        return None

    def visible_from(self, namespace: str, default: frozenset[str] = frozenset({"*"})) -> bool:
        """Istio's exportTo (`is_exported`); a service that says nothing takes `default`
        (MeshConfig's defaultServiceExportTo, public unless the mesh says otherwise)."""
        return is_exported(self.export_to or default, self.namespace, namespace)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One instance of a service: where to connect for each service port, and what it is.

    `ports` maps a service port number to the port this instance listens on; a service port
    missing from it is not served by this instance. `name` and `namespace` identify the workload
    (a WorkloadEntry, a Consul service instance) for people and for binding a proxy to it.
    """

    address: str
    ports: Mapping[int, int]
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    locality: str = ""  # region/zone/subzone
    weight: int = 0  # 0: unset (Envoy's default of 1)
    health: Health = Health.HEALTHY
    service_account: str = ""
    tls_mode: TlsMode = TlsMode.DISABLED
    network: str = ""
    name: str = ""
    namespace: str = ""
    #: Why `health` is what it is, for people (a failing probe, a stream gone); not part of what
    #: Envoy is sent, so it neither compares nor counts in digests.
    health_reason: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", frozen(self.labels))
        object.__setattr__(self, "ports", frozen(self.ports))

    def sort_key(self) -> tuple[str, str, str]:
        return (self.address, self.namespace, self.name)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class ServiceModel:
    """Every service and its endpoints at one moment; immutable, shared by snapshots.

    `notes` are problems the registries want a person to see (a hostname defined twice, a
    selector that names a missing WorkloadGroup); they never stop the model from being built.
    """

    services: Mapping[str, Service] = field(default_factory=lambda: MappingProxyType({}))
    endpoints: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = ()
    #: Digests computed so far, by hostname (a model never changes, so neither do they); seeded
    #: by `make_model` from the model before for the services and endpoints it kept as they were.
    _service_digests: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    _endpoint_digests: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    _identities: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict, compare=False, repr=False)
    #: Whole-model digests computed once (the model is immutable), as sums (`_sum`): kind -> sum.
    _sums: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    #: For a model made by `patch_model`: the models it was patched from, the nearest first and
    #: up to `_PATCH_CHAIN` steps back (weakly: models must not keep the ones before them
    #: alive), each with the only hosts whose service or endpoints may differ from it, so
    #: `diff_models` and the snapshot index look at those and not at the mesh, also against a
    #: model a few changes old (a part last checked two edits ago).
    _patched_from: tuple[tuple[weakref.ref[ServiceModel], frozenset[str]], ...] = field(
        default=(), compare=False, repr=False
    )

    def endpoints_of(self, hostname: str) -> tuple[Endpoint, ...]:
        return self.endpoints.get(hostname, ())

    def digest(self, *, definitions: bool = False) -> str:
        """A content hash: two replicas that see the same registries compute the same value.
        With `definitions`, the endpoints of EDS (STATIC) services are left out: what clusters,
        listeners and routes depend on.

        The hash is a sum of one hash per host, so a model patched from another (`patch_model`)
        whose digest is known computes its own from the hosts the patch touched, not the mesh."""
        return f"{self._sum('definitions' if definitions else 'all'):032x}"

    def identities(self, hostname: str) -> tuple[tuple[str, str], ...]:
        """The (namespace, service account) of every workload behind `hostname`, sorted: whom a
        client talking mutual TLS to the service may find at the other end. A workload that
        names no service account runs as `default`, as in Istio. Computed once per model."""
        found = self._identities.get(hostname)
        if found is None:
            found = tuple(
                sorted({(ep.namespace, ep.service_account or "default") for ep in self.endpoints.get(hostname, ())})
            )
            self._identities[hostname] = found
        return found

    def identities_digest(self) -> bytes:
        """A hash of every service's workload identities: clients' mutual TLS settings name them,
        so a workload with a new service account changes clusters, not only endpoints."""
        return self._sum("identities").to_bytes(16, "big")

    def _sum(self, kind: str) -> int:
        """The sum of every host's `_term` (mod 2**128), computed once per model: from the
        model patched, when its sum is known, at the cost of the hosts touched."""
        found = self._sums.get(kind)
        if found is not None:
            return found
        patched = self._patched_from[0] if self._patched_from else None
        base = patched[0]() if patched is not None else None
        if patched is not None and base is not None and kind in base._sums:
            total = base._sums[kind]
            for host in patched[1]:
                total += self._term(kind, host) - base._term(kind, host)
        else:
            total = sum(self._term(kind, host) for host in self.services)
        found = self._sums[kind] = total % _DIGEST_MODULUS
        return found

    def _term(self, kind: str, host: str) -> int:
        """One host's part of a digest: a hash of its service and endpoints (`all`), of its
        service and, unless EDS serves them, its endpoints (`definitions`), or of the
        identities behind it (`identities`); 0 for a host the model does not have."""
        service = self.services.get(host)
        if service is None:
            return 0
        if kind == "identities":
            data = repr((host, self.identities(host))).encode()
        else:
            data = self._service_digests.get(host) or b""
            if not data:
                data = self._service_digests[host] = repr(_service_tuple(service)).encode()
            if kind == "all" or service.resolution is not Resolution.STATIC:
                data += self.endpoints_digest(host).encode()
        return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big")

    def endpoints_digest(self, hostname: str) -> str:
        """A content hash of one service's endpoints (EDS caches per host on it), computed once
        per model, and not again in the next model for endpoints it kept (`make_model`)."""
        found = self._endpoint_digests.get(hostname)
        if found is not None:
            return found
        h = hashlib.blake2b(digest_size=12)
        for ep in self.endpoints.get(hostname, ()):
            h.update(repr(_endpoint_tuple(ep)).encode())
        digest = self._endpoint_digests[hostname] = h.hexdigest()
        return digest


def _service_tuple(s: Service) -> tuple[object, ...]:
    return (
        s.hostname,
        s.namespace,
        s.ports,
        s.resolution,
        s.location,
        tuple(sorted(s.export_to)),
        s.addresses,
        s.registry,
        s.traffic_distribution,
    )


def _endpoint_tuple(e: Endpoint) -> tuple[object, ...]:
    return (
        e.address,
        tuple(sorted(e.ports.items())),
        tuple(sorted(e.labels.items())),
        e.locality,
        e.weight,
        e.health,
        e.service_account,
        e.tls_mode,
        e.network,
        e.name,
        e.namespace,
    )


def make_model(
    services: Iterable[Service],
    endpoints: Mapping[str, Iterable[Endpoint]],
    notes: Iterable[str] = (),
    previous: Iterable[ServiceModel] = (),
) -> ServiceModel:
    """A ServiceModel with endpoints in a stable order (so versions are stable across replicas).

    Endpoints given as a tuple already in that order are kept as they are, so a registry that
    hands the same tuple again for an unchanged service keeps its identity; from the `previous`
    models, the digests of the services and endpoints kept from them are carried over instead of computed again
    (a change to one service then hashes one service, not the mesh)."""
    by_host = {s.hostname: s for s in sorted(services, key=lambda s: s.hostname)}
    previous = list(previous)
    known = previous[0].endpoints if previous else {}
    eps: dict[str, tuple[Endpoint, ...]] = {}
    for host in by_host:
        given = endpoints.get(host)
        if given:
            if given is known.get(host):  # in order already: the model before has it
                eps[host] = given  # type: ignore[assignment]
            else:
                eps[host] = given if type(given) is tuple and _in_order(given) else sorted_endpoints(given)
    model = ServiceModel(MappingProxyType(by_host), MappingProxyType(eps), tuple(notes))
    for old in previous:
        old_services, old_endpoints = old.services, old.endpoints
        for host, service_digest in list(old._service_digests.items()):
            if old_services.get(host) is by_host.get(host):
                model._service_digests.setdefault(host, service_digest)
        for host, digest in list(old._endpoint_digests.items()):
            if old_endpoints.get(host) is eps.get(host):
                model._endpoint_digests.setdefault(host, digest)
        for host, identities in list(old._identities.items()):
            if old_endpoints.get(host) is eps.get(host):
                model._identities.setdefault(host, identities)
    return model


#: How many patch steps back a patched model knows its differences from (`patched_hosts`).
_PATCH_CHAIN: Final = 8


def patch_model(
    model: ServiceModel,
    services: Mapping[str, Service | None],
    endpoints: Mapping[str, tuple[Endpoint, ...]],
) -> ServiceModel:
    """`model` with the services of some hosts replaced or removed (None) and the endpoints of
    some hosts replaced (empty: none), endpoints given in model order (`sorted_endpoints`).

    The same model `make_model` makes from the whole content, at the cost of the hosts named:
    the mappings keep their hostname order, and every digest of a host left as it was carries
    over. An edit of one ServiceEntry among ten thousand then costs one service, not the mesh."""
    by_host = _copy(model.services)
    eps = _copy(model.endpoints)
    added: list[str] = []
    for host, service in services.items():
        if service is None:
            by_host.pop(host, None)
            eps.pop(host, None)
        else:
            if host not in by_host:
                added.append(host)
            by_host[host] = service
    reorder = bool(added)
    for host, given in endpoints.items():
        if given and host in by_host:
            reorder = reorder or host not in eps
            eps[host] = given
        else:
            eps.pop(host, None)
    if reorder:
        # Hostname order, as `make_model` gives it: the few hosts added put in their places.
        # (Copied with C-level iteration: this runs on every edit that adds a host, over the mesh.)
        gone = len(model.services) + len(added) != len(by_host)
        order = list(filter(by_host.__contains__, model.services)) if gone else list(model.services)
        for host in added:
            bisect.insort(order, host)
        by_host = dict(zip(order, map(by_host.__getitem__, order), strict=True))
        with_endpoints = list(filter(eps.__contains__, order))
        eps = dict(zip(with_endpoints, map(eps.__getitem__, with_endpoints), strict=True))
    old_services, old_endpoints = model.services, model.endpoints
    touched = frozenset(
        host
        for host in services.keys() | endpoints.keys()
        if old_services.get(host) is not by_host.get(host) or old_endpoints.get(host) is not eps.get(host)
    )
    new = ServiceModel(MappingProxyType(by_host), MappingProxyType(eps), model.notes)
    new._service_digests.update(model._service_digests)
    new._endpoint_digests.update(model._endpoint_digests)
    new._identities.update(model._identities)
    for host in touched:
        if old_services.get(host) is not by_host.get(host):
            new._service_digests.pop(host, None)
        if old_endpoints.get(host) is not eps.get(host):
            new._endpoint_digests.pop(host, None)
            new._identities.pop(host, None)
    # The steps before carry over, each widened by this one's hosts: a model some patches back
    # differs at most in the hosts of every step since.
    chain = [(weakref.ref(model), touched)]
    chain.extend((ref, hosts | touched) for ref, hosts in model._patched_from[: _PATCH_CHAIN - 1] if ref() is not None)
    object.__setattr__(new, "_patched_from", tuple(chain))
    return new


def _copy(mapping: Mapping[K, V]) -> dict[K, V]:
    """A dict copy; of a MappingProxyType, its dict's own copy (`dict()` would look up every key)."""
    if isinstance(mapping, (dict, MappingProxyType)):
        return mapping.copy()
    return dict(mapping)


def sorted_endpoints(endpoints: Iterable[Endpoint]) -> tuple[Endpoint, ...]:
    """Endpoints in the order a model keeps them."""
    return tuple(sorted(endpoints, key=Endpoint.sort_key))


def _in_order(endpoints: tuple[Endpoint, ...]) -> bool:
    keys = [e.sort_key() for e in endpoints]
    return all(a <= b for a, b in itertools.pairwise(keys))


@dataclass(frozen=True, slots=True)
class RegistryChange:
    """What changed in a registry: the hostnames touched, and whether only endpoints changed
    (then the server pushes EDS alone)."""

    hosts: frozenset[str]
    endpoint_only: bool
    #: The change comes from inputs that were debounced already (the config files, whose watcher
    #: waits for writes to settle), so a snapshot may be built for it without waiting again.
    settled: bool = False


@dataclass(frozen=True, slots=True)
class RegistryStatus:
    """How a registry is doing, for `/ready`, `/debug/registryz` and `meshctl services`."""

    name: str
    healthy: bool
    message: str = ""
    services: int = 0
    endpoints: int = 0


def patched_hosts(old: ServiceModel, new: ServiceModel) -> frozenset[str] | None:
    """When `new` was patched from `old` (`patch_model`), directly or through up to
    `_PATCH_CHAIN` patches in a row, the only hosts whose service or endpoints may differ
    between them; None when that is not known (then any host may)."""
    if new is old:
        return frozenset()
    for ref, hosts in new._patched_from:
        if ref() is old:
            return hosts
    return None


def diff_models(old: ServiceModel, new: ServiceModel) -> RegistryChange | None:
    """The change from `old` to `new`, or None when they are the same. For a model patched from
    `old` (`patch_model`), only the hosts the patch touched are compared."""
    if new is old:
        return None
    hosts: set[str] = set()
    services_changed = False
    candidates = patched_hosts(old, new)
    for host in old.services.keys() | new.services.keys() if candidates is None else candidates:
        a, b = old.services.get(host), new.services.get(host)
        if a is not b and a != b:
            hosts.add(host)
            services_changed = True
        else:
            before, after = old.endpoints.get(host, ()), new.endpoints.get(host, ())
            if before is not after and before != after:
                hosts.add(host)
    if not hosts:
        return None
    return RegistryChange(frozenset(hosts), endpoint_only=not services_changed)
