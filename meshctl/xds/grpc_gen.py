"""Proxyless gRPC: the resources a gRPC library's own xDS client is served (Istio's grpcgen).

A node whose metadata says `GENERATOR: grpc` is not an Envoy. Its channel to
`xds:///reviews.shop.mesh:9080` subscribes to the listener named exactly `reviews.shop.mesh:9080`,
follows it to a route configuration, then to clusters and their endpoints, and routes, balances,
retries and injects faults in process (gRFC A27, A28, A31, A33). What it accepts is a narrower
Envoy: a listener is an API listener (no address, no filter chains); an HTTP filter or a per-route
filter config it does not know fails the whole resource; a cluster's balancer must be one it
implements; an endpoint group without a weight is skipped.

The routing decisions are the sidecar's, not a second translation of Istio's YAML: this module
reshapes what the Envoy generators make for the same proxy (`generate_outbound`), so a gRPC client
and an Envoy sidecar in one namespace take the same route for the same request.

- Listeners: one per name a client may dial: every domain of a service's virtual host in the
  sidecar's route config for the port (its full hostname, its short and `name.namespace` forms
  as the proxy's DNS domain expands them, its addresses), each with `:PORT`, and, for a
  service of one port, each without it too (`xds:///reviews.shop.mesh`: there is no other port
  it could mean; a service of several ports must be dialed with one). The subscription
  sends only the names a client asked for, so what a change leaves alone is not sent again.
  Each holds an HCM with the fault filter and the router, and RDS over ADS to
  `outbound|PORT||HOST`.
- Route configurations: `outbound|PORT||HOST` holds that service's virtual host alone, its
  domains with the port (gRPC matches the authority as dialed, port included). A route's
  timeout becomes `max_stream_duration` (gRPC reads no other), its retry conditions keep those
  gRPC implements (`GRPC_RETRY_ON`; none left: no retry policy), and per-route filter configs
  keep the fault filter's alone.
- Clusters: the outbound EDS clusters, and DNS clusters (ServiceEntry resolution DNS) as gRPC's
  LOGICAL_DNS (gRFC A37: the name and port, which gRPC resolves itself), their balancer as gRPC has it (ROUND_ROBIN for
  LEAST_REQUEST, RANDOM and MAGLEV; RING_HASH kept), circuit breakers' `max_requests` and
  outlier detection kept; the mesh's mutual TLS (ISTIO_MUTUAL) through the certificate
  provider `default` (`grpc_upstream_tls`), any other TLS not sent at all, and auto mTLS's
  per-endpoint choice (which gRPC has no way to make) left out, as istiod does. Clusters of other
  types (passthrough, original destination) are left out.
- Listeners of gRPC servers: `grpc_inbound`.
- Endpoints: the shared assignments (or, where a locality rule is in force, the node's
  per-locality variant, as an Envoy of its locality gets: gRPC fails over by priority too), each
  group given a locality (empty if the registry has none) and a weight, which gRPC requires
  (`grpc_assignment`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from meshctl.config.analysis_grpc import GRPC_RETRY_ON
from meshctl.snapshot.binding import outbound_of
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import OutboundProxy, Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import types
from meshctl.xds.cluster_dns import discovery_type
from meshctl.xds.eds_locality import build_variant, eds_localities
from meshctl.xds.endpoints import assignment_view
from meshctl.xds.generate import Generated, generate_outbound, load_assignment
from meshctl.xds.grpc_inbound import build_grpc_inbound
from meshctl.xds.inbound_view import inbound_view
from meshctl.xds.mesh_tls import ROOT_SECRET, WORKLOAD_SECRET
from meshctl.xds.names import eds_cluster_names, outbound_cluster, parse_cluster_name
from meshctl.xds.route_domains import NO_PORT, with_port

_Cluster = cluster_pb2.Cluster

FAULT_FILTER: Final = "envoy.filters.http.fault"
ROUTER_FILTER: Final = "envoy.filters.http.router"
#: The certificate provider instance (in the node's bootstrap) mesh TLS names, as istiod does.
CERTIFICATE_PROVIDER: Final = "default"
#: Envoy balancers gRPC has; the others become ROUND_ROBIN, the one every gRPC has.
_GRPC_LB: Final = frozenset({_Cluster.ROUND_ROBIN, _Cluster.RING_HASH})


def _typed(message: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def grpc_route_name(port: int, host: str) -> str:
    """`outbound|PORT||HOST`: gRPC nodes get a route configuration per service port."""
    return outbound_cluster(port, host)


def grpc_outbound(proxy: Proxy, snapshot: Snapshot) -> OutboundProxy:
    """What a gRPC node's config is generated from: its `OutboundProxy`, with the mesh's
    certificates whatever its xDS connection proved. Its key material never crosses xDS (gRPC
    reads the workload's files through its certificate providers), so the config may use mutual
    TLS as istiod's does for gRPC nodes; a node without the provider rejects such a cluster."""
    return dataclasses.replace(outbound_of(proxy, snapshot), mesh_certificates=True)


def generate_grpc(snapshot: Snapshot, proxy: Proxy) -> Generated:
    """Every resource a gRPC node may be sent, by type URL (what `generate` is for an Envoy):
    what the server offers it and `meshctl dump --grpc` prints."""
    config = build_grpc_config(generate_outbound(snapshot, grpc_outbound(proxy, snapshot)))
    inbound = build_grpc_inbound(inbound_view(ProxyScope(snapshot, proxy)))
    config[types.LISTENER] = tuple(sorted([*config[types.LISTENER], *inbound], key=lambda m: m.name))  # type: ignore[attr-defined]
    names = sorted(eds_cluster_names(config[types.CLUSTER]))
    views = eds_localities(snapshot, proxy, names)
    config[types.ENDPOINT] = tuple(
        grpc_assignment(
            build_variant(assignment_view(snapshot, n), views[n]) if n in views else load_assignment(snapshot, n)
        )
        for n in names
    )
    return config


def grpc_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """What a gRPC node is not sent of its routes because gRPC does not implement it, one note
    per distinct set of dropped retry conditions (Istio's default retries alone drop three)."""
    dropped: dict[tuple[str, ...], list[str]] = {}
    for config in generate_outbound(snapshot, grpc_outbound(proxy, snapshot))[types.ROUTE]:
        assert isinstance(config, route_pb2.RouteConfiguration)
        for vh in config.virtual_hosts:
            for route in vh.routes:
                if route.route.HasField("retry_policy") and (
                    conditions := tuple(dropped_retry_conditions(route.route.retry_policy))
                ):
                    dropped.setdefault(conditions, []).append(vh.name)
    return [
        f"retry conditions {', '.join(conditions)} of {len(hosts)} route(s) ({', '.join(sorted(set(hosts))[:3])}"
        f"{', ...' if len(set(hosts)) > 3 else ''}) are not gRPC's and are left out: gRPC retries only on "
        f"{', '.join(GRPC_RETRY_ON)}"
        for conditions, hosts in sorted(dropped.items())
    ]


def build_grpc_config(envoy: Mapping[str, Iterable[Message]]) -> dict[str, tuple[Message, ...]]:
    """A gRPC node's listeners, routes and clusters from the sidecar config generated for the
    same proxy (`envoy`: Envoy messages by type URL, as `generate_outbound` makes them)."""
    listeners: dict[str, listener_pb2.Listener] = {}
    routes: dict[str, route_pb2.RouteConfiguration] = {}
    hosts = [
        (int(config.name), host, vh)
        for config in envoy.get(types.ROUTE, ())
        if isinstance(config, route_pb2.RouteConfiguration) and config.name.isdigit()  # not gateways' or egress'
        for vh in config.virtual_hosts
        for host, sep, vh_port in [vh.name.rpartition(":")]
        if sep and vh_port == config.name and "*" not in host
    ]
    ports: dict[str, int] = {}
    for _, host, _ in hosts:
        ports[host] = ports.get(host, 0) + 1
    for port, host, vh in hosts:
        name = grpc_route_name(port, host)
        domains = _dialed_names(vh.domains, port)
        if ports[host] == 1:  # one port: dialed without it too (`xds:///host`)
            domains += [d for d in _bare_names(vh.domains) if d not in domains]
        routes[name] = route_pb2.RouteConfiguration(name=name, virtual_hosts=[grpc_virtual_host(vh, domains)])
        for dialed in domains:
            if dialed not in listeners and not dialed.startswith("["):
                listeners[dialed] = api_listener(dialed, name)
    made = (grpc_cluster(c) for c in envoy.get(types.CLUSTER, ()) if _is_outbound(c))
    clusters = [c for c in made if c is not None]
    return {
        types.LISTENER: tuple(listeners[n] for n in sorted(listeners)),
        types.ROUTE: tuple(routes[n] for n in sorted(routes)),
        types.CLUSTER: tuple(sorted(clusters, key=lambda c: c.name)),
    }


def _dialed_names(domains: Iterable[str], port: int) -> list[str]:
    """The names a client dials to reach the virtual host: each domain with `:PORT` (and each
    `:PORT` one as it is), absolute FQDNs (`host.`) left out: gRPC targets do not end in a dot."""
    out: list[str] = []
    for domain in domains:
        if domain == "*" or domain.endswith((".", f".:{port}")):
            continue
        named = domain if domain.endswith(f":{port}") else with_port(domain, port)[-1]
        if named not in out and port != NO_PORT:
            out.append(named)
    return out


def _bare_names(domains: Iterable[str]) -> list[str]:
    """The names a one-port service is dialed by without its port: each domain that has none."""
    return [d for d in domains if d != "*" and not d.endswith(".") and not d.rpartition(":")[2].isdigit()]


def api_listener(name: str, route_name: str) -> listener_pb2.Listener:
    """What a gRPC client resolves `name` to: an HCM with fault injection and the router, and
    its routes over ADS."""
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=name,
        rds=hcm_pb2.Rds(
            route_config_name=route_name,
            config_source=config_source_pb2.ConfigSource(
                ads=config_source_pb2.AggregatedConfigSource(),
                resource_api_version=config_source_pb2.ApiVersion.V3,
            ),
        ),
        http_filters=[
            hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=_typed(fault_pb2.HTTPFault())),
            hcm_pb2.HttpFilter(name=ROUTER_FILTER, typed_config=_typed(router_pb2.Router())),
        ],
    )
    out = listener_pb2.Listener(name=name)
    out.api_listener.api_listener.CopyFrom(_typed(hcm))
    return out


def grpc_virtual_host(vh: rc.VirtualHost, domains: list[str]) -> rc.VirtualHost:
    """The sidecar's virtual host as gRPC reads it: `domains` as dialed, routes reshaped
    (`grpc_route`), and no virtual-host-wide policy gRPC would refuse or ignore."""
    out = rc.VirtualHost(name=vh.name, domains=domains)
    out.routes.extend(grpc_route(r) for r in vh.routes)
    return out


def grpc_route(route: rc.Route) -> rc.Route:
    """One route as gRPC implements it: the match and the cluster choice as they are; the
    timeout as `max_stream_duration`; retries on the gRPC status codes gRPC retries on; of the
    per-route filter configs, only the fault filter's (gRPC refuses a route naming a filter it
    lacks)."""
    out = rc.Route(name=route.name, match=route.match, metadata=route.metadata)
    if route.HasField("route"):
        action = rc.RouteAction()
        src = route.route
        which = src.WhichOneof("cluster_specifier")
        if which == "cluster":
            action.cluster = src.cluster
        elif which == "weighted_clusters":
            for wc in src.weighted_clusters.clusters:
                action.weighted_clusters.clusters.add(name=wc.name, weight=wc.weight)
        action.hash_policy.extend(src.hash_policy)
        if src.HasField("timeout") and (src.timeout.seconds or src.timeout.nanos):
            action.max_stream_duration.max_stream_duration.CopyFrom(src.timeout)
        if src.HasField("retry_policy"):
            retry = _grpc_retry(src.retry_policy)
            if retry is not None:
                action.retry_policy.CopyFrom(retry)
        out.route.CopyFrom(action)
    elif route.HasField("redirect"):
        out.redirect.CopyFrom(route.redirect)  # gRPC fails such calls as UNAVAILABLE
    elif route.HasField("direct_response"):
        out.direct_response.CopyFrom(route.direct_response)
    else:
        out.non_forwarding_action.SetInParent()
    if FAULT_FILTER in route.typed_per_filter_config:
        out.typed_per_filter_config[FAULT_FILTER].CopyFrom(route.typed_per_filter_config[FAULT_FILTER])
    return out


def _grpc_retry(policy: rc.RetryPolicy) -> rc.RetryPolicy | None:
    conditions = [c for c in policy.retry_on.split(",") if c.strip() in GRPC_RETRY_ON]
    if not conditions or not policy.num_retries.value:
        return None
    out = rc.RetryPolicy(retry_on=",".join(c.strip() for c in conditions))
    out.num_retries.CopyFrom(policy.num_retries)
    if policy.HasField("retry_back_off"):
        out.retry_back_off.CopyFrom(policy.retry_back_off)
    return out


def dropped_retry_conditions(policy: rc.RetryPolicy) -> list[str]:
    """The retry conditions of an Envoy route gRPC does not implement (what `dump` notes)."""
    return [c.strip() for c in policy.retry_on.split(",") if c.strip() and c.strip() not in GRPC_RETRY_ON]


def _is_outbound(cluster: Message) -> bool:
    """An outbound cluster of a service gRPC can reach: EDS, or resolved by DNS."""
    assert isinstance(cluster, cluster_pb2.Cluster)
    parsed = parse_cluster_name(cluster.name)
    if parsed is None or parsed.direction != "outbound":
        return False
    return cluster.type == _Cluster.EDS or discovery_type(cluster) in ("STRICT_DNS", "LOGICAL_DNS")


def grpc_cluster(cluster: Message) -> cluster_pb2.Cluster | None:
    """An outbound EDS cluster with what gRPC implements of it; None for one whose TLS gRPC
    cannot do from xDS (a DestinationRule's own certificates: better no cluster, whose calls
    fail, than one that sends in the clear what was meant to be encrypted)."""
    assert isinstance(cluster, cluster_pb2.Cluster)
    if cluster.WhichOneof("cluster_discovery_type") == "type" and cluster.type == _Cluster.EDS:
        out = _Cluster(name=cluster.name, type=_Cluster.EDS)
        out.eds_cluster_config.CopyFrom(cluster.eds_cluster_config)
    else:
        out = _Cluster(name=cluster.name, type=_Cluster.LOGICAL_DNS)
        out.load_assignment.CopyFrom(_logical_dns_target(cluster))
    if cluster.HasField("transport_socket"):
        tls = grpc_upstream_tls(cluster.transport_socket.typed_config)
        if tls is None:
            return None
        out.transport_socket.name = "envoy.transport_sockets.tls"
        out.transport_socket.typed_config.CopyFrom(_typed(tls))
    out.connect_timeout.CopyFrom(cluster.connect_timeout)
    out.metadata.CopyFrom(cluster.metadata)  # which DestinationRule made it, for dump and diff
    if cluster.lb_policy in _GRPC_LB:
        out.lb_policy = cluster.lb_policy
    else:
        out.lb_policy = _Cluster.ROUND_ROBIN
    if cluster.lb_policy == _Cluster.RING_HASH:
        out.ring_hash_lb_config.CopyFrom(cluster.ring_hash_lb_config)
    for threshold in cluster.circuit_breakers.thresholds:
        if threshold.HasField("max_requests"):
            out.circuit_breakers.thresholds.add(priority=threshold.priority, max_requests=threshold.max_requests)
    if cluster.HasField("outlier_detection"):
        out.outlier_detection.CopyFrom(cluster.outlier_detection)
    return out


def _logical_dns_target(cluster: cluster_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    """What gRPC resolves for a DNS cluster (gRFC A37): one locality holding one endpoint, the
    name and port; a ServiceEntry listing several names is reached by its first."""
    out = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster.name)
    first = next((e for group in cluster.load_assignment.endpoints for e in group.lb_endpoints), None)
    if first is not None:
        group = out.endpoints.add()
        group.locality.SetInParent()
        group.load_balancing_weight.value = 1
        endpoint = group.lb_endpoints.add()
        endpoint.endpoint.address.CopyFrom(first.endpoint.address)
        endpoint.load_balancing_weight.value = 1
    return out


def grpc_upstream_tls(typed: any_pb2.Any) -> tls_pb2.UpstreamTlsContext | None:
    """The mesh's mutual TLS (ISTIO_MUTUAL: the workload certificate and the root over SDS) as
    gRPC does it: both from the certificate provider `default` of the node's bootstrap (the
    workload's files, `meshctl bootstrap --grpc --xds-cert-dir`), the server's SPIFFE identities
    checked as the sidecar checks them. None for any other TLS."""
    envoy = tls_pb2.UpstreamTlsContext()
    if not typed.Unpack(envoy):
        return None
    common = envoy.common_tls_context
    combined = common.combined_validation_context
    if [c.name for c in common.tls_certificate_sds_secret_configs] != [WORKLOAD_SECRET] or (
        combined.validation_context_sds_secret_config.name != ROOT_SECRET
    ):
        return None
    out = tls_pb2.UpstreamTlsContext()
    mine = out.common_tls_context
    mine.tls_certificate_provider_instance.instance_name = CERTIFICATE_PROVIDER
    mine.tls_certificate_provider_instance.certificate_name = WORKLOAD_SECRET
    validation = mine.combined_validation_context.default_validation_context
    validation.ca_certificate_provider_instance.instance_name = CERTIFICATE_PROVIDER
    validation.ca_certificate_provider_instance.certificate_name = ROOT_SECRET
    for matcher in combined.default_validation_context.match_typed_subject_alt_names:
        validation.match_subject_alt_names.add().CopyFrom(matcher.matcher)
    return out


def grpc_assignment(assignment: endpoint_pb2.ClusterLoadAssignment) -> endpoint_pb2.ClusterLoadAssignment:
    """An assignment as gRPC takes it: every group with a locality (gRPC keys its balancing by
    locality) and a weight (a group without one is skipped), every endpoint with a weight."""
    out = endpoint_pb2.ClusterLoadAssignment()
    out.CopyFrom(assignment)
    for group in out.endpoints:
        group.locality.SetInParent()
        for endpoint in group.lb_endpoints:
            if not endpoint.load_balancing_weight.value:
                endpoint.load_balancing_weight.value = 1
        if not group.load_balancing_weight.value:
            group.load_balancing_weight.value = max(1, sum(e.load_balancing_weight.value for e in group.lb_endpoints))
    return out
