"""ServiceEntry, WorkloadEntry and WorkloadGroup files to the registry model, as istiod does it.

`build_file_model` is a pure function of the configs (the file registry, `registry/files.py`,
builds again on a change, reusing what its memo converted; `update_file_model` applies a change
of WorkloadEntries alone to the last build, with the same result, which a test checks against
a build from scratch). It follows `pilot/pkg/serviceregistry/serviceentry` (conversion.go,
controller.go, workloadentry.go) rule by rule:

- Each host of a ServiceEntry is one service in the ServiceEntry's namespace. A port's protocol
  is its `protocol` field, else (meshctl's addition, as Istio does for Kubernetes services) the
  prefix of its name (`http-api`, `grpc-web-ui`, `tcp-db`). An unset `location` is MESH_EXTERNAL,
  an unset `resolution` NONE and an empty `exportTo` public, as in Istio's API.
- Endpoints come from a `workloadSelector` when there is one (it then wins over inline
  `endpoints`, as in Istio): every WorkloadEntry of the same namespace whose labels match. Those
  labels are the spec's labels merged with the metadata labels, metadata winning (Istio's
  `ConvertWorkloadEntry`). A WorkloadEntry whose address is not an IP (a hostname or a
  `unix://` socket) is only selected by DNS-resolved services, which Envoy can resolve.
- An endpoint's port for each service port: the WorkloadEntry's `ports[port name]`, else the
  service port's `targetPort`, else the port's number; a `unix://` address has no port.
- A DNS or DNS_ROUND_ROBIN service with neither endpoints nor selector has its host as its one
  endpoint, so Envoy resolves the name itself.
- Locality falls back to the `istio-locality` label (`region.zone` written with dots, since
  Kubernetes labels cannot hold `/`), network to the `topology.istio.io/network` label. The
  service account is kept as the name written in the WorkloadEntry (not a SPIFFE URI): the
  identity's trust domain is a server setting, applied where certificates are checked.
- The `networking.istio.io/traffic-distribution` annotation (`PreferClose`, `PreferSameZone`,
  `PreferSameNode`, case-insensitive) is the service's traffic distribution, as Istio reads it
  for a ServiceEntry; an unknown value is `Any`.
- Mutual TLS is only assumed when the workload says so with `security.istio.io/tlsMode: istio`.
  Istio also assumes it for any WorkloadEntry with a service account; VMs served by meshctl
  get their certificates elsewhere, so a service account alone does not turn it on.
- A WorkloadEntry annotated `istio.io/autoRegistrationGroup: NAME` (the annotation Istio's
  auto-registration writes on entries it creates from a group) belongs to the WorkloadGroup NAME
  of its namespace. Istio copies the group's template into such entries; here the template fills
  whatever the entry leaves unset: labels (entry > group `metadata.labels` > template labels),
  ports (per name), service account, network, locality and weight.
- A hostname defined by two ServiceEntries belongs to the first in (namespace, name) order; the
  other is ignored and a note names both (Istio keeps one per namespace; meshctl's model has one
  service per hostname).
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from sys import intern
from typing import Any, Final, TypeVar

from meshctl.api.networking.v1alpha3 import service_entry_pb2, workload_entry_pb2, workload_group_pb2
from meshctl.config.hosts import is_ip
from meshctl.config.labels import labels_match
from meshctl.config.model import Config, ConfigKey
from meshctl.config.validation.metadata import TRAFFIC_DISTRIBUTION
from meshctl.registry.model import (
    Endpoint,
    Location,
    Protocol,
    Resolution,
    Service,
    ServiceModel,
    ServicePort,
    TlsMode,
    TrafficDistribution,
    frozen,
    make_model,
    patch_model,
    sorted_endpoints,
)

#: The kinds this registry reads; a change to any other kind leaves its model alone.
KINDS: Final = frozenset({"ServiceEntry", "WorkloadEntry", "WorkloadGroup"})

GROUP_ANNOTATION: Final = "istio.io/autoRegistrationGroup"
TLS_MODE_LABEL: Final = "security.istio.io/tlsMode"
LOCALITY_LABEL: Final = "istio-locality"
NETWORK_LABEL: Final = "topology.istio.io/network"
_UNIX_PREFIX: Final = "unix://"
_DNS_RESOLUTIONS: Final = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})
#: Resolutions by name (DYNAMIC_DNS included: the proxy resolves each requested name itself).
_RESOLUTIONS: Final = {r.value: r for r in Resolution}

_SE = service_entry_pb2.ServiceEntry
_WE = workload_entry_pb2.WorkloadEntry
_WG = workload_group_pb2.WorkloadGroup


@dataclass(frozen=True, slots=True)
class _Workload:
    """A WorkloadEntry with its metadata labels and group defaults applied: what selectors see."""

    name: str
    namespace: str
    address: str
    ports: Mapping[str, int] = field(default_factory=lambda: frozen(None))
    labels: Mapping[str, str] = field(default_factory=lambda: frozen(None))
    service_account: str = ""
    network: str = ""
    locality: str = ""
    weight: int = 0

    @property
    def is_socket(self) -> bool:
        return self.address.startswith(_UNIX_PREFIX)

    @property
    def dns_only(self) -> bool:
        """Not an IP: only Envoy's DNS clusters can use it (Istio's `DNSServiceEntryOnly`)."""
        return not is_ip(self.address)


#: Label sets already made read-only in one build, by their sorted items.
_LabelPool = dict[tuple[tuple[str, str], ...], Mapping[str, str]]
#: What a WorkloadEntry starts from when it belongs to no WorkloadGroup.
_NO_TEMPLATE: Final = _Workload(name="", namespace="", address="")


class _WorkloadIndex:
    """The workloads of each namespace, in the order they were given, and the same workloads by
    (namespace, label key, label value).

    A selector then costs the workloads that carry its rarest label rather than every workload of
    its namespace, so a mesh of thousands of ServiceEntries, each selecting its own handful of
    WorkloadEntries, is built in time linear in its size rather than in their product. Selection
    keeps the given order, as a scan of the whole namespace would.
    """

    __slots__ = ("_by_label", "_by_namespace")

    def __init__(self, workloads: Iterable[_Workload]) -> None:
        self._by_namespace: dict[str, list[_Workload]] = {}
        self._by_label: dict[tuple[str, str, str], list[_Workload]] = {}
        for workload in workloads:
            self._by_namespace.setdefault(workload.namespace, []).append(workload)
            for key, value in workload.labels.items():
                self._by_label.setdefault((workload.namespace, key, value), []).append(workload)

    def add(self, workload: _Workload) -> None:
        """Add one workload where a build in key order would have put it (by name)."""
        _insort(self._by_namespace.setdefault(workload.namespace, []), workload)
        for key, value in workload.labels.items():
            _insort(self._by_label.setdefault((workload.namespace, key, value), []), workload)

    def remove(self, workload: _Workload) -> None:
        for bucket in (
            self._by_namespace.get(workload.namespace),
            *(self._by_label.get((workload.namespace, k, v)) for k, v in workload.labels.items()),
        ):
            if bucket is not None:
                for i, w in enumerate(bucket):
                    if w is workload:
                        del bucket[i]
                        break

    def select(self, namespace: str, selector: Mapping[str, str]) -> list[_Workload]:
        """The workloads of `namespace` whose labels match `selector` (Istio's rule: a
        ServiceEntry selects only in its own namespace, and a selector without labels selects
        every workload there)."""
        if not selector:
            return list(self._by_namespace.get(namespace, ()))
        buckets: list[list[_Workload]] = []
        for key, value in selector.items():
            bucket = self._by_label.get((namespace, key, value))
            if bucket is None:
                return []  # no workload has this label, so none can match the whole selector
            buckets.append(bucket)
        return [w for w in min(buckets, key=len) if labels_match(selector, w.labels)]


def _insort(bucket: list[_Workload], workload: _Workload) -> None:
    """Insert keeping the bucket in name order (a namespace's workloads in key order)."""
    bisect.insort(bucket, workload, key=lambda w: w.name)


class BuildMemo:
    """What an earlier build converted, for the next build to reuse; a registry keeps one.

    Configs are immutable, so the same WorkloadEntry config object with the same group template
    converts to the same workload, and the same ServiceEntry config object selecting the very
    same workloads has the same services and endpoints. A change to one file of ten thousand
    then converts one entry instead of all of them.
    """

    __slots__ = ("entries", "index", "model", "owners", "workloads")

    def __init__(self) -> None:
        #: WorkloadEntry key -> (config, its group's template, the workload)
        self.workloads: dict[ConfigKey, tuple[Config, _Workload | None, _Workload]] = {}
        #: ServiceEntry key -> (config, the workloads it selected, its services, their endpoints)
        self.entries: dict[
            ConfigKey, tuple[Config, Sequence[_Workload], list[Service], dict[str, tuple[Endpoint, ...]]]
        ] = {}
        #: the model the last build made, whose digests the next carries over
        self.model: ServiceModel | None = None
        #: the last build's workloads by namespace and label, and each hostname's ServiceEntry
        self.index: _WorkloadIndex | None = None
        self.owners: dict[str, ConfigKey] = {}


def _config_order(pair: tuple[Config, Any]) -> tuple[str, str, str]:
    key = pair[0].key
    return (key.kind, key.namespace, key.name)  # ConfigKey's order, compared as a plain tuple


def build_file_model(configs: Iterable[Config], memo: BuildMemo | None = None) -> ServiceModel:
    """The services and endpoints that ServiceEntry, WorkloadEntry and WorkloadGroup configs
    define; other kinds are ignored. Deterministic: the same configs give the same model.

    With `memo`, entries unchanged since the build that filled it are not converted again; the
    memo is updated to hold exactly this build's."""
    entries: list[tuple[Config, _SE]] = []
    workload_entries: list[Config] = []
    groups: dict[tuple[str, str], _WG] = {}
    for config in configs:
        if config.kind == "WorkloadEntry":
            # Its spec is read below, one at a time and only when the memo lacks it: the loader
            # keeps WorkloadEntry specs packed (see `Config`), so each read parses.
            workload_entries.append(config)
            continue
        spec = config.spec
        if config.kind == "ServiceEntry" and isinstance(spec, _SE):
            entries.append((config, spec))
        elif config.kind == "WorkloadGroup" and isinstance(spec, _WG):
            groups[(config.namespace, config.name)] = spec

    notes: list[str] = []
    templates: dict[tuple[str, str], _Workload] = {}
    shared_labels: _LabelPool = {}
    fresh: dict[ConfigKey, tuple[Config, _Workload | None, _Workload]] = {}
    for config in sorted(workload_entries, key=lambda c: tuple(c.key)):
        template = _template_of(config, groups, templates, notes)
        known = memo.workloads.get(config.key) if memo is not None else None
        if known is not None and known[0] is config and known[1] == template:
            workload = known[2]
        else:
            entry = config.spec
            if not isinstance(entry, _WE):
                continue
            workload = _workload_from_message(
                entry, config.name, config.namespace, config.labels, template, shared_labels=shared_labels
            )
        fresh[config.key] = (config, template, workload)
    index = _WorkloadIndex(w for _, _, w in fresh.values())

    services: dict[str, Service] = {}
    owners: dict[str, ConfigKey] = {}
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    converted_entries: dict[
        ConfigKey, tuple[Config, Sequence[_Workload], list[Service], dict[str, tuple[Endpoint, ...]]]
    ] = {}
    for config, spec in sorted(entries, key=_config_order):
        # Every host of the entry has the same selector, so the workloads are looked up once.
        selected: Sequence[_Workload] = ()
        if spec.HasField("workload_selector"):
            selected = index.select(config.namespace, dict(spec.workload_selector.labels))
        seen = memo.entries.get(config.key) if memo is not None else None
        if seen is not None and seen[0] is config and _same_workloads(seen[1], selected):
            converted, entry_endpoints = seen[2], seen[3]
        else:
            converted = convert_services(config)
            entry_endpoints = {s.hostname: sorted_endpoints(_endpoints(spec, s, selected)) for s in converted}
        converted_entries[config.key] = (config, selected, converted, entry_endpoints)
        if not converted and spec.hosts:
            resolution = _SE.Resolution.Name(spec.resolution)
            notes.append(f"{config.key} is ignored: resolution {resolution} is not supported")
        for service in converted:
            owner = owners.get(service.hostname)
            if owner is not None:
                if owner != config.key:
                    notes.append(f"host {service.hostname} is defined by {owner} and {config.key}; using {owner}")
                continue
            owners[service.hostname] = config.key
            services[service.hostname] = service
            endpoints[service.hostname] = entry_endpoints[service.hostname]
    model = make_model(services.values(), endpoints, notes, previous=[memo.model] if memo and memo.model else ())
    if memo is not None:
        memo.workloads, memo.entries, memo.model = fresh, converted_entries, model
        memo.index, memo.owners = index, owners
    return model


def update_file_model(
    configs: Mapping[ConfigKey, Config | None], changed: Iterable[ConfigKey], memo: BuildMemo
) -> ServiceModel | None:
    """The model `build_file_model(configs.values(), memo)` would make, when only the
    WorkloadEntries and ServiceEntries `changed` (created, updated or deleted) differ from the
    build that filled `memo`: those workloads are converted, only the ServiceEntries that
    selected them before or select them now are matched again, and the ServiceEntries changed
    are converted and matched. None when that does not hold (another kind changed, a
    WorkloadEntry of a WorkloadGroup, no build before) or when the result would need the
    whole build's rules (a model with notes, a hostname defined twice, an entry ignored): build
    the whole model then.

    An endpoint joining or leaving then costs its namespace's ServiceEntries, and an edit of
    one ServiceEntry costs that entry, not the mesh."""
    model, index = memo.model, memo.index
    if model is None or index is None:
        return None
    changed = list(changed)
    if any(key.kind not in _INCREMENTAL_KINDS for key in changed):
        return None
    entries = _changed_entries(configs, [k for k in changed if k.kind == "ServiceEntry"], memo)
    if entries is None:
        return None
    workloads = _changed_workloads(configs, [k for k in changed if k.kind == "WorkloadEntry"], memo)
    if workloads is None:
        return None
    if not workloads and not entries:
        return model
    endpoints = _apply_workloads(workloads, memo) if workloads else {}
    services: dict[str, Service | None] = {}
    for key, config, converted in entries:
        old = memo.entries.pop(key, None)
        if old is not None:
            for service in old[2]:
                if memo.owners.get(service.hostname) == key:
                    del memo.owners[service.hostname]
                    services[service.hostname] = None
                    endpoints[service.hostname] = ()
        if config is None:
            continue
        spec = config.spec
        assert isinstance(spec, _SE)  # _changed_entries converted it
        selected: Sequence[_Workload] = ()
        if spec.HasField("workload_selector"):
            selected = index.select(config.namespace, dict(spec.workload_selector.labels))
        entry_endpoints = {s.hostname: sorted_endpoints(_endpoints(spec, s, selected)) for s in converted}
        memo.entries[key] = (config, selected, converted, entry_endpoints)
        for service in converted:
            memo.owners[service.hostname] = key
            services[service.hostname] = service
            endpoints[service.hostname] = entry_endpoints[service.hostname]
    updated = patch_model(model, services, endpoints)
    memo.model = updated
    return updated


#: The kinds `update_file_model` applies as a change; any other needs the whole build.
_INCREMENTAL_KINDS: Final = frozenset({"WorkloadEntry", "ServiceEntry"})


def _changed_entries(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], memo: BuildMemo
) -> list[tuple[ConfigKey, Config | None, list[Service]]] | None:
    """The ServiceEntries changed, each with its new services (none: deleted); None when the
    change needs the whole build. Reads the memo, changes nothing.

    Without notes in the model before, every hostname had one ServiceEntry and none was
    ignored; if that still holds after the change, each hostname still belongs to the one entry
    that defines it, so the entries changed can be replaced on their own."""
    assert memo.model is not None
    out: list[tuple[ConfigKey, Config | None, list[Service]]] = []
    if not keys:
        return out
    if memo.model.notes:
        return None
    claimed: set[str] = set()
    leaving = set(keys)
    for key, config, _ in _changed_since(configs, keys, memo.entries):
        converted: list[Service] = []
        if config is not None:
            spec = config.spec
            if not isinstance(spec, _SE):
                return None
            converted = convert_services(config)
            if not converted and spec.hosts:
                return None  # ignored, with a note
            for service in converted:
                owner = memo.owners.get(service.hostname)
                if service.hostname in claimed or (owner is not None and owner not in leaving):
                    return None  # defined twice: the first by name wins, with a note
                claimed.add(service.hostname)
        out.append((key, config, converted))
    return out


#: A memo's entry for a config: the config it was made from first.
_Entry = TypeVar("_Entry", bound=tuple[Any, ...])


def _changed_since(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], known: Mapping[ConfigKey, _Entry]
) -> Iterator[tuple[ConfigKey, Config | None, _Entry | None]]:
    """Each of `keys` whose config is not the very object the memo `known` holds for it (added,
    replaced or gone), with the config now (None: gone) and the memo's entry (None: new)."""
    for key in keys:
        config = configs.get(key)
        entry = known.get(key)
        if config is None and entry is None:
            continue
        if config is not None and entry is not None and config is entry[0]:
            continue
        yield key, config, entry


def _changed_workloads(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], memo: BuildMemo
) -> list[tuple[ConfigKey, Config | None, _Workload | None, _Workload | None]] | None:
    """The WorkloadEntries changed, each as (key, config, old workload, new workload); None when
    one belongs (or belonged) to a WorkloadGroup. Reads the memo, changes nothing."""
    replaced: list[tuple[ConfigKey, Config | None, _Workload | None, _Workload | None]] = []
    for key, config, known in _changed_since(configs, keys, memo.workloads):
        if any(c is not None and c.annotations.get(GROUP_ANNOTATION) for c in (config, known and known[0])):
            return None  # group templates and their notes: the whole build handles them
        new: _Workload | None = None
        if config is not None:
            entry = config.spec
            if isinstance(entry, _WE):
                new = _workload_from_message(entry, config.name, config.namespace, config.labels, None)
        replaced.append((key, config, known[2] if known is not None else None, new))
    return replaced


def _apply_workloads(
    replaced: list[tuple[ConfigKey, Config | None, _Workload | None, _Workload | None]], memo: BuildMemo
) -> dict[str, tuple[Endpoint, ...]]:
    """Put the workloads changed into the memo's index and match again the ServiceEntries
    that selected them or select them now; returns those entries' hosts' new endpoints."""
    index = memo.index
    assert index is not None
    touched: dict[str, list[Mapping[str, str]]] = {}
    for key, config, old, new in replaced:
        if old is not None:
            index.remove(old)
            touched.setdefault(old.namespace, []).append(old.labels)
        if new is not None and config is not None:
            index.add(new)
            touched.setdefault(new.namespace, []).append(new.labels)
            memo.workloads[key] = (config, None, new)
        else:
            memo.workloads.pop(key, None)
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    for key, (config, _selected, converted, _endpoints_of) in list(memo.entries.items()):
        labels = touched.get(config.namespace)
        if labels is None:
            continue
        spec = config.spec
        if not isinstance(spec, _SE) or not spec.HasField("workload_selector"):
            continue
        selector = dict(spec.workload_selector.labels)
        if not any(labels_match(selector, found) for found in labels):
            continue
        selected = index.select(config.namespace, selector)
        entry_endpoints = {s.hostname: sorted_endpoints(_endpoints(spec, s, selected)) for s in converted}
        memo.entries[key] = (config, selected, converted, entry_endpoints)
        for host, eps in entry_endpoints.items():
            if memo.owners.get(host) == key:
                endpoints[host] = eps
    return endpoints


def _same_workloads(a: Sequence[_Workload], b: Sequence[_Workload]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def convert_services(config: Config) -> list[Service]:
    """One service per host of a ServiceEntry (Istio's `convertServices`); none when meshctl
    cannot serve its resolution."""
    spec = config.spec
    if not isinstance(spec, _SE):
        return []
    ports = tuple(
        ServicePort(
            p.name,
            p.number,
            Protocol.parse(p.protocol) if p.protocol else Protocol.from_port_name(p.name),
        )
        for p in spec.ports
    )
    resolution = _RESOLUTIONS.get(_SE.Resolution.Name(spec.resolution))
    if resolution is None:
        return []
    location = Location(_SE.Location.Name(spec.location))
    # Empty when the entry says nothing: the mesh's defaultServiceExportTo decides (`visible_from`).
    export_to = frozenset(spec.export_to)
    addresses = tuple(a for a in (_normalize_address(a) for a in spec.addresses) if a)
    # An unknown value is Any, as in Istio (validation warns about it).
    distribution = TrafficDistribution.parse(config.annotations.get(TRAFFIC_DISTRIBUTION, ""))
    seen: set[str] = set()
    out: list[Service] = []
    for host in spec.hosts:
        if host in seen:
            continue
        seen.add(host)
        out.append(
            Service(
                hostname=host,
                namespace=config.namespace,
                ports=ports,
                resolution=resolution,
                location=location,
                export_to=export_to,
                addresses=addresses,
                registry="files",
                origin=f"ServiceEntry {config.namespace}/{config.name}",
                traffic_distribution=distribution or TrafficDistribution.ANY,
            )
        )
    return out


def _normalize_address(address: str) -> str:
    """An IP stays as is, a one-address CIDR (`10.0.0.1/32`) becomes that address, a wider CIDR
    stays a CIDR; anything else is dropped, as Istio drops it."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        network = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return ""
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return address


def _endpoints(spec: _SE, service: Service, selected: Iterable[_Workload]) -> list[Endpoint]:
    """`selected` holds the workloads the entry's `workloadSelector` picks, when it has one."""
    if service.resolution is Resolution.DYNAMIC_DNS:
        return []  # the requested name is resolved per request; validation refuses endpoints
    dns = service.resolution in _DNS_RESOLUTIONS
    ports = _EntryPorts(spec)
    if spec.HasField("workload_selector"):
        return [_endpoint(ports, w) for w in selected if dns or not w.dns_only]
    if spec.endpoints:
        return [_endpoint(ports, _workload_from_message(e, "", service.namespace)) for e in spec.endpoints]
    if dns:
        return [Endpoint(service.hostname, ports.default, namespace=service.namespace)]
    return []


class _EntryPorts:
    """A ServiceEntry's ports, read once for all its endpoints, and the port maps they share.

    Most endpoints of an entry listen where the entry says (`targetPort`, else the port itself),
    so they all get one read-only map (`default`) instead of a dict each: at ten endpoints per
    service that is most of what the endpoints' ports would cost."""

    __slots__ = ("_sockets", "default", "ports")

    def __init__(self, spec: _SE) -> None:
        #: (name, number, target port) of each port
        self.ports = tuple((p.name, p.number, p.target_port) for p in spec.ports)
        self.default: Mapping[int, int] = frozen({number: target or number for _, number, target in self.ports})
        self._sockets: Mapping[int, int] | None = None

    def of(self, workload: _Workload) -> Mapping[int, int]:
        """Where `workload` listens for each port: a `unix://` socket has no port (0); a port
        the workload names in its `ports` is its own."""
        if workload.is_socket:
            if self._sockets is None:
                self._sockets = frozen(dict.fromkeys(self.default, 0))
            return self._sockets
        own = workload.ports
        if not own or not any(name in own for name, _, _ in self.ports):
            return self.default
        return frozen({number: own.get(name) or target or number for name, number, target in self.ports})


def _endpoint(ports: _EntryPorts, workload: _Workload) -> Endpoint:
    address = workload.address
    if workload.is_socket:
        address = address.removeprefix(_UNIX_PREFIX)
    tls_mode = TlsMode.ISTIO if workload.labels.get(TLS_MODE_LABEL) == TlsMode.ISTIO.value else TlsMode.DISABLED
    return Endpoint(
        address=address,
        ports=ports.of(workload),
        labels=workload.labels,
        locality=workload.locality,
        weight=workload.weight,
        service_account=workload.service_account,
        tls_mode=tls_mode,
        network=workload.network,
        name=workload.name,
        namespace=workload.namespace,
    )


def _workload_from_message(
    entry: _WE,
    name: str,
    namespace: str,
    extra_labels: Mapping[str, str] | None = None,
    template: _Workload | None = None,
    *,
    shared_labels: _LabelPool | None = None,
) -> _Workload:
    """A WorkloadEntry spec (a file's or one inline in a ServiceEntry) as a workload; labels are
    layered template < spec < `extra_labels` (the metadata labels), as Istio merges them.

    The spec is read through `ListFields`: with upb, merely reading a map field that is not set
    (`entry.ports` of nearly every WorkloadEntry) gives the message an empty map for good, about
    370 bytes each. Label keys and values, service accounts, networks and localities are
    interned: ten thousand endpoints carry a few hundred distinct ones, and each string read
    from a message is a new object. Equal label sets are one mapping through `shared_labels`
    (every endpoint of a service version has the same labels), which the endpoints share too."""
    base = template or _NO_TEMPLATE
    fields = {f.name: value for f, value in entry.ListFields()}
    merged = {**base.labels, **fields.get("labels", {}), **(extra_labels or {})}
    items = tuple((intern(k), intern(v)) for k, v in sorted(merged.items()))
    labels = shared_labels.get(items) if shared_labels is not None else None
    if labels is None:
        labels = frozen(dict(items))
        if shared_labels is not None:
            shared_labels[items] = labels
    own_ports = {intern(k): v for k, v in fields.get("ports", {}).items() if v > 0}
    ports = frozen({**base.ports, **own_ports}) if own_ports else base.ports
    locality = fields.get("locality") or base.locality
    if not locality and labels.get(LOCALITY_LABEL):
        locality = labels[LOCALITY_LABEL].replace(".", "/")
    return _Workload(
        name=name,
        namespace=namespace,
        address=fields.get("address", ""),
        ports=ports,
        labels=labels,
        service_account=intern(fields.get("service_account") or base.service_account),
        network=intern(fields.get("network") or base.network or labels.get(NETWORK_LABEL, "")),
        locality=intern(locality),
        weight=fields.get("weight") or base.weight,
    )


def _template_of(
    config: Config,
    groups: Mapping[tuple[str, str], _WG],
    templates: dict[tuple[str, str], _Workload],
    notes: list[str],
) -> _Workload | None:
    """The template of the WorkloadGroup a WorkloadEntry names, if any. `templates` keeps each
    group's template once converted: a group may have thousands of members, and they all start
    from the same one."""
    group_name = config.annotations.get(GROUP_ANNOTATION, "")
    if not group_name:
        return None
    group_key = (config.namespace, group_name)
    group = groups.get(group_key)
    if group is None:
        notes.append(
            f"{config.key} names WorkloadGroup {config.namespace}/{group_name} "
            f"({GROUP_ANNOTATION}), which does not exist"
        )
        return None
    template = templates.get(group_key)
    if template is None:
        template = _workload_from_message(group.template, "", "", dict(group.metadata.labels))
        templates[group_key] = template
    return template
