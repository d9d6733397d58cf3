"""RDS generation: VirtualService features as Istio translates them, for sidecars and gateways.

Golden cases read `tests/golden/routes/CASE.in.yaml` (the Istio config) and compare the route
configurations generated for one proxy with `CASE.yaml` (refresh with MESHCTL_UPDATE_GOLDEN=1).
Every case is also loaded into one real Envoy (`envoy --mode validate`), so a config Envoy would
NACK fails here. Focused tests pin the defaults users rely on.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import envoy_log_left_open, needs_envoy
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message

from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.loader import LoadOptions, load_text
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import MeshSettings, build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port, validate_resources
from meshctl.testing.golden import assert_golden
from meshctl.xds import types
from meshctl.xds.route_delegate import merge_matches
from meshctl.xds.route_domains import NO_PORT, alt_hosts
from meshctl.xds.route_gateway import intersect_hosts
from meshctl.xds.route_policy import CORS_FILTER, FAULT_FILTER
from meshctl.xds.routes import build_routes, destination_cluster

GOLDEN = Path(__file__).parent / "golden" / "routes"

CLIENT = "sidecar~10.0.0.99~client.bookinfo~bookinfo.svc.cluster.local"
FRONTEND_LABELS = {"LABELS": {"app": "frontend"}}
INGRESS = "router~10.0.0.50~ingress.istio-system~istio-system.svc.cluster.local"
INGRESS_LABELS = {"LABELS": {"istio": "ingressgateway"}}


@dataclass(frozen=True)
class Case:
    name: str
    node_id: str = CLIENT
    metadata: Mapping[str, Any] = field(default_factory=dict)
    mesh: MeshSettings | None = None


CASES = [
    Case("sidecar_default"),
    Case("registry_only"),
    Case("match_conditions"),
    Case("match_context", metadata=FRONTEND_LABELS),
    Case("destinations"),
    Case("redirect_direct_response"),
    Case("rewrite_timeout_retries"),
    Case("fault_cors_mirror"),
    Case("headers"),
    Case("consistent_hash"),
    Case("delegate"),
    Case("sidecar_hosts"),
    Case("gateway", INGRESS, INGRESS_LABELS),
    Case("gateway_empty", INGRESS, INGRESS_LABELS),
]


def routes_for(
    text: str,
    node_id: str = CLIENT,
    metadata: Mapping[str, Any] | None = None,
    mesh: MeshSettings | None = None,
) -> list[route_pb2.RouteConfiguration]:
    snapshot = snapshot_from_yaml(text, mesh=mesh)
    return build_routes(ProxyScope(snapshot, proxy_for(snapshot, node_id, metadata)))


def case_routes(case: Case) -> list[route_pb2.RouteConfiguration]:
    return routes_for((GOLDEN / f"{case.name}.in.yaml").read_text(), case.node_id, case.metadata, case.mesh)


def by_name(configs: Iterable[route_pb2.RouteConfiguration]) -> dict[str, route_pb2.RouteConfiguration]:
    return {c.name: c for c in configs}


def vhost(config: route_pb2.RouteConfiguration, name: str) -> Any:
    for vh in config.virtual_hosts:
        if vh.name == name:
            return vh
    raise AssertionError(f"no virtual host {name} in {[v.name for v in config.virtual_hosts]}")


def route_named(vh: Any, name: str) -> Any:
    for r in vh.routes:
        if r.name == name:
            return r
    raise AssertionError(f"no route {name} in {[r.name for r in vh.routes]}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden(case: Case) -> None:
    assert_golden(GOLDEN / f"{case.name}.yaml", case_routes(case))


# -- real Envoy --------------------------------------------------------------------------------


def _pack(message: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def _listener(index: int, route_name: str) -> listener_pb2.Listener:
    """A listener whose connection manager names `route_name` by RDS, with the fault and CORS
    filters a real outbound listener carries (the per-route configs are theirs)."""
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=f"rds_{index}",
        rds=hcm_pb2.Rds(route_config_name=route_name, config_source=config_source_pb2.ConfigSource(ads={})),
        http_filters=[
            hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=_pack(fault_pb2.HTTPFault())),
            hcm_pb2.HttpFilter(name=CORS_FILTER, typed_config=_pack(cors_pb2.Cors())),
            hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=_pack(router_pb2.Router())),
        ],
    )
    address = address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address="127.0.0.1", port_value=20000 + index)
    )
    chain = listener_components_pb2.FilterChain(
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager", typed_config=_pack(hcm)
            )
        ]
    )
    return listener_pb2.Listener(name=f"listener_{index}", address=address, filter_chains=[chain])


def _cluster_names(message: Message) -> set[str]:
    """Every cluster a route configuration names (routes, weighted clusters, mirrors)."""
    out: set[str] = set()
    fields = message.ListFields()
    name_field = {"RouteAction": "cluster", "RequestMirrorPolicy": "cluster", "ClusterWeight": "name"}
    wanted = name_field.get(message.DESCRIPTOR.name)
    out.update(str(value) for fd, value in fields if fd.name == wanted)
    for fd, value in fields:
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif fd.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if isinstance(item, Message):
                out |= _cluster_names(item)
    return out


def validate_with_envoy(configs: Iterable[route_pb2.RouteConfiguration]) -> None:
    """Load route configurations into one Envoy, each behind its own RDS listener, with a
    static cluster for every cluster they name (route configs keep their generated content)."""
    configs = list(configs)
    clusters = [_static_cluster(name) for name in sorted(set().union(*(_cluster_names(c) for c in configs)))]
    listeners = [_listener(i, c.name) for i, c in enumerate(configs)]
    validate_resources({types.CLUSTER: clusters, types.LISTENER: listeners, types.ROUTE: configs})


def _static_cluster(name: str, port: int = 0) -> cluster_pb2.Cluster:
    """A cluster for a name routes use: empty, or one endpoint on 127.0.0.1:`port`."""
    out = cluster_pb2.Cluster(
        name=name, type=cluster_pb2.Cluster.STATIC, connect_timeout=duration_pb2.Duration(seconds=1)
    )
    out.load_assignment.cluster_name = name
    if port:
        endpoint = out.load_assignment.endpoints.add().lb_endpoints.add().endpoint
        endpoint.address.socket_address.address = "127.0.0.1"
        endpoint.address.socket_address.port_value = port
    return out


@needs_envoy
def test_every_golden_case_is_accepted_by_envoy() -> None:
    renamed = []
    for case in CASES:
        for config in case_routes(case):
            copy = route_pb2.RouteConfiguration()
            copy.CopyFrom(config)
            copy.name = f"{case.name}/{config.name}"
            renamed.append(copy)
    assert len(renamed) > len(CASES)
    validate_with_envoy(renamed)


@needs_envoy
def test_envoy_rejects_what_istio_would_not_send() -> None:
    """The harness really checks: a duplicate domain across virtual hosts is refused."""
    config = case_routes(Case("sidecar_default"))[0]
    config.virtual_hosts[1].domains.append(config.virtual_hosts[0].domains[0])
    with pytest.raises(Exception, match="domain"):
        validate_with_envoy([config])


# -- focused checks ----------------------------------------------------------------------------

SERVICE = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
"""


def vs(http: str, *, hosts: str = "[reviews.bookinfo.mesh]", name: str = "reviews") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: bookinfo}}
spec:
  hosts: {hosts}
  http:
{http}"""


def only_route(configs: list[route_pb2.RouteConfiguration], port: str = "9080") -> Any:
    config = by_name(configs)[port]
    routes = vhost(config, f"reviews.bookinfo.mesh:{port}").routes
    assert len(routes) == 1
    return routes[0]


def test_default_route_has_istio_retry_policy_and_no_timeout() -> None:
    """BuildDefaultHTTPOutboundRoute with retry.DefaultPolicy: connection-level retries, and no
    status code (EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY): a backend's 503 is the caller's."""
    route = only_route(routes_for(SERVICE))
    assert route.name == "default"
    assert route.route.cluster == "outbound|9080||reviews.bookinfo.mesh"
    assert route.route.timeout.ToTimedelta().total_seconds() == 0
    assert route.route.HasField("timeout"), "0s must be explicit: unset means Envoy's 15 s"
    assert route.route.max_stream_duration.HasField("grpc_timeout_header_max")
    retry = route.route.retry_policy
    assert retry.num_retries.value == 2
    assert retry.retry_on == "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    assert list(retry.retriable_status_codes) == []
    assert [p.name for p in retry.retry_host_predicate] == ["envoy.retry_host_predicates.previous_hosts"]
    assert retry.host_selection_retry_max_attempts == 5
    assert route.decorator.operation == "reviews.bookinfo.mesh:9080/*"


def test_virtual_service_route_without_retries_gets_the_default() -> None:
    """retry.ConvertPolicy(nil): retry.DefaultPolicy, which retries no status code."""
    route = only_route(routes_for(SERVICE + vs("  - route:\n    - destination: {host: reviews.bookinfo.mesh}\n")))
    assert route.route.retry_policy.num_retries.value == 2
    assert route.route.retry_policy.retry_on.startswith("connect-failure,")
    assert not route.route.retry_policy.retriable_status_codes


def test_retries_without_retry_on_keep_the_default_conditions() -> None:
    """retry.ConvertPolicy: attempts and perTryTimeout override the default, whose conditions
    (and empty status codes) stay."""
    http = (
        "  - retries: {attempts: 4, perTryTimeout: 2s}\n    route:\n    - destination: {host: reviews.bookinfo.mesh}\n"
    )
    retry = only_route(routes_for(SERVICE + vs(http))).route.retry_policy
    assert (retry.num_retries.value, retry.per_try_timeout.seconds) == (4, 2)
    assert retry.retry_on == "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    assert not retry.retriable_status_codes


def test_attempts_zero_disables_retries() -> None:
    http = "  - retries: {attempts: 0}\n    route:\n    - destination: {host: reviews.bookinfo.mesh}\n"
    route = only_route(routes_for(SERVICE + vs(http)))
    assert not route.route.HasField("retry_policy")


def test_retry_on_status_codes_only() -> None:
    http = (
        '  - retries: {attempts: 3, retryOn: "503,504"}\n    route:\n    - destination: {host: reviews.bookinfo.mesh}\n'
    )
    retry = only_route(routes_for(SERVICE + vs(http))).route.retry_policy
    assert retry.num_retries.value == 3
    assert retry.retry_on == "retriable-status-codes"
    assert list(retry.retriable_status_codes) == [503, 504]


def test_timeout_is_passed_through() -> None:
    """A timeout is the route's own, for gRPC requests too: any `max_stream_duration` would
    make Envoy ignore it (see set_timeout)."""
    http = "  - timeout: 1.5s\n    route:\n    - destination: {host: reviews.bookinfo.mesh}\n"
    action = only_route(routes_for(SERVICE + vs(http))).route
    assert action.timeout.ToTimedelta().total_seconds() == 1.5
    assert not action.HasField("max_stream_duration")


def test_no_timeout_holds_grpc_requests_to_their_own_deadline() -> None:
    """Without a timeout, `grpc-timeout` headers apply uncapped, as Istio's deprecated
    `max_grpc_timeout: 0s` made them."""
    http = "  - route:\n    - destination: {host: reviews.bookinfo.mesh}\n"
    action = only_route(routes_for(SERVICE + vs(http))).route
    assert action.HasField("timeout") and action.timeout.ToNanoseconds() == 0
    assert action.max_stream_duration.HasField("grpc_timeout_header_max")
    assert action.max_stream_duration.grpc_timeout_header_max.ToNanoseconds() == 0
    assert not action.max_stream_duration.HasField("max_stream_duration")


def test_weighted_split_keeps_weights_and_drops_zero() -> None:
    http = """  - route:
    - destination: {host: reviews.bookinfo.mesh, subset: v1}
      weight: 60
    - destination: {host: reviews.bookinfo.mesh, subset: v2}
      weight: 40
    - destination: {host: reviews.bookinfo.mesh, subset: v3}
      weight: 0
"""
    clusters = only_route(routes_for(SERVICE + vs(http))).route.weighted_clusters.clusters
    assert [(c.name, c.weight.value) for c in clusters] == [
        ("outbound|9080|v1|reviews.bookinfo.mesh", 60),
        ("outbound|9080|v2|reviews.bookinfo.mesh", 40),
    ]
    assert sum(c.weight.value for c in clusters) == 100


def test_derived_redirect_port_is_the_listener_port() -> None:
    http = "  - redirect: {uri: /new, derivePort: FROM_REQUEST_PORT}\n"
    redirect = only_route(routes_for(SERVICE + vs(http))).redirect
    assert (redirect.path_redirect, redirect.port_redirect) == ("/new", 9080)
    http = "  - redirect: {uri: /new, scheme: https, port: 443}\n"
    redirect = only_route(routes_for(SERVICE + vs(http))).redirect
    assert (redirect.scheme_redirect, redirect.port_redirect) == ("https", 0)  # the scheme's default


SOURCE_LABELS = SERVICE + vs(
    """  - name: frontend-only
    match: [{sourceLabels: {app: frontend}}]
    route:
    - destination: {host: reviews.bookinfo.mesh, subset: v2}
"""
)


def test_source_labels_are_evaluated_per_proxy() -> None:
    frontend = only_route(routes_for(SOURCE_LABELS, CLIENT, {"LABELS": {"app": "frontend", "version": "v1"}}))
    assert frontend.name == "frontend-only"
    assert frontend.route.cluster == "outbound|9080|v2|reviews.bookinfo.mesh"
    # For any other proxy no route of the VirtualService applies: the host keeps its default route.
    backend = only_route(routes_for(SOURCE_LABELS, CLIENT, {"LABELS": {"app": "backend"}}))
    assert backend.name == "default"
    assert backend.route.cluster == "outbound|9080||reviews.bookinfo.mesh"


def test_registry_only_answers_502_and_allow_any_passes_through() -> None:
    registry_only = routes_for(SERVICE, mesh=MeshSettings(outbound_traffic_policy="REGISTRY_ONLY"))
    catch_all = by_name(registry_only)["9080"].virtual_hosts[-1]
    assert (catch_all.name, list(catch_all.domains)) == ("block_all", ["*"])
    assert catch_all.routes[0].direct_response.status == 502
    allow_any = by_name(routes_for(SERVICE, metadata={"INTERCEPTION_MODE": "REDIRECT"}))["9080"].virtual_hosts[-1]
    assert allow_any.name == "allow_any"
    assert allow_any.routes[0].route.cluster == "PassthroughCluster"


def test_without_interception_unknown_hosts_get_502_not_a_loop_back_to_envoy() -> None:
    """On a listener bound to 127.0.0.1:9080 the original destination is the listener itself."""
    catch_all = by_name(routes_for(SERVICE))["9080"].virtual_hosts[-1]
    assert catch_all.routes[0].direct_response.status == 502


def test_sidecar_egress_proxy_takes_unknown_hosts() -> None:
    sidecar = """---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: bookinfo}
spec:
  egress:
  - hosts: ["*/*"]
  outboundTrafficPolicy:
    mode: ALLOW_ANY
    egressProxy: {host: egress.istio-system.mesh, port: {number: 8080}, subset: out}
"""
    catch_all = by_name(routes_for(SERVICE + sidecar))["9080"].virtual_hosts[-1]
    assert catch_all.routes[0].route.cluster == "outbound|8080|out|egress.istio-system.mesh"


def test_gateway_host_intersection() -> None:
    assert intersect_hosts(["*.example.com"], ["a.example.com", "b.example.org"]) == ["a.example.com"]
    assert intersect_hosts(["a.example.com", "b.example.com"], ["*.example.com"]) == ["a.example.com", "b.example.com"]
    assert intersect_hosts(["*.example.com"], ["*"]) == ["*.example.com"]
    assert intersect_hosts(["*"], ["*.b.example.com", "*.example.com"]) == ["*.b.example.com", "*.example.com"]
    assert intersect_hosts(["a.example.com"], ["b.example.com"]) == []


def test_gateway_server_host_namespaces() -> None:
    configs = by_name(case_routes(Case("gateway", INGRESS, INGRESS_LABELS)))
    assert set(configs) == {
        "http.80",
        "https.443.https.public.istio-system",
        "https.443.https-admin.public.istio-system",
    }
    # `shop/*.example.com` admits VirtualServices of namespace shop only: other-team's is not bound.
    https = configs["https.443.https.public.istio-system"]
    assert "other" not in {r.name for vh in https.virtual_hosts for r in vh.routes}
    plain = configs["http.80"]
    assert "other" in {r.name for r in vhost(plain, "*.example.com:80").routes}
    # Hosts routed alike share a virtual host, named after the first of them; no domain carries
    # a port (buildGatewayHTTPRouteConfig sets IgnorePortInHostMatching).
    assert list(vhost(plain, "admin.example.com:80").domains) == [
        "admin.example.com",
        "shop.example.com",
        "www.example.com",
    ]
    assert all(c.ignore_port_in_host_matching for c in configs.values())


def test_gateway_catch_all_routes_go_last() -> None:
    admin = vhost(
        by_name(case_routes(Case("gateway", INGRESS, INGRESS_LABELS)))["https.443.https-admin.public.istio-system"],
        "admin.example.com:443",
    )
    assert [r.name for r in admin.routes] == ["other", "health", "api", "web"]


def test_gateway_bind_is_part_of_the_route_name() -> None:
    gateway = """---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: internal, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    bind: 10.0.0.50
    hosts: ["*"]
"""
    assert [c.name for c in routes_for(gateway, INGRESS, INGRESS_LABELS)] == ["http.8080.10.0.0.50"]


def test_destination_cluster_ports() -> None:
    text = (GOLDEN / "destinations.in.yaml").read_text()
    snapshot = snapshot_from_yaml(text)
    scope = ProxyScope(snapshot, proxy_for(snapshot, CLIENT))

    def cluster(**fields: Any) -> str:
        return destination_cluster(scope, vs_pb2.Destination(**fields), 9999, "bookinfo")

    assert cluster(host="ratings") == "outbound|8080||ratings.bookinfo.svc.cluster.local"  # its only port
    assert cluster(host="ratings", port={"number": 7000}) == "outbound|7000||ratings.bookinfo.svc.cluster.local"
    assert cluster(host="reviews", subset="v1") == "outbound|9080|v1|reviews.bookinfo.svc.cluster.local"
    assert cluster(host="api.example.com") == "outbound|9999||api.example.com"  # unknown: the default port


def test_alt_hosts_follow_the_proxy_domain() -> None:
    """GenerateAltVirtualHosts: the absolute FQDN (EnableAbsoluteFqdnVhostDomain), then the short
    forms the proxy's DNS domain resolves, with and without the port (without it for NO_PORT)."""
    host = "reviews.bookinfo.svc.cluster.local"
    assert alt_hosts(host, NO_PORT, "bookinfo.svc.cluster.local") == [
        f"{host}.",
        "reviews",
        "reviews.bookinfo.svc",
        "reviews.bookinfo",
    ]
    assert alt_hosts(host, 9080, "bookinfo.svc.cluster.local") == [
        f"{host}.",
        f"{host}.:9080",
        "reviews",
        "reviews:9080",
        "reviews.bookinfo.svc",
        "reviews.bookinfo.svc:9080",
        "reviews.bookinfo",
        "reviews.bookinfo:9080",
    ]
    assert alt_hosts(host, 9080, "other.svc.cluster.local") == [
        f"{host}.",
        f"{host}.:9080",
        "reviews.bookinfo",
        "reviews.bookinfo:9080",
        "reviews.bookinfo.svc",
        "reviews.bookinfo.svc:9080",
    ]
    assert alt_hosts("reviews.bookinfo.mesh", NO_PORT, "bookinfo.svc.cluster.local") == ["reviews.bookinfo.mesh."]
    assert alt_hosts("db.prod.corp.example", NO_PORT, "prod.corp.example") == ["db.prod.corp.example.", "db"]
    assert alt_hosts("10.1.2.3", NO_PORT, "prod.corp.example") == []
    assert alt_hosts("db.prod.corp.example", 5432, "dev.corp.example") == [
        "db.prod.corp.example.",
        "db.prod.corp.example.:5432",
        "db.prod",
        "db.prod:5432",
        "db.prod.corp",
        "db.prod.corp:5432",
    ]


def test_no_domain_is_given_twice() -> None:
    """An expanded short form that is another service's full name stays with that service."""
    text = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: both, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.svc.cluster.local, reviews.bookinfo]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
"""
    config = by_name(routes_for(text))["9080"]
    domains = [d for vh in config.virtual_hosts for d in vh.domains]
    assert len(domains) == len(set(domains))
    assert "reviews.bookinfo" in vhost(config, "reviews.bookinfo:9080").domains
    assert "reviews.bookinfo" not in vhost(config, "reviews.bookinfo.svc.cluster.local:9080").domains


def test_delegate_matches_must_narrow_the_root() -> None:
    def match(**fields: Any) -> vs_pb2.HTTPMatchRequest:
        return vs_pb2.HTTPMatchRequest(**fields)

    root = [match(uri={"prefix": "/api"}, headers={"x-env": {"exact": "prod"}})]
    merged = merge_matches(root, [match(uri={"prefix": "/api/v2"}), match(method={"exact": "GET"})])
    assert merged is not None
    assert [m.uri.prefix for m in merged] == ["/api/v2", "/api"]
    assert all(m.headers["x-env"].exact == "prod" for m in merged)
    assert merged[1].method.exact == "GET"
    assert merge_matches(root, [match(uri={"prefix": "/other"})]) is None
    assert merge_matches(root, [match(uri={"regex": "/api/.*"})]) is None
    assert merge_matches(root, []) == root


def unvalidated_routes(text: str) -> list[route_pb2.RouteConfiguration]:
    """Routes for config meshctl's validation would refuse, to pin what translation does with it."""
    result = load_text(text, "<test>", LoadOptions(validate=False))
    configs = list(result.configs)
    snapshot = build_snapshot(configs, build_file_model(configs))
    return build_routes(ProxyScope(snapshot, proxy_for(snapshot, CLIENT)))


def test_regex_star_is_a_presence_check_and_unknown_redirect_codes_are_dropped() -> None:
    http = """  - name: teapot
    match: [{uri: {exact: /teapot}}]
    redirect: {uri: /pot, redirectCode: 418}
  - name: star
    match: [{headers: {x-trace: {regex: "*"}}, queryParams: {debug: {regex: "*"}}}]
    route:
    - destination: {host: reviews.bookinfo.mesh}
"""
    routes = vhost(by_name(unvalidated_routes(SERVICE + vs(http)))["9080"], "reviews.bookinfo.mesh:9080").routes
    assert [r.name for r in routes] == ["star"]
    assert routes[0].match.headers[0].present_match
    assert routes[0].match.query_parameters[0].present_match


def test_fault_and_cors_are_keyed_by_their_filter_names() -> None:
    config = by_name(case_routes(Case("fault_cors_mirror")))["8080"]
    api = vhost(config, "api.shop.mesh:8080")
    assert set(route_named(api, "faulty").typed_per_filter_config) == {"envoy.filters.http.fault"}
    assert set(route_named(api, "cors").typed_per_filter_config) == {"envoy.filters.http.cors"}
    assert FAULT_FILTER == "envoy.filters.http.fault" and CORS_FILTER == "envoy.filters.http.cors"


def test_routes_are_sorted_and_deterministic() -> None:
    first = case_routes(Case("gateway", INGRESS, INGRESS_LABELS))
    assert [c.name for c in first] == sorted(c.name for c in first)
    again = case_routes(Case("gateway", INGRESS, INGRESS_LABELS))
    assert [c.SerializeToString(deterministic=True) for c in first] == [
        c.SerializeToString(deterministic=True) for c in again
    ]


# -- real traffic ------------------------------------------------------------------------------

E2E = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  http:
  - name: teapot
    match: [{headers: {x-mode: {exact: teapot}}}]
    directResponse: {status: 418, body: {string: short and stout}}
  - name: moved
    match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: www.example.com}
  - name: broken
    match: [{uri: {prefix: /broken}}]
    fault: {abort: {httpStatus: 555, percentage: {value: 100}}}
    route:
    - destination: {host: reviews.bookinfo.mesh}
  - name: api
    match: [{uri: {prefix: /api/}, ignoreUriCase: true}]
    rewrite: {uri: /v2/}
    headers:
      request: {set: {x-routed-by: meshctl}}
      response: {add: {x-route: api}}
    route:
    - destination: {host: reviews.bookinfo.mesh, subset: v2}
  - name: rest
    route:
    - destination: {host: reviews.bookinfo.mesh}
"""


class _Echo(BaseHTTPRequestHandler):
    """Answers with the path and headers it received and which cluster it stands for (the shared
    test backends name themselves only; these tests need to see rewrites)."""

    def do_GET(self) -> None:
        body = json.dumps(
            {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "upstream": self.server.tag}  # type: ignore[attr-defined]
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _echo_server(tag: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.tag = tag  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _get(port: int, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, Mapping[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"host": "reviews.bookinfo.mesh:9080", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.e2e
@needs_envoy
@envoy_log_left_open
def test_envoy_routes_real_requests() -> None:
    """A real Envoy serving the generated route config answers as the VirtualService says."""
    configs = routes_for(E2E, metadata={"INTERCEPTION_MODE": "REDIRECT"})
    upstreams = {name: _echo_server(name) for name in sorted(set().union(*(_cluster_names(c) for c in configs)))}
    try:
        clusters = [_static_cluster(name, srv.server_port) for name, srv in upstreams.items()]
        port = free_port()
        listener = _listener(0, "9080")
        listener.address.socket_address.port_value = port
        config = bootstrap({types.CLUSTER: clusters, types.LISTENER: [listener], types.ROUTE: configs})
        with EnvoyProcess(config) as envoy:
            assert envoy.admin("ready").strip() == "LIVE"
            status, _, body = _get(port, "/anything", {"x-mode": "teapot"})
            assert (status, body) == (418, b"short and stout")
            status, headers, _ = _get(port, "/old")
            assert (status, headers["location"]) == (301, "http://www.example.com/new")
            status, _, _ = _get(port, "/broken/thing")
            assert status == 555
            status, headers, body = _get(port, "/API/items?x=1")
            seen = json.loads(body)
            assert status == 200 and headers["x-route"] == "api"
            assert seen["path"] == "/v2/items?x=1"
            assert seen["headers"]["x-routed-by"] == "meshctl"
            assert seen["upstream"] == "outbound|9080|v2|reviews.bookinfo.mesh"
            status, _, body = _get(port, "/other")
            assert (status, json.loads(body)["upstream"]) == (200, "outbound|9080||reviews.bookinfo.mesh")
            status, _, body = _get(port, "/other", {"host": "unknown.example.com"})
            assert (status, json.loads(body)["upstream"]) == (200, "PassthroughCluster")
    finally:
        for srv in upstreams.values():
            srv.shutdown()
            srv.server_close()
