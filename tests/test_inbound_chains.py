"""A sidecar's inbound filter chains against Istio's: the filter chain match tables of
`pilot/pkg/networking/core/filterchain_options.go` (getFilterChainMatchOptions), the chain
configs of `listener_inbound.go` (buildInboundChainConfigs, buildInboundListeners,
buildInboundPassthroughChains) and the expectations of Istio's simulation tests
(`peer_authentication_simulation_test.go`, `sidecar_simulation_test.go`: which chain a
plaintext, mutual TLS or other TLS connection to a port reaches, or none).

Which chain a connection reaches is decided by meshctl's model of Envoy's filter chain match
(`simulate.listener.choose_chain`); the real Envoy tests are in test_e2e_inbound.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from meshctl.simulate.listener import Connection, choose_chain
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.generate import generate_config
from meshctl.xds.listener_filters import HTTP_INSPECTOR, TLS_INSPECTOR

NODE = "sidecar~10.0.0.5~web-1.default~default.svc.cluster.local"
REDIRECT = {"INTERCEPTION_MODE": "REDIRECT"}

#: A workload serving a declared HTTP port (8080), a declared TCP port (9000) and a port whose
#: protocol is neither declared nor implied by its name (7070, Istio's "auto"); it also listens
#: on ports no service declares (6000).
MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web}
spec:
  hosts: [web.default.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 8080, name: http, protocol: HTTP}
  - {number: 9000, name: tcp, protocol: TCP}
  - {number: 7070, name: web}
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-1}
spec: {address: 10.0.0.5, labels: {app: web}}
"""


def peer_authentication(mode: str, ports: dict[int, str] | None = None) -> str:
    selector = "  selector: {matchLabels: {app: web}}\n" if ports else ""
    port_level = "".join(f"    {p}: {{mode: {m}}}\n" for p, m in (ports or {}).items())
    return f"""---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: web-mtls}}
spec:
{selector}  mtls: {{mode: {mode}}}
""" + (f"  portLevelMtls:\n{port_level}" if ports else "")


def listeners(text: str, metadata: dict[str, Any] | None = None, *, certificates: bool = True) -> dict[str, Any]:
    snapshot = snapshot_from_yaml(text)
    node = dataclasses.replace(parse_node_id(NODE, metadata or REDIRECT), mesh_certificates=certificates)
    generated = generate_config(snapshot, bind_proxy(node, snapshot))
    return {item.name: item for item in generated[types.LISTENER]}


def virtual_inbound(text: str, *, certificates: bool = True) -> Any:
    return listeners(text, certificates=certificates)["virtualInbound"]


PLAINTEXT = ("raw_buffer", ())
PLAINTEXT_HTTP = ("raw_buffer", ("http/1.1",))
MESH_TCP = ("tls", ("istio-peer-exchange", "istio"))
MESH_HTTP = ("tls", ("istio-http/1.1",))
OTHER_TLS = ("tls", ("h2", "http/1.1"))


def reached(listener: Any, port: int, arrival: tuple[str, tuple[str, ...]]) -> str | None:
    """What a connection to `port` arriving as `arrival` (transport, ALPN or sniffed protocol)
    reaches: `CHAIN -> CLUSTER`, with `(mTLS)` or `(TLS)` when the chain terminates TLS and
    `http` for a connection manager; None when no chain takes it (Envoy closes it). Where an
    inspector is off for the port, what it would detect is not known: TLS arrives as bytes."""
    transport, protocols = arrival
    enabled = enabled_inspectors(listener, port)
    if transport == "tls" and TLS_INSPECTOR not in enabled:
        transport, protocols = "raw_buffer", ()
    if transport == "raw_buffer" and HTTP_INSPECTOR not in enabled:
        protocols = ()
    found = choose_chain(listener, Connection(port, "10.0.0.5", "", transport, protocols))
    if found is None:
        return None
    _, chain = found
    config = chain.filters[-1].typed_config
    if config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
        hcm = hcm_pb2.HttpConnectionManager()
        config.Unpack(hcm)
        target = "http " + hcm.route_config.virtual_hosts[0].routes[0].route.cluster
    else:
        tcp = tcp_proxy_pb2.TcpProxy()
        config.Unpack(tcp)
        target = tcp.cluster
    tls = ""
    if chain.HasField("transport_socket"):
        context = tls_pb2.DownstreamTlsContext()
        chain.transport_socket.typed_config.Unpack(context)
        mesh = any(s.name == "default" for s in context.common_tls_context.tls_certificate_sds_secret_configs)
        tls = " (mTLS)" if mesh and context.require_client_certificate.value else " (TLS)"
    return f"{chain.name} -> {target}{tls}"


def _port_ranges(predicate: Any) -> list[Any]:
    ranges = [predicate.destination_port_range] if predicate.HasField("destination_port_range") else []
    return ranges + [r.destination_port_range for r in predicate.or_match.rules]


def enabled_inspectors(listener: Any, port: int) -> set[str]:
    """The listener filters that run for a connection to `port` (their `filter_disabled`
    predicates as Istio writes them: port ranges, or their negation)."""
    out = set()
    for item in listener.listener_filters:
        disabled = item.filter_disabled
        if disabled.HasField("not_match"):
            off = not any(r.start <= port < r.end for r in _port_ranges(disabled.not_match))
        else:
            off = any(r.start <= port < r.end for r in _port_ranges(disabled))
        if not off:
            out.add(item.name)
    return out


PASS_TCP = "virtualInbound -> InboundPassthroughCluster"
PASS_HTTP = "virtualInbound-catchall-http -> http InboundPassthroughCluster"


def test_strict_passthrough_refuses_plaintext_and_other_tls() -> None:
    """inboundStrictFilterChainMatchOptions on the passthrough chains: under STRICT, plaintext
    to a port no service declares reaches no chain, and TLS that is not the mesh's meets the
    mesh's handshake, which requires a client certificate (Istio's simulation: "mtls strict",
    passthrough port: plaintext fails, mTLS passes)."""
    inbound = virtual_inbound(MESH + peer_authentication("STRICT"))
    assert reached(inbound, 6000, PLAINTEXT) is None
    assert reached(inbound, 6000, PLAINTEXT_HTTP) is None
    assert reached(inbound, 6000, MESH_TCP) == PASS_TCP + " (mTLS)"
    assert reached(inbound, 6000, MESH_HTTP) == PASS_HTTP + " (mTLS)"
    assert reached(inbound, 6000, OTHER_TLS) == PASS_TCP + " (mTLS)"
    assert not [c.name for c in inbound.filter_chains if c.filter_chain_match.transport_protocol == "raw_buffer"]
    # 15006 itself is still dropped rather than looped.
    assert reached(inbound, 15006, PLAINTEXT) == "virtualInbound-blackhole -> BlackHoleCluster"


def test_permissive_passthrough_takes_plaintext_mesh_tls_and_the_apps_own_tls() -> None:
    """inboundPermissiveFilterChainMatchWithMxcOptions: five chains, the last passing TLS that is
    not the mesh's to the app untouched."""
    inbound = virtual_inbound(MESH)
    assert reached(inbound, 6000, PLAINTEXT) == PASS_TCP
    assert reached(inbound, 6000, PLAINTEXT_HTTP) == PASS_HTTP
    assert reached(inbound, 6000, MESH_TCP) == PASS_TCP + " (mTLS)"
    assert reached(inbound, 6000, MESH_HTTP) == PASS_HTTP + " (mTLS)"
    assert reached(inbound, 6000, OTHER_TLS) == PASS_TCP


def test_port_level_strict_on_an_undeclared_port_gets_passthrough_chains_of_its_own() -> None:
    """ForPassthrough: a port-level mode for a port no service declares gets passthrough chains
    matched on that port."""
    inbound = virtual_inbound(MESH + peer_authentication("PERMISSIVE", {6000: "STRICT"}))
    assert reached(inbound, 6000, PLAINTEXT) is None
    assert reached(inbound, 6000, MESH_TCP) == PASS_TCP + " (mTLS)"
    assert reached(inbound, 6001, PLAINTEXT) == PASS_TCP


#: Per port and mode: what plaintext, sniffed plaintext HTTP, the mesh's mutual TLS and an app's
#: own TLS reach.
DECLARED_PORTS = [
    # inboundStrictHTTPFilterChainMatchOptions / inboundStrictTCPFilterChainMatchOptions
    (8080, "STRICT", [None, None, "http inbound|8080|| (mTLS)", "http inbound|8080|| (mTLS)"]),
    (9000, "STRICT", [None, None, "inbound|9000|| (mTLS)", "inbound|9000|| (mTLS)"]),
    # inboundPermissiveHTTPFilterChainMatchWithMxcOptions: no chain for TLS not the mesh's
    (8080, "PERMISSIVE", ["http inbound|8080||", "http inbound|8080||", "http inbound|8080|| (mTLS)", None]),
    # inboundPermissiveTCPFilterChainMatchWithMxcOptionsAndPlainTLS
    (9000, "PERMISSIVE", ["inbound|9000||", "inbound|9000||", "inbound|9000|| (mTLS)", "inbound|9000||"]),
    # inboundPlainText*FilterChainMatchOptions
    (8080, "DISABLE", ["http inbound|8080||"] * 4),
    (9000, "DISABLE", ["inbound|9000||"] * 4),
]


def test_declared_ports_follow_istios_match_tables() -> None:
    """Plaintext, sniffed plaintext HTTP, the mesh's mutual TLS and an app's own TLS to a declared
    port, per mode. Under DISABLE no chain of the port matches TLS, so the TLS inspector is off
    there and TLS arrives as bytes (a connection manager then refuses them, as in Istio)."""
    for port, mode, expected in DECLARED_PORTS:
        inbound = virtual_inbound(MESH + peer_authentication(mode))
        got = []
        for arrival in (PLAINTEXT, PLAINTEXT_HTTP, MESH_HTTP if port == 8080 else MESH_TCP, OTHER_TLS):
            result = reached(inbound, port, arrival)
            got.append(result.split(" -> ", 1)[1] if result is not None else None)
        assert got == expected, (port, mode)


@pytest.mark.parametrize("mode", ["PERMISSIVE", "STRICT"])
def test_port_without_protocol_is_sniffed_for_http(mode: str) -> None:
    """ListenerProtocolAuto (inboundPermissiveFilterChainMatchWithMxcOptions,
    inboundStrictFilterChainMatchOptions): HTTP over the mesh's mutual TLS and sniffed plaintext
    HTTP reach a connection manager with Istio's inbound route (`inbound|http|7070`), so
    HTTP-level policy applies; anything else a TCP proxy."""
    inbound = virtual_inbound(MESH + peer_authentication(mode))
    assert reached(inbound, 7070, MESH_HTTP) == "0.0.0.0_7070 -> http inbound|7070|| (mTLS)"
    assert reached(inbound, 7070, MESH_TCP) == "0.0.0.0_7070 -> inbound|7070|| (mTLS)"
    if mode == "PERMISSIVE":
        assert reached(inbound, 7070, PLAINTEXT_HTTP) == "0.0.0.0_7070 -> http inbound|7070||"
        assert reached(inbound, 7070, PLAINTEXT) == "0.0.0.0_7070 -> inbound|7070||"
        assert reached(inbound, 7070, OTHER_TLS) == "0.0.0.0_7070 -> inbound|7070||"
        assert HTTP_INSPECTOR in enabled_inspectors(inbound, 7070)
    else:
        assert reached(inbound, 7070, PLAINTEXT_HTTP) is None
    assert HTTP_INSPECTOR not in enabled_inspectors(inbound, 9000)
    http = next(c for c in inbound.filter_chains if c.filter_chain_match.destination_port.value == 7070)
    hcm = hcm_pb2.HttpConnectionManager()
    http.filters[-1].typed_config.Unpack(hcm)
    assert hcm.route_config.virtual_hosts[0].name == "inbound|http|7070"


SIDECAR_TLS = """---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web}
spec:
  workloadSelector: {labels: {app: web}}
  ingress:
  - port: {number: 8443, protocol: HTTPS, name: https}
    defaultEndpoint: 127.0.0.1:8080
    tls: {mode: SIMPLE, serverCertificate: /etc/web/cert.pem, privateKey: /etc/web/key.pem}
"""


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # buildInboundListeners: "This can only apply when the TLS mode is DISABLE".
        ("DISABLE", ["10.0.0.5_8443 -> http inbound|8443|| (TLS)"]),
        # Otherwise the port takes the mesh's mutual TLS, as an HTTP port (HTTPS after termination).
        ("STRICT", ["10.0.0.5_8443 -> http inbound|8443|| (mTLS)"]),
    ],
)
def test_sidecar_ingress_tls_applies_only_under_disable(mode: str, expected: list[str]) -> None:
    inbound = virtual_inbound(MESH + SIDECAR_TLS + peer_authentication(mode))
    chains = [c for c in inbound.filter_chains if c.filter_chain_match.destination_port.value == 8443]
    assert len(chains) == 1
    assert [reached(inbound, 8443, OTHER_TLS)] == expected
    assert reached(inbound, 8443, PLAINTEXT) is None


def test_sidecar_with_ingress_replaces_the_services_inbound_ports() -> None:
    """buildInboundChainConfigs without ENABLE_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE: the
    Sidecar's ingress listeners are the inbound ports; the service's 8080, 9000 and 7070 go to
    the passthrough chains, and get no inbound cluster."""
    snapshot = snapshot_from_yaml(MESH + SIDECAR_TLS + peer_authentication("DISABLE"))
    generated = generate_config(snapshot, bind_proxy(parse_node_id(NODE, REDIRECT), snapshot))
    inbound = next(item for item in generated[types.LISTENER] if item.name == "virtualInbound")
    ports = {c.filter_chain_match.destination_port.value for c in inbound.filter_chains}
    assert ports == {0, 15006, 8443}
    assert reached(inbound, 8080, PLAINTEXT_HTTP) == PASS_HTTP
    clusters = {c.name for c in generated[types.CLUSTER] if c.name.startswith("inbound|")}  # type: ignore[attr-defined]
    assert clusters == {"inbound|8443||"}


def test_chains_are_named_as_istio_names_them() -> None:
    """inboundChainConfig.Name: every chain of a service port is `0.0.0.0_PORT` (mutual TLS or
    not), a Sidecar ingress listener's is named after the proxy's unicast address
    (getSidecarInboundBindIPs), the passthrough chains `virtualInbound` and
    `virtualInbound-catchall-http`."""
    inbound = virtual_inbound(MESH)
    names = {c.filter_chain_match.destination_port.value: set() for c in inbound.filter_chains}
    for chain in inbound.filter_chains:
        names[chain.filter_chain_match.destination_port.value].add(chain.name)
    assert names == {
        0: {"virtualInbound", "virtualInbound-catchall-http"},
        15006: {"virtualInbound-blackhole"},
        7070: {"0.0.0.0_7070"},
        8080: {"0.0.0.0_8080"},
        9000: {"0.0.0.0_9000"},
    }
    with_sidecar = virtual_inbound(MESH + SIDECAR_TLS)
    assert {c.name for c in with_sidecar.filter_chains if c.filter_chain_match.destination_port.value == 8443} == {
        "10.0.0.5_8443"
    }


def test_without_the_mesh_certificates_strict_accepts_nothing_and_permissive_no_mutual_tls() -> None:
    """A proxy whose xDS connection proves no workload is sent no certificate: it cannot
    terminate the mesh's TLS, so it keeps only the chains that do not."""
    strict = virtual_inbound(MESH + peer_authentication("STRICT"), certificates=False)
    assert [c.name for c in strict.filter_chains] == ["virtualInbound-blackhole"]
    permissive = virtual_inbound(MESH, certificates=False)
    assert not [c for c in permissive.filter_chains if c.HasField("transport_socket")]
    assert reached(permissive, 6000, OTHER_TLS) == PASS_TCP


def test_a_vm_sidecar_ingress_listener_takes_the_same_chains_on_its_own_address() -> None:
    """INTERCEPTION_MODE NONE: a Sidecar ingress listener binds the VM's address
    (`inboundCustomListener`), with the chains a redirected port gets: a port without a protocol
    is sniffed under PERMISSIVE, and STRICT refuses plaintext there."""
    sidecar = """---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web}
spec:
  workloadSelector: {labels: {app: web}}
  ingress: [{port: {number: 7443, name: web}, defaultEndpoint: "127.0.0.1:7070"}]
"""
    none = {"INTERCEPTION_MODE": "NONE"}
    permissive = listeners(MESH + sidecar, none)["10.0.0.5_7443"]
    assert reached(permissive, 7443, PLAINTEXT_HTTP) == "10.0.0.5_7443 -> http inbound|7443||"
    assert reached(permissive, 7443, OTHER_TLS) == "10.0.0.5_7443 -> inbound|7443||"
    strict = listeners(MESH + sidecar + peer_authentication("STRICT"), none)["10.0.0.5_7443"]
    assert reached(strict, 7443, PLAINTEXT_HTTP) is None
    assert reached(strict, 7443, MESH_HTTP) == "10.0.0.5_7443 -> http inbound|7443|| (mTLS)"
