"""CDS, inbound: a sidecar's clusters to its own workload, named and defaulted as istiod does.

`inbound|PORT||` for each port the proxy's workload serves (the endpoint port of each service
it is an instance of): STATIC to 127.0.0.1:PORT, since the application on a VM listens on
localhost. A Sidecar with `ingress` listeners replaces them all with one per listener, to its
`defaultEndpoint` (`127.0.0.1:P`, `0.0.0.0:P` for the proxy's IP, `unix://path`; none means
ORIGINAL_DST), as Istio does without ENABLE_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE: a service
port it does not list is served by the passthrough cluster when traffic is redirected, and by
nothing without iptables (the app takes it directly). Istio builds no
inbound clusters in NONE interception without a Sidecar; meshctl does, because its VM default
is NONE with inbound listeners on the workload's address. Only the connection pool of a
traffic policy applies inbound (the DestinationRule's, overridden by the Sidecar's).

`InboundPassthroughCluster` is added when traffic is intercepted (REDIRECT/TPROXY); a router has
no inbound clusters. Metadata is Istio's, as outbound (`clusters.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.registry.model import Protocol, Service, ServicePort
from meshctl.snapshot.interception import InterceptionMode
from meshctl.snapshot.model import spec
from meshctl.snapshot.node import ProxyType
from meshctl.xds import names
from meshctl.xds.cluster_common import (
    delimited_stats,
    istio_metadata,
    merge_clusters,
    passthrough_cluster,
    service_metadata,
)
from meshctl.xds.cluster_policy import (
    ClusterDraft,
    apply_connection_pool,
    apply_upstream_protocol,
    policy_for_port,
    traffic_policy,
)
from meshctl.xds.endpoints import socket_address
from meshctl.xds.inbound_view import InboundView
from meshctl.xds.jwks_cluster import jwks_clusters

_Cluster = cluster_pb2.Cluster

#: Source address for traffic sent back into the workload, which iptables lets through.
INBOUND_PASSTHROUGH_BIND: Final = "127.0.0.6"
#: Istio's "never" for inbound ORIGINAL_DST cleanup: the largest duration Envoy accepts.
_NEVER_SECONDS: Final = 9223372035


def build_inbound_clusters(view: InboundView) -> list[cluster_pb2.Cluster]:
    """A sidecar's clusters to its own workload (`inbound|PORT||`, InboundPassthroughCluster)."""
    proxy = view.proxy.value
    if proxy.type is not ProxyType.SIDECAR:
        return []
    out = _inbound(view)
    out.extend(jwks_clusters(view.jwt_rules, family=proxy.family, connect_timeout=view.mesh.connect_timeout_seconds))
    if proxy.interception is not InterceptionMode.NONE:
        timeout = view.mesh.connect_timeout_seconds
        inbound = passthrough_cluster(names.INBOUND_PASSTHROUGH_CLUSTER, timeout)
        inbound.upstream_bind_config.source_address.address = INBOUND_PASSTHROUGH_BIND
        inbound.upstream_bind_config.source_address.port_value = 0
        out.append(inbound)
    return merge_clusters(delimited_stats(out))


@dataclass(frozen=True, slots=True)
class _Target:
    """A service port of the proxy's workload, and the endpoint port it is served on."""

    service: Service
    port: ServicePort
    endpoint_port: int


def _targets(view: InboundView) -> dict[int, list[_Target]]:
    by_port: dict[int, list[_Target]] = {}
    for instance in view.proxy.value.instances:
        for number, endpoint_port in sorted(instance.endpoint.ports.items()):
            port = instance.service.port(number)
            if port is None or endpoint_port == 0 or port.protocol is Protocol.UDP:
                continue
            by_port.setdefault(endpoint_port, []).append(_Target(instance.service, port, endpoint_port))
    return by_port


def _inbound(view: InboundView) -> list[cluster_pb2.Cluster]:
    sidecar = view.sidecar_config
    ingress = list(spec(sidecar).ingress) if sidecar is not None else []
    by_port = _targets(view)
    out = []
    # Istio's buildInboundClusters: a Sidecar with ingress listeners declares every inbound
    # cluster (the services' other ports go to the passthrough cluster, as their listeners do).
    for endpoint_port in () if ingress else sorted(by_port):
        targets = by_port[endpoint_port]
        local = (names.LOCALHOST, endpoint_port)
        out.append(_inbound_cluster(view, endpoint_port, local, targets[0].port.protocol, targets))
    for listener in ingress:
        try:
            endpoint = _default_endpoint(listener.default_endpoint, view.proxy.value.ip)
        except ValueError:
            continue  # validation reports it; Istio skips the listener's cluster too
        number = listener.port.number
        protocol = Protocol.parse(listener.port.protocol) if listener.port.protocol else Protocol.TCP
        out.append(_inbound_cluster(view, number, endpoint, protocol, by_port.get(number, [])))
    return out


def _default_endpoint(text: str, proxy_ip: str) -> tuple[str, int] | None:
    """A Sidecar ingress `defaultEndpoint` as (address, port): port 0 for a unix socket, None
    for none (ORIGINAL_DST); ValueError when it does not parse."""
    if not text:
        return None
    if text.startswith("unix://"):
        return text.removeprefix("unix://"), 0
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(text)
    host = host.strip("[]")
    if host in ("0.0.0.0", "::"):
        host = proxy_ip
    return host, int(port_text)


def _inbound_cluster(
    view: InboundView,
    cluster_port: int,
    endpoint: tuple[str, int] | None,
    protocol: Protocol,
    targets: Sequence[_Target],
) -> cluster_pb2.Cluster:
    name = names.inbound_cluster(cluster_port)
    cluster = _Cluster(name=name)
    cluster.common_lb_config.SetInParent()
    if endpoint is None:
        cluster.type = _Cluster.ORIGINAL_DST
        cluster.cleanup_interval.seconds = _NEVER_SECONDS
    else:
        cluster.type = _Cluster.STATIC
        cluster.load_assignment.cluster_name = name
        group = cluster.load_assignment.endpoints.add()
        group.lb_endpoints.add().endpoint.address.CopyFrom(socket_address(*endpoint))
    draft = ClusterDraft(cluster)
    apply_upstream_protocol(draft, protocol)
    if targets:
        hosts: dict[str, Service] = {}
        for t in targets:
            hosts.setdefault(t.service.hostname, t.service)
        istio_metadata(cluster).update({"services": [service_metadata(s) for s in hosts.values()]})
    pool = None
    if targets:
        found = view.destination_rule(targets[0].service.hostname)
        rule_policy = traffic_policy(found.rule.value.spec) if found is not None else None
        if found is not None and rule_policy is not None:
            policy = policy_for_port(rule_policy, targets[0].port.number)
            pool = policy.connection_pool if policy is not None else None
            istio_metadata(cluster).update({"config": found.path})
    pool = _sidecar_pool(view, cluster_port) or pool
    apply_connection_pool(draft, pool, view.mesh.connect_timeout_seconds)
    if cluster.type == _Cluster.ORIGINAL_DST:
        cluster.lb_policy = _Cluster.CLUSTER_PROVIDED
    intercepted = view.proxy.value.interception is not InterceptionMode.NONE
    if intercepted and endpoint is not None and endpoint[1] != 0 and endpoint[0] not in (names.LOCALHOST, "::1"):
        # Traffic to the workload's own address would be captured again without this source.
        cluster.upstream_bind_config.source_address.address = INBOUND_PASSTHROUGH_BIND
        cluster.upstream_bind_config.source_address.port_value = 0
    return draft.finish()


def _sidecar_pool(view: InboundView, port: int) -> dr_pb2.ConnectionPoolSettings | None:
    """The Sidecar's connection pool for an inbound port: the ingress listener's, else the
    Sidecar-wide `inboundConnectionPool` (Istio's InboundConnectionPoolForPort)."""
    sidecar = view.sidecar_config
    if sidecar is None:
        return None
    sidecar_spec = spec(sidecar)
    pool: dr_pb2.ConnectionPoolSettings
    for listener in sidecar_spec.ingress:
        if listener.port.number == port and listener.HasField("connection_pool"):
            pool = listener.connection_pool
            return pool
    if sidecar_spec.HasField("inbound_connection_pool"):
        pool = sidecar_spec.inbound_connection_pool
        return pool
    return None
