"""VirtualService `tcp` and `tls` routes as tcp_proxy filters, for sidecars and gateways alike.

Istio's `networkfilter.go` and `tls.go`: one destination becomes a tcp_proxy to its cluster
(stat prefix = the cluster name), several become weighted clusters (stat prefix `NAME.NAMESPACE`
of the VirtualService). A destination without a port uses the service's only port, else the
listener's port. Matches are split into static predicates, decided here for the one proxy
(gateways, source labels, source namespace, port), and runtime predicates that become the filter
chain match (SNI hosts, destination subnets).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2

from meshctl.config.hosts import hosts_overlap
from meshctl.config.labels import labels_match
from meshctl.config.model import Config
from meshctl.config.references import resolve_gateway_name
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.listener_filters import TcpSettings, tcp_proxy_filter
from meshctl.xds.names import outbound_cluster

Filters = list[listener_components_pb2.Filter]


def gateway_refs(refs: Iterable[str], namespace: str) -> set[str]:
    """`gateways` of a VirtualService or match as `namespace/name` (or `mesh`), by Istio's rules
    (`resolve_gateway_name`): the legacy `name.ns.svc.cluster.local` form binds too."""
    return {resolve_gateway_name(ref, namespace) for ref in refs}


def static_match(match: Any, *, scope: ProxyScope, gateways: set[str], port: int, vs_namespace: str) -> bool:
    """The predicates of an L4 or TLS match that one proxy on one port can decide up front
    (Istio's `matchTCP`/`matchTLS`)."""
    wanted = gateway_refs(match.gateways, vs_namespace)
    if wanted and not wanted & gateways:
        return False
    if match.port and match.port != port:
        return False
    if match.source_namespace and match.source_namespace != scope.proxy.namespace:
        return False
    return not match.source_labels or labels_match(match.source_labels, scope.proxy.labels)


def destination_host(scope: ProxyScope, host: str, vs_namespace: str) -> str:
    """A route destination's host with a short name resolved in the VirtualService's namespace."""
    return scope.destination_host(host, vs_namespace)


def destination_cluster(scope: ProxyScope, destination: Any, vs_namespace: str, listener_port: int) -> str:
    """Istio's `GetDestinationCluster`."""
    host = destination_host(scope, destination.host, vs_namespace)
    port = listener_port
    if destination.HasField("port") and destination.port.number:
        port = destination.port.number
    else:
        svc = scope.service(host)
        if svc is not None and len(svc.ports) == 1:
            port = svc.ports[0].number
    return outbound_cluster(port, host, destination.subset)


def tcp_settings(scope: ProxyScope, host: str, subset: str = "") -> TcpSettings:
    """Idle timeout, connection duration and source-IP hashing from the host's DestinationRule."""
    rule = scope.destination_rule(host)
    if rule is None:
        return TcpSettings()
    policy = rule.spec.traffic_policy
    tcp = policy.connection_pool.tcp
    use_source_ip = policy.load_balancer.consistent_hash.use_source_ip
    sub = rule.subset(subset) if subset else None
    if sub is not None and sub.traffic_policy.HasField("load_balancer"):
        lb = sub.traffic_policy.load_balancer
        use_source_ip = lb.HasField("consistent_hash") and lb.consistent_hash.use_source_ip
    return TcpSettings(
        idle_timeout=tcp.idle_timeout if tcp.HasField("idle_timeout") else None,
        max_connection_duration=tcp.max_connection_duration if tcp.HasField("max_connection_duration") else None,
        hash_source_ip=use_source_ip,
    )


def single_destination_filters(scope: ProxyScope, cluster: str, host: str, subset: str = "") -> Filters:
    return [tcp_proxy_filter(cluster, cluster, settings=tcp_settings(scope, host, subset))]


def route_filters(scope: ProxyScope, routes: Sequence[Any], listener_port: int, vs: Config) -> Filters:
    """The tcp_proxy for a route's destinations (Istio's `buildOutboundNetworkFilters`)."""
    first = routes[0].destination
    first_host = destination_host(scope, first.host, vs.namespace)
    if len(routes) == 1:
        cluster = destination_cluster(scope, first, vs.namespace, listener_port)
        return single_destination_filters(scope, cluster, first_host, first.subset)
    weighted = [
        (destination_cluster(scope, r.destination, vs.namespace, listener_port), r.weight)
        for r in routes
        if r.weight > 0
    ]
    if not weighted:
        # Weights left out on every destination: Envoy needs some, so split evenly.
        weighted = [(destination_cluster(scope, r.destination, vs.namespace, listener_port), 1) for r in routes]
    settings = tcp_settings(scope, first_host)
    return [tcp_proxy_filter(f"{vs.name}.{vs.namespace}", weighted=weighted, settings=settings)]


def configs_for_host(scope: ProxyScope, hostname: str, virtual_services: Iterable[Config]) -> list[Config]:
    """The VirtualServices whose hosts cover `hostname` (Istio's `getConfigsForHost`)."""
    return [vs for vs in virtual_services if any(hosts_overlap(h, hostname) for h in scope.resolved_hosts(vs))]


def gateway_hosts_match(server_hosts: Iterable[str], gateway_namespace: str, vs: Config, scope: ProxyScope) -> bool:
    """Whether a VirtualService serves any host of a gateway server (`ns/host`, `./host`,
    `*/host` or `host`), as Istio's `pickMatchingGatewayHosts` decides."""
    vs_hosts = scope.resolved_hosts(vs)
    for entry in server_hosts:
        ns, sep, host = entry.partition("/")
        if not sep:
            ns, host = "*", entry
        if ns == ".":
            ns = gateway_namespace
        if ns not in ("*", vs.namespace):
            continue
        if any(hosts_overlap(host, h) for h in vs_hosts):
            return True
    return False
