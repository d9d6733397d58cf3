"""EDS generation: load assignments from the registry model, shared by every proxy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from meshctl.registry.model import Endpoint, Health, Protocol, Resolution, Service, ServicePort, TlsMode, make_model
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for
from meshctl.testing.envoy import validate_resources
from meshctl.testing.golden import assert_golden
from meshctl.xds import types
from meshctl.xds.clusters import build_clusters
from meshctl.xds.endpoints import build_endpoints, build_load_assignment, subset_labels, workload_label

GOLDEN = Path(__file__).parent / "golden" / "clusters"
WEB = "web.shop.mesh"
CLIENT = "sidecar~10.9.0.1~client.default~default.svc.cluster.local"

WEB_SERVICE = Service(
    WEB, "shop", (ServicePort("http", 80, Protocol.HTTP), ServicePort("tcp", 90, Protocol.TCP)), Resolution.STATIC
)
WEB_ENDPOINTS = (
    Endpoint(
        "10.0.0.1",
        {80: 8080, 90: 9090},
        labels={"app": "web", "version": "v1"},
        locality="us-east/zone-a/rack-1",
        weight=5,
        tls_mode=TlsMode.ISTIO,
        name="web-1",
        namespace="shop",
    ),
    Endpoint(
        "10.0.0.2",
        {80: 80},
        labels={"app.kubernetes.io/name": "storefront", "app.kubernetes.io/version": "2.0", "version": "v2"},
        locality="us-east/zone-a/rack-1",
        health=Health.UNHEALTHY,
        name="web-2",
        namespace="shop",
    ),
    Endpoint(
        "10.0.0.3", {80: 80, 90: 90}, labels={"version": "v1"}, locality="us-west", weight=3, health=Health.DRAINING
    ),
    Endpoint("10.0.0.4", {80: 80, 90: 90}, health=Health.DEGRADED),
    Endpoint("/var/run/web.sock", {80: 0, 90: 0}, labels={"version": "v1"}),
    Endpoint("web.example.com", {80: 80}),
)


def snapshot(rules: str = "", endpoints: Sequence[Endpoint] = WEB_ENDPOINTS) -> Snapshot:
    configs = configs_from_yaml(rules) if rules else []
    return build_snapshot(configs, make_model([WEB_SERVICE], {WEB: endpoints}))


def addresses(cla: endpoint_pb2.ClusterLoadAssignment) -> list[str]:
    out = []
    for group in cla.endpoints:
        for e in group.lb_endpoints:
            address = e.endpoint.address
            out.append(address.pipe.path or f"{address.socket_address.address}:{address.socket_address.port_value}")
    return out


def rule(name: str, namespace: str, labels: str, extra: str = "") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  host: {WEB}
{extra}  subsets: [{{name: v1, labels: {labels}}}]
"""


def test_golden_load_assignments() -> None:
    snap = snapshot(rule("web", "shop", "{version: v1}"))
    scope = ProxyScope(snap, proxy_for(snap, CLIENT))
    clusters = build_clusters(scope)
    endpoints = build_endpoints(scope, clusters)
    assert_golden(GOLDEN / "eds.yaml", endpoints)
    validate_resources({types.CLUSTER: clusters, types.ENDPOINT: endpoints})


def test_ports_come_from_the_registry_and_missing_ports_are_skipped() -> None:
    snap = snapshot()
    assert addresses(build_load_assignment(snap, f"outbound|80||{WEB}")) == [
        "/var/run/web.sock",
        "10.0.0.4:80",
        "10.0.0.1:8080",
        "10.0.0.2:80",
        "10.0.0.3:80",
    ]
    # 10.0.0.2 does not serve 90; the hostname endpoint is for DNS clusters only.
    assert addresses(build_load_assignment(snap, f"outbound|90||{WEB}")) == [
        "/var/run/web.sock",
        "10.0.0.4:90",
        "10.0.0.1:9090",
        "10.0.0.3:90",
    ]


def test_health_is_sent_not_dropped() -> None:
    cla = build_load_assignment(snapshot(), f"outbound|80||{WEB}")
    health = {
        e.endpoint.address.socket_address.address or e.endpoint.address.pipe.path: e.health_status
        for g in cla.endpoints
        for e in g.lb_endpoints
    }
    assert health == {
        "10.0.0.1": health_check_pb2.HEALTHY,
        "10.0.0.2": health_check_pb2.UNHEALTHY,
        "10.0.0.3": health_check_pb2.DRAINING,
        "10.0.0.4": health_check_pb2.DEGRADED,
        "/var/run/web.sock": health_check_pb2.HEALTHY,
    }


def test_weights_and_localities() -> None:
    cla = build_load_assignment(snapshot(), f"outbound|80||{WEB}")
    groups = [
        (
            (g.locality.region, g.locality.zone, g.locality.sub_zone),
            g.HasField("locality"),
            g.load_balancing_weight.value,
            [e.load_balancing_weight.value for e in g.lb_endpoints],
            g.priority,
        )
        for g in cla.endpoints
    ]
    assert groups == [
        (("", "", ""), False, 2, [1, 1], 0),
        (("us-east", "zone-a", "rack-1"), True, 6, [5, 1], 0),
        (("us-west", "", ""), True, 3, [3], 0),
    ]


def test_metadata_for_transport_socket_and_telemetry() -> None:
    cla = build_load_assignment(snapshot(), f"outbound|80||{WEB}")
    by_address = {e.endpoint.address.socket_address.address: e for g in cla.endpoints for e in g.lb_endpoints}
    first = by_address["10.0.0.1"].metadata.filter_metadata
    assert first["envoy.transport_socket_match"]["tlsMode"] == "istio"
    assert first["istio"]["workload"] == "web-1;shop;web;v1;"
    second = by_address["10.0.0.2"].metadata.filter_metadata
    assert "envoy.transport_socket_match" not in second
    assert second["istio"]["workload"] == "web-2;shop;storefront;2.0;"
    assert not by_address["10.0.0.3"].HasField("metadata")


def test_workload_label_falls_back_like_istio() -> None:
    named = Endpoint("10.0.0.9", {}, labels={"service.istio.io/canonical-revision": "latest"}, name="w", namespace="n")
    assert workload_label(named) == "w;n;w;;"


def test_subset_selects_by_labels() -> None:
    snap = snapshot(rule("web", "shop", "{version: v1}"))
    assert addresses(build_load_assignment(snap, f"outbound|80|v1|{WEB}")) == [
        "/var/run/web.sock",
        "10.0.0.1:8080",
        "10.0.0.3:80",
    ]
    # A subset no rule defines selects everything, as in Istio.
    assert len(addresses(build_load_assignment(snap, f"outbound|80|v9|{WEB}"))) == 5


def test_subset_lookup_does_not_depend_on_the_proxy() -> None:
    """The service's namespace wins, then the root namespace, then the others by name."""
    client = rule("client", "default", "{version: v2}")
    root = rule("mesh", "istio-system", "{app: web}")
    home = rule("web", "shop", "{version: v1}")
    assert subset_labels(snapshot(client + root + home), WEB, "v1") == {"version": "v1"}
    assert subset_labels(snapshot(client + root), WEB, "v1") == {"app": "web"}
    assert subset_labels(snapshot(client), WEB, "v1") == {"version": "v2"}
    assert subset_labels(snapshot(client), WEB, "v2") is None


def test_wildcard_and_selector_rules_rank_after_exact_and_plain_ones() -> None:
    wildcard = rule("wide", "shop", "{version: v2}").replace(f"host: {WEB}", 'host: "*.shop.mesh"')
    exact = rule("web", "shop", "{version: v1}").replace("name: web,", "name: zz-web,")
    assert subset_labels(snapshot(wildcard + exact), WEB, "v1") == {"version": "v1"}
    selected = rule("a-selected", "shop", "{version: v2}", "  workloadSelector: {matchLabels: {app: client}}\n")
    assert subset_labels(snapshot(selected + exact), WEB, "v1") == {"version": "v1"}


def test_load_assignments_are_shared_across_proxies() -> None:
    """Proxies in different namespaces, with different rules applying to them, get the same
    bytes for the same cluster name: the server can serialize once."""
    rules = rule("web", "shop", "{version: v1}") + rule("client", "default", "{version: v1}").replace(
        "  subsets", "  trafficPolicy: {loadBalancer: {simple: RANDOM}}\n  subsets"
    )
    snap = snapshot(rules)
    results = []
    for node in (CLIENT, "sidecar~10.9.0.2~other.shop~shop.svc.cluster.local", "router~10.9.0.3~gw.gw~gw.svc"):
        scope = ProxyScope(snap, proxy_for(snap, node))
        results.append(
            {
                c.cluster_name: c.SerializeToString(deterministic=True)
                for c in build_endpoints(scope, build_clusters(scope))
            }
        )
    assert results[0] == results[1] == results[2]
    for name, data in results[0].items():
        assert build_load_assignment(snap, name).SerializeToString(deterministic=True) == data


def test_names_without_eds_get_empty_assignments() -> None:
    snap = snapshot()
    dns = Service("dns.mesh", "shop", (ServicePort("http", 80, Protocol.HTTP),), Resolution.DNS)
    with_dns = build_snapshot(
        [], make_model([WEB_SERVICE, dns], {WEB: WEB_ENDPOINTS, "dns.mesh": [Endpoint("a.mesh", {80: 80})]})
    )
    for s, name in [
        (snap, "inbound|80||"),
        (snap, "BlackHoleCluster"),
        (snap, "outbound|80||missing.mesh"),
        (snap, f"outbound|81||{WEB}"),
        (with_dns, "outbound|80||dns.mesh"),
    ]:
        cla = build_load_assignment(s, name)
        assert cla.cluster_name == name
        assert not cla.endpoints


def test_build_endpoints_covers_eds_clusters_only_sorted() -> None:
    snap = snapshot()
    scope = ProxyScope(snap, proxy_for(snap, CLIENT))
    eds = cluster_pb2.Cluster(name=f"outbound|90||{WEB}", type=cluster_pb2.Cluster.EDS)
    other = cluster_pb2.Cluster(name=f"outbound|80||{WEB}", type=cluster_pb2.Cluster.EDS)
    static = cluster_pb2.Cluster(name="BlackHoleCluster", type=cluster_pb2.Cluster.STATIC)
    out = build_endpoints(scope, [eds, static, other, eds])
    assert [c.cluster_name for c in out] == [f"outbound|80||{WEB}", f"outbound|90||{WEB}"]
