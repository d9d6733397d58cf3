"""What sidecar and gateway route configurations share: the shape of a route configuration, and
what route generation asks the proxy's scope (VirtualService hosts, destination clusters,
consistent-hash keys). Listeners name the clusters of TCP and TLS routes the same way, with
`destination_cluster`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Final

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from google.protobuf import wrappers_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.hosts import is_short_name
from meshctl.config.model import Config
from meshctl.registry.model import Service, ServicePort
from meshctl.snapshot.model import spec
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.route_actions import ConsistentHash, RouteContext, cluster_for

#: Istio raises Envoy's 4 KiB limit on direct response bodies to what its validation allows.
MAX_DIRECT_RESPONSE_BODY_BYTES: Final = 1024 * 1024


def route_configuration(name: str, virtual_hosts: Sequence[rc.VirtualHost]) -> route_pb2.RouteConfiguration:
    """A route configuration as Istio shapes it (buildSidecarOutboundHTTPRouteConfig,
    buildGatewayHTTPRouteConfig): clusters are not validated (a route may name a cluster that is
    not there yet, or never will be; Envoy answers 503 for it), and the port of the Host header is
    ignored when picking the virtual host (`IgnorePortInHostMatching`: gRPC clients always send
    `host:port`, and a client may reach a service through a port other than the listener's)."""
    return route_pb2.RouteConfiguration(
        name=name,
        virtual_hosts=virtual_hosts,
        validate_clusters=wrappers_pb2.BoolValue(value=False),
        max_direct_response_body_size_bytes=wrappers_pb2.UInt32Value(value=MAX_DIRECT_RESPONSE_BODY_BYTES),
        ignore_port_in_host_matching=True,
    )


def virtual_service_hosts(scope: ProxyScope, vs: Config) -> list[str]:
    """The VirtualService's hosts, lower-cased, with short names standing for the services they
    resolve to in its namespace (a short name that resolves to none stays as written)."""
    out: list[str] = []
    for raw in spec(vs).hosts:
        host = raw.lower()
        expanded = scope.resolve(host, vs.namespace)[1:] if is_short_name(host) else []
        for h in expanded or [host]:
            if h not in out:
                out.append(h)
    return out


def destination_cluster(scope: ProxyScope, destination: vs_pb2.Destination, default_port: int, namespace: str) -> str:
    """The cluster a VirtualService destination (written in `namespace`) names, for this proxy:
    `outbound|PORT|SUBSET|HOST`, the port being the destination's, else the service's only
    port, else `default_port`. TCP and TLS routes name their clusters the same way."""
    host = scope.destination_host(destination.host.lower(), namespace)
    port = destination.port.number if destination.HasField("port") else 0
    return cluster_for(host, destination.subset, port, scope.service(host), default_port)


def _consistent_hash(lb: dr_pb2.LoadBalancerSettings) -> ConsistentHash | None:
    return lb.consistent_hash if lb.WhichOneof("lb_policy") == "consistent_hash" else None


def _port_level_hash(policy: dr_pb2.TrafficPolicy, port: int) -> ConsistentHash | None:
    for setting in policy.port_level_settings:
        if setting.port.number == port:
            return _consistent_hash(setting.load_balancer)
    return None


def destination_hash(scope: ProxyScope, destination: vs_pb2.Destination, host: str) -> ConsistentHash | None:
    """Istio's hashForHTTPDestination: the consistent hash of the subset's port-level policy,
    else the subset's, else the destination's port-level one (only when the destination names
    a port), else the rule's."""
    rule = scope.destination_rule(host)
    if rule is None:
        return None
    policy = rule.spec.traffic_policy
    result = _consistent_hash(policy.load_balancer)
    port = destination.port.number if destination.HasField("port") else 0
    port_hash = _port_level_hash(policy, port) if port else None
    subset_hash = subset_port_hash = None
    subset = rule.subset(destination.subset) if destination.subset else None
    if subset is not None:
        subset_hash = _consistent_hash(subset.traffic_policy.load_balancer)
        subset_port_hash = _port_level_hash(subset.traffic_policy, port) if port else None
    for candidate in (subset_port_hash, subset_hash, port_hash):
        if candidate is not None:
            return candidate
    return result


def service_hash(scope: ProxyScope, host: str, port: int) -> ConsistentHash | None:
    """Istio's hashForService, for a service's default route: the rule's consistent hash,
    replaced by the one of its port-level policy for `port` if that has one."""
    rule = scope.destination_rule(host)
    if rule is None:
        return None
    policy = rule.spec.traffic_policy
    port_hash = _port_level_hash(policy, port)
    return port_hash if port_hash is not None else _consistent_hash(policy.load_balancer)


def route_context(
    scope: ProxyScope,
    listen_port: int,
    gateways: frozenset[str],
    lookup_service: Callable[[str], Service | None] | None = None,
    *,
    is_tls: bool = False,
) -> RouteContext:
    """The context VirtualService routes are translated in for this proxy."""
    return RouteContext(
        listen_port=listen_port,
        gateways=gateways,
        proxy_labels=scope.proxy.labels,
        proxy_namespace=scope.proxy.namespace,
        resolve_host=scope.destination_host,
        lookup_service=lookup_service or scope.service,
        lookup_hash=lambda destination, host: destination_hash(scope, destination, host),
        is_tls=is_tls,
    )


def service_on_port(scope: ProxyScope, port: int) -> Callable[[str], Service | None]:
    """Service lookup as a sidecar's outbound routes on `port` see it (Istio's view for one
    listener): only services with that port, reduced to it. A destination without a port
    therefore goes to the listener's port, whichever ports its service has."""

    def lookup(host: str) -> Service | None:
        svc = scope.service(host)
        if svc is None:
            return None
        own = svc.port(port)
        return _reduced(svc, own) if own is not None else None

    return lookup


#: (id of a service, port number) -> (that service, it reduced to the port). The registry keeps
#: an unchanged service's object across snapshots, so every namespace's routes, in every config
#: version, ask for the same few reductions: made once, they are also the same objects, which
#: the route memo's traces compare at the cost of an identity test.
_REDUCED: dict[tuple[int, int], tuple[Service, Service]] = {}
#: Past this many, the reductions are made anew (services that left are not kept alive).
_REDUCED_KEPT: Final = 1 << 17


def _reduced(svc: Service, own: ServicePort) -> Service:
    key = (id(svc), own.number)
    found = _REDUCED.get(key)
    if found is not None and found[0] is svc:
        return found[1]
    if len(_REDUCED) >= _REDUCED_KEPT:
        _REDUCED.clear()
    reduced = dataclasses.replace(svc, ports=(own,))
    _REDUCED[key] = (svc, reduced)  # holding `svc` keeps its id from being reused while kept
    return reduced
