"""The gRPC generator family: what a proxyless gRPC node (`GENERATOR: grpc`) is served, and that
the server serves it what `meshctl dump --grpc` prints, pushing only the names it asked for."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.service.discovery.v3 import discovery_pb2

from meshctl.server.cache import ResourceCache
from meshctl.server.subscription import SotwSubscription
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate
from meshctl.xds.grpc_gen import generate_grpc, grpc_notes
from meshctl.xds.resources import to_resource

GRPC = {"GENERATOR": "grpc"}
CLIENT = "sidecar~10.0.0.9~client.shop~shop.svc.cluster.local"

MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  resolution: STATIC
  workloadSelector: {labels: {app: echo}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v1, namespace: shop}
spec: {address: 10.0.0.2, labels: {app: echo, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: other, namespace: shop}
spec:
  hosts: [other.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 8080, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.3}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: shop}
spec:
  host: echo.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-user}}
  subsets: [{name: v1, labels: {version: v1}}]
"""

VS = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.svc.cluster.local]
  http:
  - route: [{destination: {host: echo.shop.svc.cluster.local, subset: v1}}]
    timeout: 3s
    retries: {attempts: 4, retryOn: "connect-failure,unavailable,5xx,cancelled"}
"""


def other_vs(timeout: str) -> str:
    return f"""
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: other, namespace: shop}}
spec:
  hosts: [other.shop.mesh]
  http:
  - route: [{{destination: {{host: other.shop.mesh}}}}]
    timeout: {timeout}
"""


def by_name(messages: tuple[object, ...]) -> dict[str, object]:
    return {m.name: m for m in messages}  # type: ignore[attr-defined]


def test_listeners_answer_every_name_the_service_is_dialed_by() -> None:
    snapshot = snapshot_from_yaml(MESH + VS)
    listeners = by_name(generate_grpc(snapshot, proxy_for(snapshot, CLIENT, GRPC))[types.LISTENER])
    # Istio's expansion from the client's namespace: short name, name.namespace, name.namespace.svc
    for dialed in ("echo:7070", "echo.shop:7070", "echo.shop.svc:7070", "echo.shop.svc.cluster.local:7070"):
        listener = listeners[dialed]
        assert isinstance(listener, listener_pb2.Listener)
        hcm = hcm_pb2.HttpConnectionManager()
        assert listener.api_listener.api_listener.Unpack(hcm)
        assert hcm.rds.route_config_name == "outbound|7070||echo.shop.svc.cluster.local"
        assert hcm.rds.config_source.HasField("ads")
        assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.fault", "envoy.filters.http.router"]
    assert "other.shop.mesh:8080" in listeners


TWO_PORTS = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: multi, namespace: shop}
spec:
  hosts: [multi.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 8081, name: grpc-a, protocol: GRPC}, {number: 8082, name: grpc-b, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.4}]
"""


def test_a_one_port_service_answers_its_names_without_the_port_too() -> None:
    snapshot = snapshot_from_yaml(MESH + VS + TWO_PORTS)
    config = generate_grpc(snapshot, proxy_for(snapshot, CLIENT, GRPC))
    listeners = by_name(config[types.LISTENER])
    echo, other = "outbound|7070||echo.shop.svc.cluster.local", "outbound|8080||other.shop.mesh"
    for dialed, route in (("echo", echo), ("echo.shop", echo), ("echo.shop.svc.cluster.local", echo),
                          ("other.shop.mesh", other)):  # fmt: skip
        hcm = hcm_pb2.HttpConnectionManager()
        assert listeners[dialed].api_listener.api_listener.Unpack(hcm)  # type: ignore[attr-defined]
        assert hcm.rds.route_config_name == route
    # gRPC matches the authority as dialed: the route config answers the bare names too.
    routes = by_name(config[types.ROUTE])
    assert "other.shop.mesh" in routes["outbound|8080||other.shop.mesh"].virtual_hosts[0].domains  # type: ignore[attr-defined]
    # Two ports: a name without one could mean either, so only the ported names are served.
    assert "multi.shop.mesh" not in listeners
    assert {"multi.shop.mesh:8081", "multi.shop.mesh:8082"} <= set(listeners)


def test_route_config_holds_one_host_with_grpc_timeouts_and_retries() -> None:
    snapshot = snapshot_from_yaml(MESH + VS)
    proxy = proxy_for(snapshot, CLIENT, GRPC)
    routes = by_name(generate_grpc(snapshot, proxy)[types.ROUTE])
    config = routes["outbound|7070||echo.shop.svc.cluster.local"]
    assert isinstance(config, route_pb2.RouteConfiguration)
    [vh] = config.virtual_hosts
    assert "echo:7070" in vh.domains and "echo.shop.svc.cluster.local:7070" in vh.domains
    [route] = vh.routes
    assert route.route.cluster == "outbound|7070|v1|echo.shop.svc.cluster.local"
    assert route.route.max_stream_duration.max_stream_duration.seconds == 3
    assert route.route.retry_policy.retry_on == "unavailable,cancelled"
    assert route.route.retry_policy.num_retries.value == 4
    assert any("connect-failure" in n and "5xx" in n for n in grpc_notes(snapshot, proxy))


def test_clusters_use_balancers_grpc_has_and_endpoints_carry_locality_and_weight() -> None:
    snapshot = snapshot_from_yaml(MESH + VS)
    generated = generate_grpc(snapshot, proxy_for(snapshot, CLIENT, GRPC))
    clusters = by_name(generated[types.CLUSTER])
    assert set(clusters) == {
        "outbound|7070||echo.shop.svc.cluster.local",
        "outbound|7070|v1|echo.shop.svc.cluster.local",
        "outbound|8080||other.shop.mesh",
    }
    policies = {n: c.lb_policy for n, c in clusters.items()}  # type: ignore[attr-defined]
    assert policies["outbound|8080||other.shop.mesh"] == cluster_pb2.Cluster.ROUND_ROBIN  # Envoy's: LEAST_REQUEST
    assert policies["outbound|7070|v1|echo.shop.svc.cluster.local"] == cluster_pb2.Cluster.RING_HASH
    assert not any(c.HasField("transport_socket") for c in clusters.values())  # type: ignore[attr-defined]
    for assignment in generated[types.ENDPOINT]:
        for group in assignment.endpoints:  # type: ignore[attr-defined]
            assert group.HasField("locality") and group.load_balancing_weight.value >= 1


def test_server_serves_a_grpc_node_what_dump_prints_and_envoys_what_they_had() -> None:
    snapshot = snapshot_from_yaml(MESH + VS)
    cache = ResourceCache()
    grpc_proxy = proxy_for(snapshot, CLIENT, GRPC)
    envoy_proxy = proxy_for(snapshot, CLIENT)
    grpc_view = cache.resources(snapshot, grpc_proxy)
    envoy_view = cache.resources(snapshot, envoy_proxy)
    pairs = ((generate_grpc(snapshot, grpc_proxy), grpc_view), (generate(snapshot, envoy_proxy), envoy_view))
    for generated, view in pairs:
        for type_url, messages in generated.items():
            expected = sorted((r.name, r.body) for r in (to_resource(m, type_url) for m in messages))
            assert sorted((r.name, r.body) for r in view.of(type_url).values()) == expected, type_url


def _request(sub: SotwSubscription, names: list[str]) -> discovery_pb2.DiscoveryRequest:
    return discovery_pb2.DiscoveryRequest(
        type_url=sub.type_url,
        resource_names=names,
        version_info=sub.sent_version or "",
        response_nonce=sub.sent_nonce or "",
    )


def test_a_change_to_another_service_pushes_nothing_to_a_grpc_client() -> None:
    cache = ResourceCache()
    before = snapshot_from_yaml(MESH + VS + other_vs("1s"))
    after_other = snapshot_from_yaml(MESH + VS + other_vs("2s"))
    after_echo = snapshot_from_yaml(MESH + VS.replace("timeout: 3s", "timeout: 5s") + other_vs("2s"))
    route = "outbound|7070||echo.shop.svc.cluster.local"
    subs = {
        types.LISTENER: (SotwSubscription(types.LISTENER, wildcard_when_empty=True), ["echo:7070"]),
        types.ROUTE: (SotwSubscription(types.ROUTE, wildcard_when_empty=False, partial=True), [route]),
    }

    def pushes(snapshot: object) -> dict[str, int]:
        view = cache.resolve(proxy_for(snapshot, CLIENT, GRPC).node, snapshot).resources  # type: ignore[arg-type]
        out = {}
        for type_url, (sub, names) in subs.items():
            push = sub.next_push(view.of(type_url))
            out[type_url] = len(push.resources) if push is not None else 0
            sub.handle(_request(sub, names))  # the ACK
        return out

    for sub, names in subs.values():
        sub.handle(_request(sub, names))
    assert pushes(before) == {types.LISTENER: 1, types.ROUTE: 1}
    assert pushes(after_other) == {types.LISTENER: 0, types.ROUTE: 0}
    assert pushes(after_echo) == {types.LISTENER: 0, types.ROUTE: 1}
