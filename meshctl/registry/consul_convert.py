"""Consul's catalog as meshctl's model: pure functions from Consul's JSON to Service and Endpoint.

The input is what `GET /v1/health/service/NAME` returns: one entry per instance with its `Node`,
its `Service` and every check that bears on it. Everything here is decided from that data and a
`ConsulMapping`, so the same answer from Consul always gives the same model (and the same
versions on two meshctl replicas).

The mapping, and why:

- Host: `NAME.<domain>` (`web.service.consul` by default), the name Consul's DNS answers, so
  clients keep the names they already use. A service name that is not a DNS label is skipped
  with a note: Envoy and Istio need hostnames.
- Ports: every distinct instance port is a service port, named `<protocol>-<number>` (Istio's
  port-naming convention, so the name says the protocol). An instance serves the one port it
  registered. The protocol comes from the instance's `protocol` service meta (`http`, `http2`,
  `grpc`, `tcp`, ... Istio's names, any case), else the default protocol. An unknown protocol is
  TCP with a note (Istio's old Consul registry did the same); two instances that disagree on a
  port's protocol keep the first in (node, service ID) order, with a note.
- Labels: service meta entries, and tags of the form `key=value` whose key and value are valid
  Kubernetes labels; meta wins over a tag with the same key. Plain tags (`primary`, `v1`) are not
  labels: they have no key, and inventing one (`v1: "true"`) would collide with real keys. Use
  meta (`version = "v1"`) or `version=v1` tags to select subsets. The `protocol` meta key is read,
  not copied into labels.
- Address: the service address when the instance registered one, else its node's address, as
  Consul's DNS and HTTP API document. When any address is a hostname rather than an IP, the
  service is resolved by DNS (Envoy cannot take hostnames in EDS).
- Health: a critical check (maintenance mode is a critical check), or a status Consul may add
  later, makes the instance UNHEALTHY; warning is HEALTHY unless `warning_is_healthy` is off,
  matching Consul's own DNS and Envoy integration, which serve warning instances by default;
  an instance without checks is HEALTHY. Node checks (`serfHealth`) count for every instance on
  the node.
- Weight: `Weights.Passing`, or `Weights.Warning` for a healthy instance in warning.
- Locality: region is the datacenter; zone is the service's `Locality.Zone` (Consul 1.17+) or
  the node's `zone` meta.
- Kind: instances with a `Kind` (Consul Connect sidecars and gateways) are skipped: they are
  Consul's own Envoys, not workloads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from meshctl.config.hosts import is_ip
from meshctl.config.labels import NETWORK_LABEL, TLS_MODE_LABEL
from meshctl.registry.model import (
    Endpoint,
    Health,
    Protocol,
    Resolution,
    Service,
    ServiceModel,
    ServicePort,
    TlsMode,
    make_model,
)

PROTOCOL_META: Final = "protocol"
ZONE_NODE_META: Final = "zone"

# RFC 1123 labels (service names) and Kubernetes label keys and values (tags that become labels).
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.IGNORECASE)
_LABEL_NAME: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY: Final = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}", re.IGNORECASE)
_LABEL_VALUE: Final = re.compile(rf"({_LABEL_NAME})?")
_PASSING: Final = "passing"
_WARNING: Final = "warning"


@dataclass(frozen=True, slots=True)
class ConsulMapping:
    """The choices that shape the model; part of ConsulOptions, kept apart so the mapping stays pure."""

    domain: str = "service.consul"
    namespace: str = "default"
    default_protocol: Protocol = Protocol.TCP
    warning_is_healthy: bool = True


@dataclass(frozen=True, slots=True)
class ConvertedService:
    """One Consul service in the model: `service` is None when no instance gave it a port."""

    service: Service | None
    endpoints: tuple[Endpoint, ...]
    notes: tuple[str, ...] = ()


def hostname_for(name: str, mapping: ConsulMapping) -> str | None:
    """`NAME.<domain>` in lower case (DNS is case-insensitive), or None when NAME is not a DNS label."""
    if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        return None
    return f"{name.lower()}.{mapping.domain.strip('.').lower()}"


def convert_service(
    name: str,
    entries: Iterable[object],
    mapping: ConsulMapping,
    previous: Service | None = None,
) -> ConvertedService:
    """The service and endpoints of one `/v1/health/service/NAME` answer.

    With no usable instance left, `previous` (the service as last seen) is kept with no endpoints,
    so the last instance leaving is an endpoint-only change and Envoy drains before the catalog
    drops the service.
    """
    host = hostname_for(name, mapping)
    if host is None:
        return ConvertedService(None, (), (f"consul service {name!r} is skipped: its name is not a DNS label",))
    notes: list[str] = []
    ports: dict[int, ServicePort] = {}
    endpoints: list[Endpoint] = []
    hostnames = False
    for entry in sorted((e for e in entries if isinstance(e, Mapping)), key=_entry_order):
        node, svc = _mapping(entry.get("Node")), _mapping(entry.get("Service"))
        if _text(svc, "Kind"):
            continue
        instance = f"{name}/{_text(node, 'Node')}/{_text(svc, 'ID')}"
        port_number = _integer(svc, "Port")
        address = instance_address(entry)
        if not 0 < port_number < 65536 or not address:
            notes.append(f"consul instance {instance} is skipped: it has no address and port to connect to")
            continue
        port = _service_port(svc, port_number, mapping, instance, notes)
        known = ports.setdefault(port.number, port)
        if known.protocol is not port.protocol:
            notes.append(
                f"consul instance {instance} says port {port.number} is {port.protocol.value}, "
                f"an earlier instance says {known.protocol.value}; using {known.protocol.value}"
            )
        hostnames = hostnames or not is_ip(address)
        endpoints.append(_endpoint(entry, address, port_number, mapping))
    if not ports:
        return ConvertedService(previous, (), tuple(notes))
    service = Service(
        hostname=host,
        namespace=mapping.namespace,
        ports=tuple(sorted(ports.values(), key=lambda p: p.number)),
        resolution=Resolution.DNS if hostnames else Resolution.STATIC,
        registry="consul",
        origin=f"consul service {name}",
    )
    return ConvertedService(service, tuple(sorted(endpoints, key=Endpoint.sort_key)), tuple(notes))


def assemble_model(
    converted: Mapping[str, ConvertedService], mapping: ConsulMapping, notes: Iterable[str] = ()
) -> ServiceModel:
    """One model from every converted service; of two names for one hostname (`Web` and `web`),
    the first in sorted order is kept, with a note."""
    services: dict[str, Service] = {}
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    owners: dict[str, str] = {}
    all_notes = list(notes)
    for name in sorted(converted):
        item = converted[name]
        all_notes.extend(item.notes)
        if item.service is None:
            continue
        host = hostname_for(name, mapping) or item.service.hostname
        if host in owners:
            all_notes.append(f"consul services {owners[host]!r} and {name!r} are both {host}; using {owners[host]!r}")
            continue
        owners[host], services[host], endpoints[host] = name, item.service, item.endpoints
    return make_model(services.values(), endpoints, all_notes)


def instance_address(entry: Mapping[str, object]) -> str:
    """The service address when the instance registered one, else its node's address."""
    return _text(_mapping(entry.get("Service")), "Address") or _text(_mapping(entry.get("Node")), "Address")


def instance_labels(tags: Iterable[object], meta: Mapping[str, object]) -> dict[str, str]:
    """Labels from `key=value` tags and service meta (meta wins); see the module docstring."""
    labels: dict[str, str] = {}
    for tag in sorted(t for t in tags if isinstance(t, str)):
        key, sep, value = tag.partition("=")
        if sep and _LABEL_KEY.fullmatch(key) and _LABEL_VALUE.fullmatch(value):
            labels[key] = value
    for meta_key, meta_value in meta.items():
        if meta_key != PROTOCOL_META and isinstance(meta_value, str):
            labels[meta_key] = meta_value
    return labels


def instance_health(checks: Iterable[object], service_id: str, warning_is_healthy: bool) -> tuple[Health, bool]:
    """The instance's health, and whether it is in warning (for its weight).

    Only checks of this instance and of its node count; Consul sends just those, but the entry
    is data from the network and a check of another instance must not mark this one down.
    """
    warning = False
    for check in checks:
        if not isinstance(check, Mapping):
            continue
        if _text(check, "ServiceID") not in ("", service_id):
            continue
        status = _text(check, "Status")
        if status == _WARNING:
            warning = True
        elif status != _PASSING:
            return Health.UNHEALTHY, False
    if warning and not warning_is_healthy:
        return Health.UNHEALTHY, True
    return Health.HEALTHY, warning


def _endpoint(entry: Mapping[str, object], address: str, port: int, mapping: ConsulMapping) -> Endpoint:
    node, svc = _mapping(entry.get("Node")), _mapping(entry.get("Service"))
    service_id = _text(svc, "ID")
    labels = instance_labels(_list(svc, "Tags"), _mapping(svc.get("Meta")))
    health, warning = instance_health(_list(entry, "Checks"), service_id, mapping.warning_is_healthy)
    weights = _mapping(svc.get("Weights"))
    weight = _integer(weights, "Warning" if warning else "Passing")
    return Endpoint(
        address=address,
        ports={port: port},
        labels=labels,
        locality=_locality(node, svc),
        weight=max(weight, 1) if weights else 0,
        health=health,
        tls_mode=TlsMode.ISTIO if labels.get(TLS_MODE_LABEL) == TlsMode.ISTIO.value else TlsMode.DISABLED,
        network=labels.get(NETWORK_LABEL, ""),
        name=service_id,
        namespace=mapping.namespace,
    )


def _service_port(
    svc: Mapping[str, object], number: int, mapping: ConsulMapping, instance: str, notes: list[str]
) -> ServicePort:
    text = _text(_mapping(svc.get("Meta")), PROTOCOL_META)
    protocol = Protocol.parse(text) if text else mapping.default_protocol
    if protocol is Protocol.UNSUPPORTED:
        notes.append(f"consul instance {instance} has unknown protocol {text!r}; using TCP")
        protocol = Protocol.TCP
    return ServicePort(f"{protocol.value.lower()}-{number}", number, protocol)


def _locality(node: Mapping[str, object], svc: Mapping[str, object]) -> str:
    locality = _mapping(svc.get("Locality"))
    region = _text(locality, "Region") or _text(node, "Datacenter")
    zone = _text(locality, "Zone") or _text(_mapping(node.get("Meta")), ZONE_NODE_META)
    if not region:
        return ""
    return f"{region}/{zone}" if zone else region


def _entry_order(entry: Mapping[str, object]) -> tuple[str, str]:
    return (_text(_mapping(entry.get("Node")), "Node"), _text(_mapping(entry.get("Service")), "ID"))


# Consul's JSON is data from the network: read it field by field, with a default for anything
# missing or of the wrong type, rather than trusting its shape.


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _text(obj: Mapping[str, object], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _integer(obj: Mapping[str, object], key: str) -> int:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(obj: Mapping[str, object], key: str) -> Sequence[object]:
    value = obj.get(key)
    return value if isinstance(value, list) else ()
