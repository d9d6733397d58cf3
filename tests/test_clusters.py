"""CDS generation: golden files per feature (each set also checked by a real Envoy), and
assertions for the behaviours that matter most (names, types, DestinationRule merging)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import proxy_protocol_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.clusters.common.dns.v3 import dns_pb2
from envoy.extensions.clusters.dns.v3 import dns_cluster_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import json_format

from meshctl.registry.model import Endpoint, Protocol, Resolution, Service, ServicePort, make_model
from meshctl.snapshot.model import build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import bootstrap, validate_config
from meshctl.testing.golden import assert_golden
from meshctl.xds import types
from meshctl.xds.cluster_dns import DNS_CLUSTER, discovery_type
from meshctl.xds.cluster_policy import HTTP_PROTOCOL_OPTIONS
from meshctl.xds.clusters import build_clusters
from meshctl.xds.endpoints import build_endpoints

GOLDEN = Path(__file__).parent / "golden" / "clusters"
CLIENT = "sidecar~10.0.0.99~client.default~default.svc.cluster.local"
REVIEWS_V1 = "sidecar~10.0.1.1~reviews-v1.bookinfo~bookinfo.svc.cluster.local"
ROUTER = "router~10.0.9.9~ingress.istio-system~istio-system.svc.cluster.local"
#: Certificate paths in fixtures and golden files; swapped for real files before Envoy reads them.
CERTS = "/etc/meshctl/certs"

_C = cluster_pb2.Cluster

REVIEWS = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
  - {number: 9090, name: grpc-api, protocol: GRPC}
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v1, namespace: bookinfo}
spec:
  address: 10.0.1.1
  labels: {app: reviews, version: v1}
  locality: us-east/zone-a
  weight: 2
  ports: {http: 19080}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v2, namespace: bookinfo}
spec:
  address: 10.0.1.2
  labels: {app: reviews, version: v2, security.istio.io/tlsMode: istio}
  locality: us-west/zone-b
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v3, namespace: bookinfo}
spec:
  address: 10.0.1.3
  labels: {app: reviews, version: v3}
  locality: us-west/zone-b
"""

EXTERNAL = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: default}
spec:
  hosts: [db.example.com]
  resolution: DNS
  ports:
  - {number: 5432, name: tcp-postgres, protocol: TCP}
  - {number: 5353, name: udp-dns, protocol: UDP}
  endpoints:
  - {address: east.db.example.com, locality: us-east/zone-a, labels: {site: east}}
  - {address: west.db.example.com, locality: us-west/zone-b, weight: 3, labels: {site: west}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: default}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 80, name: http, protocol: HTTP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: default}
spec:
  hosts: [legacy.example.com]
  resolution: DNS_ROUND_ROBIN
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: lb.legacy.example.com, ports: {http: 18080}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: anything, namespace: default}
spec:
  hosts: [anything.internal]
  addresses: [10.20.0.0/16]
  resolution: NONE
  ports: [{number: 7000, name: tcp, protocol: TCP}]
"""


# -- helpers -------------------------------------------------------------------------------


def generate(
    text: str, node_id: str = CLIENT, metadata: Mapping[str, Any] | None = None
) -> tuple[list[cluster_pb2.Cluster], list[endpoint_pb2.ClusterLoadAssignment]]:
    snapshot = snapshot_from_yaml(text)
    scope = ProxyScope(snapshot, proxy_for(snapshot, node_id, metadata))
    clusters = build_clusters(scope)
    return clusters, build_endpoints(scope, clusters)


def check(
    name: str,
    clusters: Sequence[cluster_pb2.Cluster],
    endpoints: Sequence[endpoint_pb2.ClusterLoadAssignment],
    certs: Path | None = None,
) -> None:
    """Compare with the golden file, then have Envoy load the very same resources."""
    assert_golden(GOLDEN / f"{name}.yaml", [*clusters, *endpoints])
    config = bootstrap({types.CLUSTER: clusters, types.ENDPOINT: endpoints})
    if certs is not None:
        config = json.loads(json.dumps(config).replace(CERTS, str(certs)))
    validate_config(config)


def named(clusters: Sequence[cluster_pb2.Cluster], name: str) -> cluster_pb2.Cluster:
    found = [c for c in clusters if c.name == name]
    assert found, f"no cluster {name}; have {[c.name for c in clusters]}"
    return found[0]


def http_options(cluster: cluster_pb2.Cluster) -> http_protocol_options_pb2.HttpProtocolOptions:
    options = http_protocol_options_pb2.HttpProtocolOptions()
    assert cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Unpack(options)
    return options


def istio_meta(cluster: cluster_pb2.Cluster) -> dict[str, Any]:
    meta: dict[str, Any] = json_format.MessageToDict(cluster.metadata.filter_metadata["istio"])
    return meta


def dr(name: str, host: str, body: str, namespace: str = "bookinfo") -> str:
    head = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
    head += f"metadata: {{name: {name}, namespace: {namespace}}}\n"
    return f'---\n{head}spec:\n  host: "{host}"\n{body}'


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate, its key, and itself as CA: enough for Envoy to load the files."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make test certificates")
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem")),
            *("-days", "2", "-subj", "/CN=meshctl-test"),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copy(directory / "cert.pem", directory / "ca.pem")
    return directory


# -- golden files ---------------------------------------------------------------------------


def test_golden_static_service() -> None:
    clusters, endpoints = generate(REVIEWS)
    check("static", clusters, endpoints)


def test_golden_resolutions() -> None:
    clusters, endpoints = generate(EXTERNAL)
    check("resolutions", clusters, endpoints)


def test_golden_router() -> None:
    sidecar = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: istio-system}
spec:
  egress: [{hosts: ["./*"]}]
"""
    clusters, endpoints = generate(REVIEWS + "---" + EXTERNAL + sidecar, ROUTER)
    check("router", clusters, endpoints)


SUBSETS = dr(
    "reviews",
    "reviews.bookinfo.mesh",
    """  trafficPolicy:
    connectionPool: {tcp: {maxConnections: 100}}
    outlierDetection: {consecutive5xxErrors: 7}
    loadBalancer: {simple: ROUND_ROBIN}
    portLevelSettings:
    - port: {number: 9090}
      loadBalancer: {simple: RANDOM}
  subsets:
  - name: v1
    labels: {version: v1}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      loadBalancer: {simple: LEAST_REQUEST}
      connectionPool: {http: {http1MaxPendingRequests: 12}}
  - name: v3
    labels: {version: v3}
    trafficPolicy:
      portLevelSettings:
      - port: {number: 9080}
        loadBalancer: {consistentHash: {maglev: {tableSize: 1031}}}
""",
)


def test_golden_subsets() -> None:
    clusters, endpoints = generate(REVIEWS + SUBSETS)
    check("subsets", clusters, endpoints)


CONNECTION_POOL = dr(
    "reviews",
    "reviews.bookinfo.mesh",
    """  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: 10
        connectTimeout: 3s
        tcpKeepalive: {probes: 3, time: 60s, interval: 10s}
        maxConnectionDuration: 1h
        idleTimeout: 30m
      http:
        http1MaxPendingRequests: 11
        http2MaxRequests: 12
        maxRequestsPerConnection: 13
        maxRetries: 14
        idleTimeout: 60s
        maxConcurrentStreams: 15
        http2KeepAlive: {interval: 30s, timeout: 5s}
    retryBudget: {percent: 25, minRetryConcurrency: 4}
""",
) + dr(
    "api",
    "api.example.com",
    """  trafficPolicy:
    connectionPool: {http: {h2UpgradePolicy: UPGRADE, maxConcurrentStreams: 100, http2KeepAlive: {interval: 10s}}}
    portLevelSettings:
    - port: {number: 81}
      connectionPool: {http: {useClientProtocol: true, http2KeepAlive: {interval: 15s, timeout: 3s}}}
""",
    "default",
)

API_TWO_PORTS = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: default}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 81, name: http-alt, protocol: HTTP}]
"""


def test_golden_connection_pool() -> None:
    clusters, endpoints = generate(REVIEWS + API_TWO_PORTS + CONNECTION_POOL)
    check("connection_pool", clusters, endpoints)


LB_SERVICE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: lb, namespace: default}
spec:
  hosts: [lb.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 8001, name: http-1, protocol: HTTP}
  - {number: 8002, name: http-2, protocol: HTTP}
  - {number: 8003, name: http-3, protocol: HTTP}
  - {number: 8004, name: http-4, protocol: HTTP}
  - {number: 8005, name: http-5, protocol: HTTP}
  - {number: 8006, name: http-6, protocol: HTTP}
  - {number: 8007, name: http-7, protocol: HTTP}
  endpoints: [{address: 10.1.0.1}]
"""

LB_RULE = dr(
    "lb",
    "lb.mesh",
    """  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    portLevelSettings:
    - port: {number: 8001}
      loadBalancer: {simple: ROUND_ROBIN, warmupDurationSecs: 30s}
    - port: {number: 8002}
      loadBalancer: {simple: RANDOM}
    - port: {number: 8003}
      loadBalancer: {simple: LEAST_REQUEST, warmup: {duration: 60s, minimumPercent: 10, aggression: 2}}
    - port: {number: 8004}
      loadBalancer: {simple: PASSTHROUGH}
    - port: {number: 8005}
      loadBalancer: {consistentHash: {httpHeaderName: x-user, ringHash: {minimumRingSize: 2048}}}
    - port: {number: 8006}
      loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65537}}}
    - port: {number: 8007}
      loadBalancer: {consistentHash: {httpCookie: {name: session, ttl: 0s}}}
""",
    "default",
)


def test_golden_load_balancer() -> None:
    clusters, endpoints = generate(LB_SERVICE + LB_RULE)
    check("load_balancer", clusters, endpoints)


PRODUCTPAGE = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: productpage, namespace: bookinfo}
spec:
  hosts: [productpage.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: productpage}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: productpage-v1, namespace: bookinfo}
spec:
  address: 10.0.2.1
  labels: {app: productpage}
  locality: us-east/zone-a
"""
PRODUCTPAGE_NODE = "sidecar~10.0.2.1~productpage-v1.bookinfo~bookinfo.svc.cluster.local"

MULTI_REGION_DB = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: bookinfo}
spec:
  hosts: [db.bookinfo.mesh]
  location: MESH_INTERNAL
  resolution: DNS
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  endpoints:
  - {address: a.db.mesh, locality: us-east/zone-a}
  - {address: b.db.mesh, locality: us-east/zone-b}
  - {address: c.db.mesh, locality: us-west/zone-c, weight: 2}
  - {address: d.db.mesh, locality: eu-central/zone-d}
"""

FAILOVER = dr(
    "failover",
    "*.bookinfo.mesh",
    """  trafficPolicy:
    outlierDetection:
      consecutive5xxErrors: 5
      consecutiveGatewayErrors: 3
      interval: 10s
      baseEjectionTime: 30s
      maxEjectionPercent: 50
      minHealthPercent: 20
      splitExternalLocalOriginErrors: true
      consecutiveLocalOriginFailures: 4
    loadBalancer:
      localityLbSetting:
        enabled: true
        failover: [{from: us-east, to: eu-central}]
""",
)


def test_golden_outlier_detection_and_failover() -> None:
    clusters, endpoints = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + FAILOVER, PRODUCTPAGE_NODE)
    check("failover", clusters, endpoints)


DISTRIBUTE = dr(
    "distribute",
    "*.bookinfo.mesh",
    """  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        distribute:
        - from: us-east/*
          to: {"us-east/*": 80, "us-west/*": 20}
""",
)


def test_golden_distribute() -> None:
    clusters, endpoints = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + DISTRIBUTE, PRODUCTPAGE_NODE)
    check("distribute", clusters, endpoints)


TLS_SERVICE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: secure, namespace: default}
spec:
  hosts: [secure.example.com]
  resolution: DNS
  ports:
  - {number: 443, name: http-simple, protocol: HTTP}
  - {number: 8443, name: grpc-mutual, protocol: GRPC}
  - {number: 9443, name: tcp-istio, protocol: TCP}
  - {number: 9444, name: tcp-insecure, protocol: TCP}
  - {number: 9445, name: tcp-plain, protocol: TCP}
"""

TLS_RULE = dr(
    "secure",
    "secure.example.com",
    f"""  trafficPolicy:
    tls: {{mode: DISABLE}}
    portLevelSettings:
    - port: {{number: 443}}
      tls:
        mode: SIMPLE
        sni: secure.example.com
        caCertificates: {CERTS}/ca.pem
        subjectAltNames: [secure.example.com, "spiffe://example.com/ns/default/sa/secure", 10.9.9.9]
    - port: {{number: 8443}}
      tls:
        mode: MUTUAL
        clientCertificate: {CERTS}/cert.pem
        privateKey: {CERTS}/key.pem
        caCertificates: {CERTS}/ca.pem
    - port: {{number: 9443}}
      tls: {{mode: ISTIO_MUTUAL}}
    - port: {{number: 9444}}
      tls: {{mode: SIMPLE, insecureSkipVerify: true}}
""",
    "default",
)


def test_golden_tls(certs: Path) -> None:
    clusters, endpoints = generate(TLS_SERVICE + TLS_RULE)
    check("tls", clusters, endpoints, certs)


INBOUND_SIDECAR = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: bookinfo}
spec:
  workloadSelector: {labels: {app: reviews}}
  inboundConnectionPool: {http: {http1MaxPendingRequests: 3}}
  ingress:
  - port: {number: 9090, protocol: GRPC, name: grpc}
    defaultEndpoint: 0.0.0.0:9091
  - port: {number: 7000, protocol: TCP, name: tcp-socket}
    defaultEndpoint: unix:///var/run/reviews.sock
  - port: {number: 7002, protocol: TCP, name: tcp-local}
    defaultEndpoint: 127.0.0.1:7003
    connectionPool: {tcp: {maxConnections: 7}}
  egress: [{hosts: ["./*"]}]
"""


def test_golden_inbound() -> None:
    clusters, endpoints = generate(
        REVIEWS + "---" + EXTERNAL + INBOUND_SIDECAR, REVIEWS_V1, {"INTERCEPTION_MODE": "REDIRECT"}
    )
    check("inbound", clusters, endpoints)


# -- assertions -----------------------------------------------------------------------------


def test_names_and_types_follow_resolution() -> None:
    clusters, endpoints = generate(REVIEWS + "---" + EXTERNAL)
    kinds = {c.name: discovery_type(c) for c in clusters}
    assert kinds == {
        "BlackHoleCluster": "STATIC",
        "PassthroughCluster": "ORIGINAL_DST",
        "outbound|5432||db.example.com": "STRICT_DNS",
        "outbound|80||api.example.com": "STRICT_DNS",
        "outbound|8080||legacy.example.com": "LOGICAL_DNS",
        "outbound|7000||anything.internal": "ORIGINAL_DST",
        "outbound|9080||reviews.bookinfo.mesh": "EDS",
        "outbound|9090||reviews.bookinfo.mesh": "EDS",
    }
    assert [c.name for c in clusters] == sorted(kinds)
    assert named(clusters, "outbound|7000||anything.internal").lb_policy == _C.CLUSTER_PROVIDED
    assert [e.cluster_name for e in endpoints] == [
        "outbound|9080||reviews.bookinfo.mesh",
        "outbound|9090||reviews.bookinfo.mesh",
    ]
    eds = named(clusters, "outbound|9080||reviews.bookinfo.mesh").eds_cluster_config
    assert eds.service_name == "outbound|9080||reviews.bookinfo.mesh"
    assert eds.eds_config.HasField("ads")


@pytest.mark.parametrize(
    ("node_id", "family"),
    [(CLIENT, dns_pb2.V4_ONLY), ("sidecar~fd00::9~client.default~default.svc.cluster.local", dns_pb2.V6_ONLY)],
)
def test_dns_clusters_use_the_dns_cluster_extension(node_id: str, family: int) -> None:
    """Istio's STRICT_DNS/LOGICAL_DNS settings, on Envoy's DNS cluster extension rather than the
    cluster fields Envoy deprecates (dns_refresh_rate, respect_dns_ttl)."""
    clusters, _ = generate(EXTERNAL, node_id)
    for name, logical in [("outbound|5432||db.example.com", False), ("outbound|8080||legacy.example.com", True)]:
        cluster = named(clusters, name)
        assert cluster.WhichOneof("cluster_discovery_type") == "cluster_type"
        assert cluster.cluster_type.name == DNS_CLUSTER
        config = dns_cluster_pb2.DnsCluster()
        assert cluster.cluster_type.typed_config.Unpack(config)
        assert config.all_addresses_in_single_endpoint is logical
        assert config.dns_refresh_rate.ToSeconds() == 60 and config.respect_dns_ttl
        assert config.dns_lookup_family == family
        assert not cluster.HasField("dns_refresh_rate") and not cluster.respect_dns_ttl
        assert cluster.dns_lookup_family == _C.AUTO, "unset: Envoy reads the extension's family"


def test_dns_clusters_carry_endpoints_inline() -> None:
    clusters, _ = generate(EXTERNAL)
    db = named(clusters, "outbound|5432||db.example.com").load_assignment
    hosts = [
        (e.endpoint.address.socket_address.address, e.load_balancing_weight.value)
        for g in db.endpoints
        for e in g.lb_endpoints
    ]
    assert hosts == [("east.db.example.com", 1), ("west.db.example.com", 3)]
    # No endpoints: Envoy resolves the service's own hostname.
    api = named(clusters, "outbound|80||api.example.com").load_assignment
    address = api.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("api.example.com", 80)
    # LOGICAL_DNS takes the endpoint's own port for the service port.
    legacy = named(clusters, "outbound|8080||legacy.example.com").load_assignment
    assert legacy.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value == 18080
    assert not any(c.name.startswith("outbound|5353|") for c in clusters), "UDP ports get no cluster"


def test_logical_dns_keeps_a_single_endpoint() -> None:
    """Envoy takes one host for LOGICAL_DNS; a registry (Consul) may list more."""
    service = Service(
        "rr.example.com", "default", (ServicePort("http", 80, Protocol.HTTP),), Resolution.DNS_ROUND_ROBIN
    )
    endpoints = [Endpoint("two.example.com", {80: 80}), Endpoint("one.example.com", {80: 8080})]
    snapshot = build_snapshot([], make_model([service], {service.hostname: endpoints}))
    clusters = build_clusters(ProxyScope(snapshot, proxy_for(snapshot)))
    la = named(clusters, "outbound|80||rr.example.com").load_assignment
    (group,) = la.endpoints
    (only,) = group.lb_endpoints
    assert only.endpoint.address.socket_address.address == "one.example.com"
    assert only.endpoint.address.socket_address.port_value == 8080


def test_dns_subset_without_endpoints_is_not_generated() -> None:
    rule = dr(
        "db",
        "db.example.com",
        "  subsets:\n  - {name: east, labels: {site: east}}\n  - {name: north, labels: {site: north}}\n",
        "default",
    )
    clusters, _ = generate(EXTERNAL + rule)
    east = named(clusters, "outbound|5432|east|db.example.com").load_assignment
    assert [e.endpoint.address.socket_address.address for g in east.endpoints for e in g.lb_endpoints] == [
        "east.db.example.com"
    ]
    assert "outbound|5432|north|db.example.com" not in {c.name for c in clusters}


def test_default_circuit_breakers_and_timeout() -> None:
    clusters, _ = generate(REVIEWS)
    cluster = named(clusters, "outbound|9080||reviews.bookinfo.mesh")
    (threshold,) = cluster.circuit_breakers.thresholds
    assert threshold.max_connections.value == threshold.max_requests.value == 4294967295
    assert threshold.max_pending_requests.value == threshold.max_retries.value == 4294967295
    assert threshold.track_remaining
    assert cluster.connect_timeout.ToSeconds() == 10
    assert cluster.lb_policy == _C.LEAST_REQUEST
    assert not cluster.HasField("outlier_detection")
    assert cluster.common_lb_config.HasField("healthy_panic_threshold")
    assert cluster.common_lb_config.healthy_panic_threshold.value == 0


def test_http2_for_grpc_ports_only() -> None:
    clusters, _ = generate(REVIEWS)
    grpc = http_options(named(clusters, "outbound|9090||reviews.bookinfo.mesh"))
    assert grpc.explicit_http_config.HasField("http2_protocol_options")
    assert (
        HTTP_PROTOCOL_OPTIONS
        not in named(clusters, "outbound|9080||reviews.bookinfo.mesh").typed_extension_protocol_options
    )


def test_metadata_names_service_and_rule() -> None:
    clusters, _ = generate(REVIEWS + SUBSETS)
    meta = istio_meta(named(clusters, "outbound|9080|v1|reviews.bookinfo.mesh"))
    assert meta == {
        "config": "/apis/networking.istio.io/v1/namespaces/bookinfo/destination-rule/reviews",
        "default_original_port": 9080,
        "services": [{"host": "reviews.bookinfo.mesh", "name": "reviews.bookinfo.mesh", "namespace": "bookinfo"}],
        "subset": "v1",
    }
    plain = istio_meta(named(generate(REVIEWS)[0], "outbound|9080||reviews.bookinfo.mesh"))
    assert "config" not in plain
    assert istio_meta(named(generate(EXTERNAL)[0], "outbound|80||api.example.com"))["external"] is True


def test_subset_policy_overrides_rule_and_port_level_replaces_it() -> None:
    clusters, _ = generate(REVIEWS + SUBSETS)
    by_name = {c.name: c for c in clusters}
    top = by_name["outbound|9080||reviews.bookinfo.mesh"]
    assert top.lb_policy == _C.ROUND_ROBIN
    assert top.circuit_breakers.thresholds[0].max_connections.value == 100
    assert top.outlier_detection.consecutive_5xx.value == 7
    # The rule's port-level entry replaces its whole policy for that port.
    port_level = by_name["outbound|9090||reviews.bookinfo.mesh"]
    assert port_level.lb_policy == _C.RANDOM
    assert port_level.circuit_breakers.thresholds[0].max_connections.value == 4294967295
    assert not port_level.HasField("outlier_detection")
    # v1 has no policy: the rule's applies.
    v1 = by_name["outbound|9080|v1|reviews.bookinfo.mesh"]
    assert v1.lb_policy == _C.ROUND_ROBIN
    assert v1.circuit_breakers.thresholds[0].max_connections.value == 100
    # v2 overrides the parts it sets; the rest (outlier detection) is inherited.
    v2 = by_name["outbound|9080|v2|reviews.bookinfo.mesh"]
    assert v2.lb_policy == _C.LEAST_REQUEST
    assert v2.circuit_breakers.thresholds[0].max_pending_requests.value == 12
    assert v2.circuit_breakers.thresholds[0].max_connections.value == 4294967295
    assert v2.outlier_detection.consecutive_5xx.value == 7
    # v3's port-level entry replaces every part for 9080; on 9090 the rule's port entry applies.
    v3 = by_name["outbound|9080|v3|reviews.bookinfo.mesh"]
    assert v3.lb_policy == _C.MAGLEV
    assert not v3.HasField("outlier_detection")
    assert v3.circuit_breakers.thresholds[0].max_connections.value == 4294967295
    assert by_name["outbound|9090|v3|reviews.bookinfo.mesh"].lb_policy == _C.RANDOM


def test_connection_pool_settings() -> None:
    clusters, _ = generate(REVIEWS + API_TWO_PORTS + CONNECTION_POOL)
    grpc = named(clusters, "outbound|9090||reviews.bookinfo.mesh")
    t = grpc.circuit_breakers.thresholds[0]
    assert (t.max_connections.value, t.max_pending_requests.value, t.max_requests.value, t.max_retries.value) == (
        10,
        11,
        12,
        14,
    )
    assert grpc.connect_timeout.ToSeconds() == 3
    keepalive = grpc.upstream_connection_options.tcp_keepalive
    assert (keepalive.keepalive_probes.value, keepalive.keepalive_time.value, keepalive.keepalive_interval.value) == (
        3,
        60,
        10,
    )
    options = http_options(grpc)
    common = options.common_http_protocol_options
    assert common.idle_timeout.ToSeconds() == 60  # http idleTimeout wins over tcp's
    assert common.max_connection_duration.ToSeconds() == 3600
    assert common.max_requests_per_connection.value == 13
    assert options.explicit_http_config.http2_protocol_options.max_concurrent_streams.value == 15
    http1 = http_options(named(clusters, "outbound|9080||reviews.bookinfo.mesh"))
    assert http1.explicit_http_config.HasField("http_protocol_options")
    upgraded = http_options(named(clusters, "outbound|80||api.example.com"))
    assert upgraded.explicit_http_config.HasField("http2_protocol_options")
    client = http_options(named(clusters, "outbound|81||api.example.com"))
    assert client.HasField("use_downstream_protocol_config")


def test_http2_keepalive_and_upgrade() -> None:
    """applyConnectionPool after applyH2Upgrade (istio/istio#57583): an upgraded cluster gets its
    HTTP/2 settings, `http2KeepAlive` (istio/istio#60436) included, as Envoy's HTTP/2
    `connection_keepalive`; an HTTP/1.1 cluster has no HTTP/2 options to put it in."""
    clusters, _ = generate(REVIEWS + API_TWO_PORTS + CONNECTION_POOL)
    grpc = http_options(named(clusters, "outbound|9090||reviews.bookinfo.mesh"))
    keepalive = grpc.explicit_http_config.http2_protocol_options.connection_keepalive
    assert (keepalive.interval.seconds, keepalive.timeout.seconds) == (30, 5)
    http1 = http_options(named(clusters, "outbound|9080||reviews.bookinfo.mesh"))
    assert not http1.explicit_http_config.HasField("http2_protocol_options")
    upgraded = http_options(named(clusters, "outbound|80||api.example.com")).explicit_http_config.http2_protocol_options
    assert upgraded.max_concurrent_streams.value == 100
    # Envoy requires a PING timeout: an interval alone waits gRPC's default 20 s for the answer.
    assert (upgraded.connection_keepalive.interval.seconds, upgraded.connection_keepalive.timeout.seconds) == (10, 20)
    # Following the client's protocol, HTTP/2 clients' connections get the keepalive.
    client = http_options(named(clusters, "outbound|81||api.example.com")).use_downstream_protocol_config
    assert (
        client.http2_protocol_options.connection_keepalive.interval.seconds,
        client.http2_protocol_options.connection_keepalive.timeout.seconds,
    ) == (15, 3)


RETRY_BUDGET = dr(
    "reviews",
    "reviews.bookinfo.mesh",
    """  trafficPolicy:
    retryBudget: {minRetryConcurrency: 5}
    portLevelSettings:
    - port: {number: 9090}
      loadBalancer: {simple: RANDOM}
  subsets:
  - name: v1
    labels: {version: v1}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      retryBudget: {percent: 50}
  - name: v3
    labels: {version: v3}
    trafficPolicy:
      portLevelSettings:
      - port: {number: 9080}
        connectionPool: {tcp: {maxConnections: 7}}
""",
)


def test_retry_budget() -> None:
    """applyRetryBudget: the rule's budget on every cluster of its host, 20% and 3 retries by
    default (istio/istio#59505); a subset's own budget replaces it (mergeTrafficPolicy); a
    port-level entry, which has no budget, replaces the whole policy and so drops it
    (GetPortLevelTrafficPolicy); a subset's port-level entry keeps the rule's."""
    clusters, _ = generate(REVIEWS + RETRY_BUDGET)

    def budget(name: str) -> tuple[float, int] | None:
        threshold = named(clusters, name).circuit_breakers.thresholds[0]
        if not threshold.HasField("retry_budget"):
            return None
        return threshold.retry_budget.budget_percent.value, threshold.retry_budget.min_retry_concurrency.value

    assert budget("outbound|9080||reviews.bookinfo.mesh") == (20.0, 5)
    assert budget("outbound|9080|v1|reviews.bookinfo.mesh") == (20.0, 5)
    assert budget("outbound|9080|v2|reviews.bookinfo.mesh") == (50.0, 3)
    assert budget("outbound|9080|v3|reviews.bookinfo.mesh") == (20.0, 5)
    assert (
        named(clusters, "outbound|9080|v3|reviews.bookinfo.mesh").circuit_breakers.thresholds[0].max_connections.value
        == 7
    )
    assert budget("outbound|9090||reviews.bookinfo.mesh") is None
    assert budget("outbound|9090|v2|reviews.bookinfo.mesh") == (50.0, 3)
    # The other circuit breakers stay at Istio's maximum beside the budget.
    assert (
        named(clusters, "outbound|9080||reviews.bookinfo.mesh").circuit_breakers.thresholds[0].max_retries.value
        == 4294967295
    )


def test_load_balancer_policies() -> None:
    clusters, _ = generate(LB_SERVICE + LB_RULE)
    by_port = {c.name.split("|")[1]: c for c in clusters if c.name.startswith("outbound|")}
    assert by_port["8001"].lb_policy == _C.ROUND_ROBIN
    assert by_port["8001"].round_robin_lb_config.slow_start_config.slow_start_window.ToSeconds() == 30
    assert by_port["8002"].lb_policy == _C.RANDOM
    slow = by_port["8003"].least_request_lb_config.slow_start_config
    assert (slow.slow_start_window.ToSeconds(), slow.min_weight_percent.value, slow.aggression.default_value) == (
        60,
        10,
        2,
    )
    assert by_port["8004"].type == _C.ORIGINAL_DST
    assert by_port["8004"].lb_policy == _C.CLUSTER_PROVIDED
    assert not by_port["8004"].HasField("eds_cluster_config")
    assert by_port["8005"].lb_policy == _C.RING_HASH
    assert by_port["8005"].ring_hash_lb_config.minimum_ring_size.value == 2048
    assert by_port["8006"].lb_policy == _C.MAGLEV
    assert by_port["8006"].maglev_lb_config.table_size.value == 65537
    assert by_port["8007"].ring_hash_lb_config.minimum_ring_size.value == 1024


def test_outlier_detection_enforces_what_is_set() -> None:
    clusters, _ = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + FAILOVER, PRODUCTPAGE_NODE)
    cluster = named(clusters, "outbound|9080||reviews.bookinfo.mesh")
    od = cluster.outlier_detection
    assert (od.consecutive_5xx.value, od.enforcing_consecutive_5xx.value) == (5, 100)
    assert (od.consecutive_gateway_failure.value, od.enforcing_consecutive_gateway_failure.value) == (3, 100)
    assert (od.consecutive_local_origin_failure.value, od.enforcing_consecutive_local_origin_failure.value) == (4, 100)
    assert od.HasField("enforcing_success_rate") and od.enforcing_success_rate.value == 0
    assert od.HasField("enforcing_local_origin_success_rate") and od.enforcing_local_origin_success_rate.value == 0
    assert od.split_external_local_origin_errors
    assert (od.interval.ToSeconds(), od.base_ejection_time.ToSeconds(), od.max_ejection_percent.value) == (10, 30, 50)
    assert cluster.common_lb_config.healthy_panic_threshold.value == 20
    assert cluster.common_lb_config.HasField("locality_weighted_lb_config")


def test_failover_priorities_relative_to_the_proxy_in_dns_clusters() -> None:
    clusters, endpoints = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + FAILOVER, PRODUCTPAGE_NODE)
    la = named(clusters, "outbound|5432||db.bookinfo.mesh").load_assignment
    priorities = {f"{g.locality.region}/{g.locality.zone}": g.priority for g in la.endpoints}
    # Same zone, same region, the failover region, then the rest.
    assert priorities == {"us-east/zone-a": 0, "us-east/zone-b": 1, "eu-central/zone-d": 2, "us-west/zone-c": 3}
    # EDS is shared by every proxy: no proxy-relative priorities there.
    assert all(g.priority == 0 for cla in endpoints for g in cla.endpoints)


def test_failover_needs_outlier_detection() -> None:
    rule = dr(
        "failover",
        "*.bookinfo.mesh",
        "  trafficPolicy:\n    loadBalancer:\n      localityLbSetting: {failover: [{from: us-east, to: eu-central}]}\n",
    )
    clusters, _ = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + rule, PRODUCTPAGE_NODE)
    db = named(clusters, "outbound|5432||db.bookinfo.mesh")
    assert not db.common_lb_config.HasField("locality_weighted_lb_config")
    assert all(g.priority == 0 for g in db.load_assignment.endpoints)


def test_distribute_weights_localities_for_the_proxy() -> None:
    clusters, _ = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + DISTRIBUTE, PRODUCTPAGE_NODE)
    db = named(clusters, "outbound|5432||db.bookinfo.mesh")
    assert db.common_lb_config.HasField("locality_weighted_lb_config")
    weights = {
        f"{g.locality.region}/{g.locality.zone}": (g.load_balancing_weight.value, len(g.lb_endpoints))
        for g in db.load_assignment.endpoints
    }
    # us-east's 80 split over its two localities, us-west's 20; eu-central gets nothing.
    assert weights == {
        "us-east/zone-a": (40, 1),
        "us-east/zone-b": (40, 1),
        "us-west/zone-c": (20, 1),
        "eu-central/zone-d": (1, 0),
    }


def test_locality_setting_disabled_by_rule() -> None:
    rule = dr(
        "off",
        "*.bookinfo.mesh",
        "  trafficPolicy:\n    outlierDetection: {consecutive5xxErrors: 1}\n"
        "    loadBalancer:\n      localityLbSetting: {enabled: false, failover: [{from: us-east, to: eu-central}]}\n",
    )
    clusters, _ = generate(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + rule, PRODUCTPAGE_NODE)
    db = named(clusters, "outbound|5432||db.bookinfo.mesh")
    assert not db.common_lb_config.HasField("locality_weighted_lb_config")
    assert all(g.priority == 0 for g in db.load_assignment.endpoints)


def _tls(cluster: cluster_pb2.Cluster) -> tls_pb2.UpstreamTlsContext:
    context = tls_pb2.UpstreamTlsContext()
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    assert cluster.transport_socket.typed_config.Unpack(context)
    return context


def test_tls_modes() -> None:
    clusters, _ = generate(TLS_SERVICE + TLS_RULE)
    simple = _tls(named(clusters, "outbound|443||secure.example.com"))
    assert simple.sni == "secure.example.com"
    validation = simple.common_tls_context.validation_context
    assert validation.trusted_ca.filename == f"{CERTS}/ca.pem"
    sans = [(m.san_type, m.matcher.exact) for m in validation.match_typed_subject_alt_names]
    assert [s[1] for s in sans] == ["secure.example.com", "spiffe://example.com/ns/default/sa/secure", "10.9.9.9"]
    assert [s[0] for s in sans] == [2, 3, 4]  # DNS, URI, IP_ADDRESS
    # SNI and SANs given: no auto_sni/auto_san_validation, so no protocol options at all on this HTTP/1 port.
    assert (
        HTTP_PROTOCOL_OPTIONS
        not in named(clusters, "outbound|443||secure.example.com").typed_extension_protocol_options
    )

    mutual_cluster = named(clusters, "outbound|8443||secure.example.com")
    mutual = _tls(mutual_cluster)
    (certificate,) = mutual.common_tls_context.tls_certificates
    assert certificate.certificate_chain.filename == f"{CERTS}/cert.pem"
    assert certificate.private_key.filename == f"{CERTS}/key.pem"
    assert list(mutual.common_tls_context.alpn_protocols) == ["h2"]
    upstream = http_options(mutual_cluster).upstream_http_protocol_options
    assert upstream.auto_sni and upstream.auto_san_validation
    assert istio_meta(mutual_cluster)["alpn_override"] == "false"

    # ISTIO_MUTUAL: the mesh's certificates over SDS, Istio's SNI and in-mesh ALPN.
    istio = _tls(named(clusters, "outbound|9443||secure.example.com"))
    assert istio.sni == "outbound_.9443_._.secure.example.com"
    common = istio.common_tls_context
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == ["default"]
    assert common.tls_certificate_sds_secret_configs[0].sds_config.HasField("ads")
    assert common.combined_validation_context.validation_context_sds_secret_config.name == "ROOTCA"
    assert list(common.alpn_protocols) == ["istio-peer-exchange", "istio"]
    assert not common.tls_certificates  # no key material in a cluster
    assert not named(clusters, "outbound|9445||secure.example.com").HasField("transport_socket")
    insecure = _tls(named(clusters, "outbound|9444||secure.example.com")).common_tls_context.validation_context
    assert not insecure.HasField("trusted_ca") and not insecure.HasField("system_root_certs")


def test_tls_defaults_to_system_roots_and_mutual_needs_files() -> None:
    """credentialName needs SDS: without certificate files MUTUAL stays plaintext, as in Istio."""
    rule = dr(
        "secure",
        "secure.example.com",
        "  trafficPolicy:\n    tls: {mode: SIMPLE, caCrl: /etc/crl.pem}\n    portLevelSettings:\n"
        "    - port: {number: 9443}\n      tls: {mode: MUTUAL, credentialName: client-secret}\n",
        "default",
    )
    clusters, _ = generate(TLS_SERVICE + rule)
    validation = _tls(named(clusters, "outbound|443||secure.example.com")).common_tls_context.validation_context
    assert validation.HasField("system_root_certs")
    assert validation.crl.filename == "/etc/crl.pem"
    assert not named(clusters, "outbound|9443||secure.example.com").HasField("transport_socket")


def test_sidecar_scopes_outbound_clusters_but_not_a_router() -> None:
    sidecar = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: default}
spec:
  egress: [{hosts: ["default/db.example.com"]}]
"""
    text = REVIEWS + "---" + EXTERNAL + sidecar
    sidecar_clusters, _ = generate(text)
    assert {c.name for c in sidecar_clusters if c.name.startswith("outbound")} == {"outbound|5432||db.example.com"}
    router_clusters, router_endpoints = generate(text, "router~10.0.9.9~ingress.default~default.svc.cluster.local")
    names = {c.name for c in router_clusters}
    assert "outbound|9080||reviews.bookinfo.mesh" in names
    assert "PassthroughCluster" not in names and "BlackHoleCluster" in names
    assert not any(n.startswith("inbound") for n in names)
    # A gateway has no original destination: NONE resolution becomes EDS.
    assert named(router_clusters, "outbound|7000||anything.internal").type == _C.EDS
    assert "outbound|7000||anything.internal" in {e.cluster_name for e in router_endpoints}


def test_inbound_clusters_point_at_localhost() -> None:
    clusters, _ = generate(REVIEWS, REVIEWS_V1)
    inbound = {c.name: c for c in clusters if c.name.startswith("inbound")}
    assert set(inbound) == {"inbound|19080||", "inbound|9090||"}
    address = inbound["inbound|19080||"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (address.socket_address.address, address.socket_address.port_value) == ("127.0.0.1", 19080)
    assert inbound["inbound|19080||"].type == _C.STATIC
    assert http_options(inbound["inbound|9090||"]).explicit_http_config.HasField("http2_protocol_options")
    assert istio_meta(inbound["inbound|19080||"])["services"] == [
        {"host": "reviews.bookinfo.mesh", "name": "reviews.bookinfo.mesh", "namespace": "bookinfo"}
    ]
    assert "InboundPassthroughCluster" not in {c.name for c in clusters}  # NONE interception


def test_inbound_from_sidecar_ingress() -> None:
    """Istio's buildInboundClusters: a Sidecar with ingress listeners declares every inbound
    cluster; the service's port 19080, which it does not list, gets none (its traffic takes the
    passthrough chains and InboundPassthroughCluster)."""
    clusters, _ = generate(REVIEWS + INBOUND_SIDECAR, REVIEWS_V1, {"INTERCEPTION_MODE": "TPROXY"})
    by_name = {c.name: c for c in clusters}
    assert {n for n in by_name if n.startswith(("inbound", "Inbound"))} == {
        "inbound|9090||",
        "inbound|7000||",
        "inbound|7002||",
        "InboundPassthroughCluster",
    }
    grpc = by_name["inbound|9090||"]
    socket = grpc.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (socket.address, socket.port_value) == ("10.0.1.1", 9091)
    assert grpc.upstream_bind_config.source_address.address == "127.0.0.6"
    pipe = by_name["inbound|7000||"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.pipe
    assert pipe.path == "/var/run/reviews.sock"
    # Connection pools: the ingress listener's, else the Sidecar-wide one.
    assert by_name["inbound|7002||"].circuit_breakers.thresholds[0].max_connections.value == 7
    assert by_name["inbound|9090||"].circuit_breakers.thresholds[0].max_pending_requests.value == 3
    assert not by_name["inbound|7002||"].HasField("upstream_bind_config")


def test_inbound_ingress_without_default_endpoint_is_original_dst() -> None:
    sidecar = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: bookinfo}
spec:
  ingress: [{port: {number: 7001, protocol: HTTP, name: http}}]
"""
    try:
        clusters, _ = generate(REVIEWS + sidecar, REVIEWS_V1)
    except Exception:  # validation may insist on a defaultEndpoint
        pytest.skip("an ingress listener without defaultEndpoint is rejected by validation")
    cluster = named(clusters, "inbound|7001||")
    assert (cluster.type, cluster.lb_policy) == (_C.ORIGINAL_DST, _C.CLUSTER_PROVIDED)
    assert cluster.cleanup_interval.seconds > 10**9


def test_inbound_connection_pool_from_destination_rule() -> None:
    rule = dr("reviews", "reviews.bookinfo.mesh", "  trafficPolicy:\n    connectionPool: {tcp: {maxConnections: 42}}\n")
    clusters, _ = generate(REVIEWS + rule, REVIEWS_V1)
    inbound = named(clusters, "inbound|19080||")
    assert inbound.circuit_breakers.thresholds[0].max_connections.value == 42
    assert istio_meta(inbound)["config"].endswith("/destination-rule/reviews")
    assert not inbound.HasField("outlier_detection")


def test_destination_rule_in_client_namespace_wins() -> None:
    client_rule = dr(
        "client-view", "reviews.bookinfo.mesh", "  trafficPolicy:\n    loadBalancer: {simple: RANDOM}\n", "default"
    )
    server_rule = dr("reviews", "reviews.bookinfo.mesh", "  trafficPolicy:\n    loadBalancer: {simple: ROUND_ROBIN}\n")
    clusters, _ = generate(REVIEWS + client_rule + server_rule)
    cluster = named(clusters, "outbound|9080||reviews.bookinfo.mesh")
    assert cluster.lb_policy == _C.RANDOM
    assert istio_meta(cluster)["config"].endswith("/namespaces/default/destination-rule/client-view")
    other, _ = generate(REVIEWS + client_rule + server_rule, PRODUCTPAGE_NODE)
    assert named(other, "outbound|9080||reviews.bookinfo.mesh").lb_policy == _C.ROUND_ROBIN


def test_clusters_are_deterministic() -> None:
    text = REVIEWS + SUBSETS + PRODUCTPAGE + MULTI_REGION_DB + FAILOVER
    first, _ = generate(text, PRODUCTPAGE_NODE)
    second, _ = generate(text, PRODUCTPAGE_NODE)
    assert [c.SerializeToString(deterministic=True) for c in first] == [
        c.SerializeToString(deterministic=True) for c in second
    ]


PROXY_PROTOCOL = dr(
    "reviews",
    "reviews.bookinfo.mesh",
    """  trafficPolicy:
    proxyProtocol: {version: V2}
    portLevelSettings:
    - port: {number: 9090}
      loadBalancer: {simple: RANDOM}
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy:
      tls: {mode: SIMPLE, insecureSkipVerify: true}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      proxyProtocol: {}
""",
)


def test_proxy_protocol() -> None:
    """applyUpstreamProxyProtocol: the PROXY protocol header (V2 here, V1 by default) wraps the
    cluster's transport socket, TLS when the cluster originates it (after applyUpstreamTLSSettings),
    raw bytes otherwise; like the retry budget, it belongs to the rule or subset as a whole, so a
    port-level entry drops it. Envoy loads the result."""
    clusters, endpoints = generate(REVIEWS + PROXY_PROTOCOL)

    def wrapper(name: str) -> upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport | None:
        socket = named(clusters, name).transport_socket
        if socket.name != "envoy.transport_sockets.upstream_proxy_protocol":
            return None
        out = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport()
        assert socket.typed_config.Unpack(out)
        return out

    plain = wrapper("outbound|9080||reviews.bookinfo.mesh")
    assert plain is not None and plain.config.version == proxy_protocol_pb2.ProxyProtocolConfig.V2
    assert plain.transport_socket.name == "envoy.transport_sockets.raw_buffer"
    tls = wrapper("outbound|9080|v1|reviews.bookinfo.mesh")
    assert tls is not None and tls.transport_socket.name == "envoy.transport_sockets.tls"
    v2 = wrapper("outbound|9080|v2|reviews.bookinfo.mesh")
    assert v2 is not None and v2.config.version == proxy_protocol_pb2.ProxyProtocolConfig.V1
    assert wrapper("outbound|9090||reviews.bookinfo.mesh") is None
    assert wrapper("outbound|9090|v2|reviews.bookinfo.mesh") is not None
    validate_config(bootstrap({types.CLUSTER: clusters, types.ENDPOINT: endpoints}))


def test_the_mesh_locality_setting_applies_where_a_rule_has_none() -> None:
    """Istio's loadbalancer.GetLocalityLbSetting: the DestinationRule's setting, else MeshConfig's."""
    from meshctl.config.mesh import mesh_settings

    settings, findings = mesh_settings(
        {"localityLbSetting": {"distribute": [{"from": "us-east/*", "to": {"us-east/*": 80, "us-west/*": 20}}]}}
    )
    assert settings is not None and findings == []
    snapshot = snapshot_from_yaml(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB, mesh=settings)
    scope = ProxyScope(snapshot, proxy_for(snapshot, PRODUCTPAGE_NODE))
    db = named(build_clusters(scope), "outbound|5432||db.bookinfo.mesh")
    assert db.common_lb_config.HasField("locality_weighted_lb_config")
    weights = {g.locality.zone: g.load_balancing_weight.value for g in db.load_assignment.endpoints}
    assert weights["zone-c"] == 20
    # A rule's own setting wins over the mesh's.
    off = "  trafficPolicy:\n    loadBalancer:\n      localityLbSetting: {enabled: false}\n"
    rule = dr("off", "*.bookinfo.mesh", off)
    snapshot = snapshot_from_yaml(REVIEWS + PRODUCTPAGE + MULTI_REGION_DB + rule, mesh=settings)
    scope = ProxyScope(snapshot, proxy_for(snapshot, PRODUCTPAGE_NODE))
    db = named(build_clusters(scope), "outbound|5432||db.bookinfo.mesh")
    assert not db.common_lb_config.HasField("locality_weighted_lb_config")


def test_a_mesh_locality_setting_istio_would_refuse_is_an_error() -> None:
    from meshctl.config.mesh import mesh_settings

    settings, findings = mesh_settings({"localityLbSetting": {"distribute": "everywhere"}})
    assert settings is None and findings and "localityLbSetting.distribute" in findings[0].message
