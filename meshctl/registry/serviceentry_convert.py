"""A ServiceEntry as services and their endpoints, as Istio's `convertServices` and
`convertEndpoint` make them.

Apart from the build (`registry/serviceentry.py`), which decides which entries to convert, who
owns a hostname and what to reuse from the build before: this is the conversion of one entry,
given the workloads its selector picked (`registry/workloads.py`). The rules:

- Each host of a ServiceEntry is one service in the ServiceEntry's namespace. A port's protocol
  is its `protocol` field, else (meshctl's addition, as Istio does for Kubernetes services) the
  prefix of its name (`http-api`, `grpc-web-ui`, `tcp-db`). An unset `location` is MESH_EXTERNAL,
  an unset `resolution` NONE and an empty `exportTo` public, as in Istio's API.
- Endpoints come from a `workloadSelector` when there is one (it then wins over inline
  `endpoints`, as in Istio): every WorkloadEntry of the same namespace whose labels match.
- An endpoint's port for each service port: the WorkloadEntry's `ports[port name]`, else the
  service port's `targetPort`, else the port's number; a `unix://` address has no port.
- A DNS or DNS_ROUND_ROBIN service with neither endpoints nor selector has its host as its one
  endpoint, so Envoy resolves the name itself.
- The `networking.istio.io/traffic-distribution` annotation (`PreferClose`, `PreferSameZone`,
  `PreferSameNode`, case-insensitive) is the service's traffic distribution, as Istio reads it
  for a ServiceEntry; an unknown value is `Any`.
- Mutual TLS is only assumed when the workload says so with `security.istio.io/tlsMode: istio`.
  Istio also assumes it for any WorkloadEntry with a service account; VMs served by meshctl
  get their certificates elsewhere, so a service account alone does not turn it on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Final

from meshctl.api.networking.v1alpha3 import service_entry_pb2
from meshctl.config.labels import TLS_MODE_LABEL
from meshctl.config.model import Config
from meshctl.config.validation.metadata import TRAFFIC_DISTRIBUTION
from meshctl.registry.model import (
    Endpoint,
    Location,
    Protocol,
    Resolution,
    Service,
    ServicePort,
    TlsMode,
    TrafficDistribution,
    frozen,
)
from meshctl.registry.workloads import UNIX_PREFIX, Workload, workload_from_message

_DNS_RESOLUTIONS: Final = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})
#: Resolutions by name (DYNAMIC_DNS included: the proxy resolves each requested name itself).
_RESOLUTIONS: Final = {r.value: r for r in Resolution}

_SE = service_entry_pb2.ServiceEntry


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


def service_endpoints(spec: _SE, service: Service, selected: Iterable[Workload]) -> list[Endpoint]:
    """The endpoints of one of the entry's services; `selected` holds the workloads the entry's
    `workloadSelector` picks, when it has one."""
    if service.resolution is Resolution.DYNAMIC_DNS:
        return []  # the requested name is resolved per request; validation refuses endpoints
    dns = service.resolution in _DNS_RESOLUTIONS
    ports = _EntryPorts(spec)
    if spec.HasField("workload_selector"):
        return [_endpoint(ports, w) for w in selected if dns or not w.dns_only]
    if spec.endpoints:
        return [_endpoint(ports, workload_from_message(e, "", service.namespace)) for e in spec.endpoints]
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

    def of(self, workload: Workload) -> Mapping[int, int]:
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


def _endpoint(ports: _EntryPorts, workload: Workload) -> Endpoint:
    address = workload.address
    if workload.is_socket:
        address = address.removeprefix(UNIX_PREFIX)
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
