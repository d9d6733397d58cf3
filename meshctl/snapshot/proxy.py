"""Who is asking: an Envoy's node, parsed as Istio does, and bound to its workload.

Envoy sends `node.id` as `TYPE~IP~NAME.NAMESPACE~DOMAIN` (Istio's format: `sidecar~10.10.0.41~
reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local`, `router~...` for a gateway) and may carry
`NAMESPACE`, `LABELS` and `INTERCEPTION_MODE` in `node.metadata`. A proxy is bound to its workload
(the WorkloadEntry named by the id, else the one with its IP, else a registry endpoint with that
IP); the workload's labels select the Sidecar, Gateways and DestinationRules that apply to it,
and the services it is an endpoint of give its inbound listeners.

A node whose identity a client certificate proved (`ProxyNode.attested`, set by the server when it
requires client certificates) is bound more strictly, because everything else in its request is
the client's word: only to a workload of its own namespace, and with its workload's labels alone
(node metadata cannot add a label that would select another workload's Sidecar or a Gateway).

What a node sends is untrusted and kept small: a node id longer than `MAX_NODE_ID` is refused,
and of the metadata only the keys read here are kept.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from meshctl.errors import NodeIdError
from meshctl.logs import untrusted
from meshctl.registry.model import Endpoint, Service
from meshctl.snapshot.index import LabelSelector
from meshctl.snapshot.interception import InterceptionMode
from meshctl.snapshot.model import Snapshot, spec

#: Istio's node ids are a few hundred characters at most (a Kubernetes name, a namespace, an IP
#: and a domain); a longer one is not a proxy's.
MAX_NODE_ID = 1024
#: Labels a node may claim in its metadata (`LABELS`).
MAX_NODE_LABELS = 256
#: The node metadata keys meshctl reads; the rest is not kept.
METADATA_KEYS = ("NAMESPACE", "LABELS", "INTERCEPTION_MODE")


class ProxyType(enum.StrEnum):
    SIDECAR = "sidecar"
    ROUTER = "router"


@dataclass(frozen=True, slots=True)
class ProxyNode:
    """What the node says about itself, before binding."""

    id: str
    type: ProxyType
    ip: str
    name: str
    namespace: str
    domain: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    interception: InterceptionMode = InterceptionMode.NONE
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Its identity was proven by a client certificate: bound strictly (see the module docstring).
    attested: bool = False
    #: It is sent the mesh's workload certificates over SDS, so its config may use mutual TLS
    #: (ISTIO_MUTUAL, auto mTLS, PeerAuthentication). The server says no for a proxy it may not
    #: send a key to; config that names a secret the proxy never gets would never start.
    mesh_certificates: bool = True


def parse_node_id(node_id: str, metadata: Mapping[str, Any] | None = None) -> ProxyNode:
    """Parse Istio's node id and the metadata keys meshctl reads; raises NodeIdError, whose
    message quotes what the node sent escaped and shortened (`untrusted`)."""
    metadata = {k: metadata[k] for k in METADATA_KEYS if k in metadata} if metadata else {}
    if len(node_id) > MAX_NODE_ID:
        raise NodeIdError(f"node id {untrusted(node_id)} is longer than {MAX_NODE_ID} characters")
    parts = node_id.split("~")
    if len(parts) != 4:
        raise NodeIdError(
            f"node id {untrusted(node_id)} is not TYPE~IP~NAME.NAMESPACE~DOMAIN "
            "(e.g. sidecar~10.0.0.5~reviews-v1.bookinfo~bookinfo.svc.cluster.local)"
        )
    kind, ip, workload, domain = parts
    try:
        proxy_type = ProxyType(kind)
    except ValueError:
        raise NodeIdError(
            f"node id {untrusted(node_id)}: type must be sidecar or router, not {untrusted(kind)}"
        ) from None
    if not ip:
        raise NodeIdError(f"node id {untrusted(node_id)} has no IP")
    name, _, namespace = workload.partition(".")
    namespace = str(metadata.get("NAMESPACE") or namespace or "default")
    raw_labels = metadata.get("LABELS") or {}
    if isinstance(raw_labels, Mapping) and len(raw_labels) > MAX_NODE_LABELS:
        raise NodeIdError(f"node {untrusted(node_id)} claims {len(raw_labels)} LABELS, over {MAX_NODE_LABELS}")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, Mapping) else {}
    mode_text = str(metadata.get("INTERCEPTION_MODE") or InterceptionMode.NONE.value).upper()
    try:
        mode = InterceptionMode(mode_text)
    except ValueError:
        raise NodeIdError(f"INTERCEPTION_MODE {untrusted(mode_text)} is not NONE, REDIRECT or TPROXY") from None
    return ProxyNode(
        id=node_id,
        type=proxy_type,
        ip=ip,
        name=name,
        namespace=namespace,
        domain=domain,
        labels=MappingProxyType(labels),
        interception=mode,
        metadata=MappingProxyType(metadata),
    )


@dataclass(frozen=True, slots=True)
class ServiceInstance:
    """This proxy's workload as an endpoint of a service: the source of an inbound listener."""

    service: Service
    endpoint: Endpoint


@dataclass(frozen=True, slots=True, eq=False)
class Proxy:
    """A node bound to its workload in one snapshot."""

    node: ProxyNode
    labels: Mapping[str, str]
    #: The WorkloadEntry (`namespace/name`) or registry instance the proxy was bound to, if any.
    workload: str = ""
    instances: tuple[ServiceInstance, ...] = ()
    #: Whether the proxy's own address can appear in its config (see `generation_key`).
    address_in_config: bool = True
    #: The snapshot's label selectors its labels match (`SnapshotIndex.label_selectors`).
    selectors: tuple[LabelSelector, ...] = ()
    #: Its workload's locality where outbound config depends on it (DNS clusters), else "".
    outbound_locality: str = ""

    @property
    def id(self) -> str:
        return self.node.id

    @property
    def type(self) -> ProxyType:
        return self.node.type

    @property
    def ip(self) -> str:
        return self.node.ip

    @property
    def namespace(self) -> str:
        return self.node.namespace

    @property
    def interception(self) -> InterceptionMode:
        return self.node.interception

    @property
    def locality(self) -> str:
        """Its workload's locality, as the registry knows it ("" when none)."""
        return _locality(self.instances)

    @property
    def instance_ports(self) -> frozenset[int]:
        """The ports its workload's app listens on as an endpoint of its services."""
        return frozenset(p for i in self.instances for p in i.endpoint.ports.values())

    def generation_key(self) -> tuple[object, ...]:
        """Everything about the proxy that generation reads: proxies with equal keys get the
        same config from the same snapshot. It is the key of the proxy's inbound config and of
        its whole view; the outbound part, most of the config, has the coarser `outbound_key`.

        The replicas of one service (same labels, same ports) share a key, as long as their own
        address appears nowhere in their config: it does with iptables (Istio's listeners per
        endpoint) and where a Sidecar ingress listener binds it; otherwise only its family
        (IPv4 or IPv6, for DNS lookups) counts.
        """
        inbound = tuple(
            sorted(
                (i.service.hostname, tuple(sorted(i.endpoint.ports.items())), i.endpoint.locality)
                for i in self.instances
            )
        )
        return (
            self.node.type,
            self.node.namespace,
            self.node.domain,
            tuple(sorted(self.labels.items())),
            self.node.interception,
            self.node.ip if self.address_in_config else _family(self.node.ip),
            inbound,
            self.node.mesh_certificates,
        )

    def outbound_key(self) -> tuple[object, ...]:
        """What outbound generation (the clusters, listeners and routes for the services the
        proxy calls) reads of the proxy: far less than `generation_key`, so a whole namespace of
        VMs serving different services usually shares one outbound config.

        - labels only through the selectors they match (Sidecar and DestinationRule workload
          selectors, Gateways, VirtualService `sourceLabels`), not their values;
        - of its workload: the ports its app listens on (a proxy without iptables binds no
          outbound listener there) and, when the mesh has DNS clusters, its locality (their
          inline endpoints get locality priorities);
        - its address only when traffic is redirected (listeners per endpoint skip its own),
          else only its family.
        """
        app_ports = tuple(sorted(self.instance_ports))
        redirected = self.node.interception is not InterceptionMode.NONE
        return (
            self.node.type,
            self.node.namespace,
            self.node.domain,
            self.selectors,
            self.node.interception,
            self.node.ip if redirected else _family(self.node.ip),
            self.outbound_locality,
            app_ports,
            self.node.mesh_certificates,
        )


def _locality(instances: tuple[ServiceInstance, ...]) -> str:
    return next((i.endpoint.locality for i in instances if i.endpoint.locality), "")


def _family(ip: str) -> str:
    return "v6" if ":" in ip else "v4"


def bind_proxy(node: ProxyNode, snapshot: Snapshot) -> Proxy:
    """Bind `node` to its workload in `snapshot`: labels come from the workload, overlaid by the
    node's own `LABELS` metadata (what the node says about itself wins) unless it is attested,
    when they come from the workload alone and only its own namespace's endpoints count."""
    labels: dict[str, str] = {}
    workload = ""
    entry = _workload_entry(node, snapshot)
    if entry is not None:
        labels.update(entry.labels)
        labels.update(spec(entry).labels)
        workload = f"{entry.namespace}/{entry.name}"
    instances = []
    for service, ep in snapshot.index.endpoints_at(node.ip):
        if entry is not None and ep.name and (ep.namespace, ep.name) != (entry.namespace, entry.name):
            continue
        if node.attested and ep.namespace != node.namespace:
            continue
        instances.append(ServiceInstance(service, ep))
        if entry is None:
            labels = {**ep.labels, **labels}
            workload = workload or (f"{ep.namespace}/{ep.name}" if ep.name else ep.address)
    if not node.attested:
        labels.update(node.labels)
    address_in_config = node.interception is not InterceptionMode.NONE or _any_sidecar_ingress(snapshot)
    index = snapshot.index
    tested = index.label_selectors()
    if node.type is ProxyType.ROUTER:
        tested = (*tested, *index.policy_selectors())
    selectors = tuple(s for s in tested if all(labels.get(k) == v for k, v in s))
    locality = _locality(tuple(instances))
    return Proxy(
        node,
        MappingProxyType(labels),
        workload,
        tuple(instances),
        address_in_config,
        selectors,
        locality if index.has_dns_services else "",
    )


def _any_sidecar_ingress(snapshot: Snapshot) -> bool:
    return any(spec(c).ingress for c in snapshot.of_kind("Sidecar"))


def _workload_entry(node: ProxyNode, snapshot: Snapshot) -> Any:
    named = snapshot.get("WorkloadEntry", node.namespace, node.name)
    return named if named is not None else snapshot.index.workload_entry_at(node.namespace, node.ip)
