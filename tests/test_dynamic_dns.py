"""What a sidecar is sent for DYNAMIC_DNS ServiceEntries and ALLOW_ANY_DYNAMIC_DNS, against
Istio's own tests of the same config (pilot's cluster_dfp_sidecar_test.go
TestSidecarDynamicDNSClusters / TestSidecarDynamicDNSInsecureSkipVerify, listener_dfp_test.go
TestSidecarDynamicDNSFilters), what Envoy accepts of it, and what `meshctl simulate` and
`meshctl dump` say about it. Traffic through a real Envoy: test_e2e_dynamic_dns.py."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import needs_envoy
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.clusters.dynamic_forward_proxy.v3 import cluster_pb2 as dfp_cluster_pb2
from envoy.extensions.filters.http.dynamic_forward_proxy.v3 import dynamic_forward_proxy_pb2 as dfp_http_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.sni_dynamic_forward_proxy.v3 import (
    sni_dynamic_forward_proxy_pb2 as dfp_sni_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from meshctl.cli.dump import cluster_rows
from meshctl.config.mesh import MeshSettings, mesh_settings
from meshctl.simulate import Target, parse_request, simulate
from meshctl.simulate.request import parse_connection
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import validate_resources
from meshctl.xds import types
from meshctl.xds.generate import generate

CLIENT = "sidecar~127.0.0.9~client.default~default.svc.cluster.local"
HOST = "*.svc.example"
CACHE = "*.svc.example_dfp_dns_cache"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def entry(port: int, protocol: str, *, extra: str = "") -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: wildcard-se, namespace: default}}
spec:
  hosts: ["{HOST}"]
  location: MESH_EXTERNAL
  resolution: DYNAMIC_DNS
  ports: [{{number: {port}, name: test-port, protocol: {protocol}}}]
{extra}"""


def rule(tls: str) -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: wildcard-dr, namespace: default}}
spec:
  host: "{HOST}"
  trafficPolicy:
    tls: {tls}
"""


def generated(text: str, mesh: MeshSettings | None = None) -> dict[str, Any]:
    snapshot = snapshot_from_yaml(text, mesh=mesh)
    return generate(snapshot, proxy_for(snapshot, CLIENT))


def clusters(resources: dict[str, Any]) -> dict[str, cluster_pb2.Cluster]:
    return {c.name: c for c in resources[types.CLUSTER]}


def dfp_config(cluster: cluster_pb2.Cluster) -> dfp_cluster_pb2.ClusterConfig:
    assert cluster.cluster_type.name == "envoy.clusters.dynamic_forward_proxy"
    config = dfp_cluster_pb2.ClusterConfig()
    assert cluster.cluster_type.typed_config.Unpack(config)
    return config


def upstream_options(cluster: cluster_pb2.Cluster) -> Any:
    options = http_protocol_options_pb2.HttpProtocolOptions()
    assert cluster.typed_extension_protocol_options[_HTTP_OPTIONS].Unpack(options)
    return options.upstream_http_protocol_options


@pytest.mark.parametrize(("protocol", "port"), [("HTTP", 80), ("GRPC", 9090), ("TLS", 443)])
def test_TestSidecarDynamicDNSClusters_a_dfp_cluster_per_http_or_tls_port(protocol: str, port: int) -> None:
    found = clusters(generated(entry(port, protocol)))
    cluster = found[f"outbound|{port}||{HOST}"]
    assert cluster.lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED
    cache = dfp_config(cluster).dns_cache_config
    assert cache.name == CACHE
    assert cache.dns_lookup_family == cluster_pb2.Cluster.V4_ONLY
    assert cache.max_hosts.value == 1024


def test_TestSidecarDynamicDNSClusters_no_cluster_for_an_https_port() -> None:
    """Istio's "Unsupported protocol HTTPS": the entry is accepted, the port gets nothing."""
    resources = generated(entry(443, "HTTPS"))
    assert f"outbound|443||{HOST}" not in clusters(resources)
    assert not [ln for ln in resources[types.LISTENER] if ln.address.socket_address.port_value == 443]


@pytest.mark.parametrize(
    "tls",
    ["{mode: SIMPLE}", "{mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem}"],
)
def test_TestSidecarDynamicDNSClusters_tls_origination_names_and_checks_the_requested_host(tls: str) -> None:
    cluster = clusters(generated(entry(80, "HTTP") + rule(tls)))[f"outbound|80||{HOST}"]
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    upstream = upstream_options(cluster)
    assert upstream.auto_sni and upstream.auto_san_validation
    assert not dfp_config(cluster).allow_insecure_cluster_options


def test_TestSidecarDynamicDNSInsecureSkipVerify_allows_insecure_cluster_options() -> None:
    cluster = clusters(generated(entry(80, "HTTP") + rule("{mode: SIMPLE, insecureSkipVerify: true}")))
    dfp = cluster[f"outbound|80||{HOST}"]
    assert dfp_config(dfp).allow_insecure_cluster_options
    context = tls_pb2.UpstreamTlsContext()
    assert dfp.transport_socket.typed_config.Unpack(context)
    upstream = upstream_options(dfp)
    assert upstream.auto_sni and not upstream.auto_san_validation


def _hcm(listener: Any) -> hcm_pb2.HttpConnectionManager:
    for chain in listener.filter_chains:
        for f in chain.filters:
            if f.name == "envoy.filters.network.http_connection_manager":
                hcm = hcm_pb2.HttpConnectionManager()
                assert f.typed_config.Unpack(hcm)
                return hcm
    raise AssertionError(f"no HTTP connection manager on {listener.name}")


def test_TestSidecarDynamicDNSFilters_http_port_resolves_the_host_in_the_clusters_cache() -> None:
    resources = generated(entry(80, "HTTP"))
    listener = next(ln for ln in resources[types.LISTENER] if ln.name == "127.0.0.1_80")
    filters = _hcm(listener).http_filters
    dfp = [f for f in filters if f.typed_config.type_url.endswith("dynamic_forward_proxy.v3.FilterConfig")]
    assert len(dfp) == 1 and dfp[0].disabled
    config = dfp_http_pb2.FilterConfig()
    assert dfp[0].typed_config.Unpack(config)
    assert config.dns_cache_config == dfp_config(clusters(resources)[f"outbound|80||{HOST}"]).dns_cache_config
    assert filters[-1].name == "envoy.filters.http.router" and filters[-2] is dfp[0]
    routes = next(r for r in resources[types.ROUTE] if r.name == "80")
    vhost = next(v for v in routes.virtual_hosts if HOST in v.domains)
    assert list(vhost.typed_per_filter_config) == [dfp[0].name]
    assert vhost.routes[0].route.cluster == f"outbound|80||{HOST}"
    catch_all = next(v for v in routes.virtual_hosts if "*" in v.domains)
    assert not catch_all.typed_per_filter_config


def test_TestSidecarDynamicDNSFilters_tls_port_resolves_the_sni_on_the_service_port() -> None:
    resources = generated(entry(443, "TLS"))
    listener = next(ln for ln in resources[types.LISTENER] if ln.address.socket_address.port_value == 443)
    chain = next(c for c in listener.filter_chains if HOST in c.filter_chain_match.server_names)
    assert [f.name for f in chain.filters] == [
        "envoy.filters.network.sni_dynamic_forward_proxy",
        "envoy.filters.network.tcp_proxy",
    ]
    config = dfp_sni_pb2.FilterConfig()
    assert chain.filters[0].typed_config.Unpack(config)
    assert config.port_value == 443
    assert config.dns_cache_config.name == CACHE


def test_the_cache_bound_is_meshconfig_dnsCacheMaxHosts() -> None:
    settings, findings = mesh_settings({"dnsCacheMaxHosts": 50})
    assert settings is not None and not findings
    resources = generated(entry(80, "HTTP"), settings)
    assert dfp_config(clusters(resources)[f"outbound|80||{HOST}"]).dns_cache_config.max_hosts.value == 50
    _, bad = mesh_settings({"dnsCacheMaxHosts": 0})
    assert [(f.field, f.severity.name) for f in bad] == [("dnsCacheMaxHosts", "ERROR")]


def test_allow_any_dynamic_dns_is_accepted() -> None:
    settings, findings = mesh_settings({"outboundTrafficPolicy": {"mode": "ALLOW_ANY_DYNAMIC_DNS"}})
    assert settings is not None and settings.outbound_traffic_policy == "ALLOW_ANY_DYNAMIC_DNS"
    assert not findings


@pytest.mark.parametrize(
    ("tls", "insecure"),
    [
        ({"mode": "SIMPLE", "insecureSkipVerify": True}, True),
        ({"mode": "SIMPLE", "caCertificates": "/etc/ssl/ca.pem"}, False),
        ({"mode": "MUTUAL", "clientCertificate": "/c.pem", "privateKey": "/k.pem"}, False),
    ],
)
def test_outbound_traffic_policy_tls_is_originated_by_the_allow_any_cluster(
    tls: dict[str, Any], insecure: bool
) -> None:
    """Istio's TestAllowAnyDynamicDNSWithTLS: `outboundTrafficPolicy.tls` makes the catch-all's
    forward proxy originate TLS, naming (SNI) and checking the host each request names."""
    settings, findings = mesh_settings({"outboundTrafficPolicy": {"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": tls}})
    assert settings is not None and not findings
    cluster = clusters(generated(entry(80, "HTTP"), settings))["AllowAnyDynamicDNSCluster"]
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    assert dfp_config(cluster).allow_insecure_cluster_options is insecure
    upstream = upstream_options(cluster)
    assert upstream.auto_sni and upstream.auto_san_validation is not insecure


@pytest.mark.parametrize(
    ("outbound", "field", "severity"),
    [
        ({"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": {"mode": "ISTIO_MUTUAL"}}, "outboundTrafficPolicy.tls", "ERROR"),
        ({"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": {"mode": "MUTUAL"}}, "outboundTrafficPolicy.tls", "ERROR"),
        (
            {"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": {"mode": "SIMPLE", "credentialName": "x"}},
            "outboundTrafficPolicy.tls",
            "ERROR",
        ),
        ({"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": {"mode": "SIMPLY"}}, "outboundTrafficPolicy.tls.mode", "ERROR"),
        ({"mode": "ALLOW_ANY", "tls": {"mode": "SIMPLE"}}, "outboundTrafficPolicy.tls", "WARNING"),
    ],
)
def test_outbound_traffic_policy_tls_that_cannot_be_used_is_a_finding_at_its_field(
    outbound: dict[str, Any], field: str, severity: str
) -> None:
    _, findings = mesh_settings({"outboundTrafficPolicy": outbound})
    assert [(f.field, f.severity.name) for f in findings] == [(field, severity)]


def test_allow_any_dynamic_dns_routes_unknown_http_hosts_to_its_cluster() -> None:
    settings, _ = mesh_settings({"outboundTrafficPolicy": {"mode": "ALLOW_ANY_DYNAMIC_DNS"}})
    resources = generated(entry(80, "HTTP"), settings)
    cluster = clusters(resources)["AllowAnyDynamicDNSCluster"]
    assert dfp_config(cluster).dns_cache_config.name == "AllowAnyDynamicDNSCluster_dfp_dns_cache"
    routes = next(r for r in resources[types.ROUTE] if r.name == "80")
    catch_all = next(v for v in routes.virtual_hosts if "*" in v.domains)
    assert catch_all.name == "allow_any"
    assert catch_all.routes[0].route.cluster == "AllowAnyDynamicDNSCluster"
    assert list(catch_all.typed_per_filter_config) == ["dfp|AllowAnyDynamicDNSCluster_dfp_dns_cache"]
    result = simulate(resources, parse_request("http://x.anywhere.example/"), Target(CLIENT))
    assert [(c.name, c.type) for c in result.clusters] == [("AllowAnyDynamicDNSCluster", "DYNAMIC_FORWARD_PROXY")]
    assert any("resolves the Host x.anywhere.example (port 80)" in note for note in result.notes)


@needs_envoy
@pytest.mark.parametrize(
    "outbound",
    [
        {"mode": "REGISTRY_ONLY"},
        {"mode": "ALLOW_ANY_DYNAMIC_DNS"},
        {"mode": "ALLOW_ANY_DYNAMIC_DNS", "tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
    ],
)
def test_envoy_accepts_the_dfp_config(outbound: dict[str, Any]) -> None:
    """Two wildcard entries sharing an HTTP port (two caches on one connection manager), a TLS
    port, gRPC with TLS origination: what Envoy checks of DFP clusters and filters (one config
    per cache name, auto_sni with HTTP options) holds."""
    text = (
        entry(80, "HTTP")
        + """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: more, namespace: default}
spec:
  hosts: ["*.more.example"]
  resolution: DYNAMIC_DNS
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 443, name: tls, protocol: TLS},
          {number: 9090, name: grpc, protocol: GRPC}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: more, namespace: default}
spec:
  host: "*.more.example"
  trafficPolicy: {portLevelSettings: [{port: {number: 9090}, tls: {mode: SIMPLE}}]}
"""
    )
    settings, _ = mesh_settings({"outboundTrafficPolicy": outbound})
    validate_resources(generated(text, settings))


def test_simulate_says_the_request_goes_to_the_dynamic_forward_proxy() -> None:
    resources = generated(entry(18080, "HTTP"))
    result = simulate(resources, parse_request("http://a.svc.example:18080/x"), Target(CLIENT))
    assert result.outcome.routed and result.outcome.status is None
    assert [(c.name, c.type) for c in result.clusters] == [(f"outbound|18080||{HOST}", "DYNAMIC_FORWARD_PROXY")]
    assert "dynamic forward proxy" in result.outcome.reason
    assert any("resolves the Host a.svc.example:18080" in note for note in result.notes)


def test_simulate_a_tls_connection_by_its_sni() -> None:
    resources = generated(entry(443, "TLS"))
    result = simulate(resources, parse_connection("a.svc.example:443", "a.svc.example"), Target(CLIENT))
    assert [(c.name, c.type) for c in result.clusters] == [(f"outbound|443||{HOST}", "DYNAMIC_FORWARD_PROXY")]
    assert any("resolves the SNI a.svc.example" in note for note in result.notes)


def test_dump_lists_the_dfp_cluster_by_its_type() -> None:
    rows = cluster_rows(generated(entry(80, "HTTP"))[types.CLUSTER])
    assert [HOST, "80", "-", "outbound", "envoy.clusters.dynamic_forward_proxy", ""] in rows


def test_the_proxys_dns_listener_leaves_dynamic_dns_names_to_the_vms_resolvers() -> None:
    """The proxy resolves a DYNAMIC_DNS name itself, through the VM's resolvers, which may be
    routed to the proxy's own DNS listener (`meshctl hosts`'s systemd-resolved setup): answered
    there with 127.0.0.1, the request would loop back into the proxy. So the table and the
    domains routed to it leave such names out."""
    from meshctl.snapshot.scope import ProxyScope
    from meshctl.xds.dns_table import mesh_domains, name_table

    snapshot = snapshot_from_yaml(entry(80, "HTTP"))
    proxy = proxy_for(snapshot, CLIENT, {"DNS_PORT": "15053"})
    scope = ProxyScope(snapshot, proxy)
    assert HOST not in name_table(scope)
    assert "svc.example" not in mesh_domains(scope)


def test_simulate_cli_shows_the_cluster_resolving_per_request(tmp_path: Any) -> None:
    from conftest import runner

    from meshctl.cli.app import app

    (tmp_path / "se.yaml").write_text(
        entry(18080, "HTTP")
        + "---\napiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
        + "metadata: {name: client, namespace: default}\nspec: {address: 127.0.0.9}\n"
    )
    args = ["simulate", "http://a.svc.example:18080/", "--config-dir", str(tmp_path), "--proxy", "client.default"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "(the host resolved per request)" in result.stdout
    assert "the dynamic forward proxy resolves the Host a.svc.example:18080" in result.output
