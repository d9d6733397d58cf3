"""Proxyless gRPC servers (gRFC A36): the listener a server built with `grpc.xds_server_credentials`
asks for before it serves.

A gRPC xDS server listening on `IP:PORT` asks for the listener named by the bootstrap's
template, `xds.istio.io/grpc/lds/inbound/IP:PORT` as Istio and `meshctl bootstrap --grpc` write
it, and serves nothing until it gets one whose address is the one it listens on. Its node is
bound to its workload like any proxy's, so for every port its workload serves a service on
(`Proxy.instance_ports`) it is offered the listener under each address it may listen on: the
workload's own, and the wildcard ones (`0.0.0.0`, `[::]`).

The listener has one filter chain: an HTTP connection manager whose inline route answers every
call (`non_forwarding_action`: a server routes nothing, it serves) and the router. Its TLS
follows the port's PeerAuthentication mode: STRICT requires the mesh's mutual TLS, with the
workload's certificate and the root from the certificate provider `default` (the workload's
files); PERMISSIVE and DISABLE serve plaintext, as Istio does for gRPC servers (gRPC cannot tell a
TLS connection from a plaintext one on one port). The AuthorizationPolicies that select the
workload become RBAC filters before the router, built as for an Envoy's inbound HTTP chains
(`rbac.filter_rules`), each under its own name (gRPC refuses two filters of one name); gRPC
enforces `rules` and ignores dry-run `shadow_rules`.
"""

from __future__ import annotations

from typing import Final

from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from meshctl.security.peer_authentication import MtlsMode
from meshctl.xds.inbound_view import InboundView
from meshctl.xds.mesh_tls import ROOT_SECRET, WORKLOAD_SECRET
from meshctl.xds.rbac import HTTP_RBAC, filter_rules, http_filter

#: Istio's prefix of gRPC server listener names (`grpcxds.ServerListenerNamePrefix`).
SERVER_LISTENER_PREFIX: Final = "xds.istio.io/grpc/lds/inbound/"
CERTIFICATE_PROVIDER: Final = "default"
_WILDCARDS: Final = ("0.0.0.0", "::")
_HCM_FILTER: Final = "envoy.filters.network.http_connection_manager"


def _typed(message: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def server_listener_name(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{SERVER_LISTENER_PREFIX}{host}:{port}"


def build_grpc_inbound(view: InboundView) -> list[listener_pb2.Listener]:
    """The server listeners of a gRPC node's workload, sorted by name."""
    proxy = view.proxy.value
    rules = filter_rules(view.authorization_policies, trust_domain=view.mesh.trust_domain, for_tcp=False)
    rbac = []
    for i, rule in enumerate(rules):
        made = http_filter(rule)
        made.name = f"{HTTP_RBAC}.{i}" if i else HTTP_RBAC
        rbac.append(made)
    out = []
    for port in sorted(proxy.instance_ports):
        strict = view.mtls.for_port(port) is MtlsMode.STRICT
        for ip in dict.fromkeys((proxy.ip, *_WILDCARDS)):
            out.append(server_listener(ip, port, strict=strict, rbac=rbac))
    return sorted(out, key=lambda listener: listener.name)


def server_listener(
    ip: str, port: int, *, strict: bool, rbac: list[hcm_pb2.HttpFilter] | None = None
) -> listener_pb2.Listener:
    route = route_pb2.RouteConfiguration(name="inbound|" + str(port))
    vh = route.virtual_hosts.add(name="inbound|http|" + str(port), domains=["*"])
    vh.routes.append(rc.Route(match=rc.RouteMatch(prefix="/"), non_forwarding_action=rc.NonForwardingAction()))
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=f"inbound_{port}",
        route_config=route,
        http_filters=[
            *(rbac or ()),
            hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=_typed(router_pb2.Router())),
        ],
    )
    chain = listener_components_pb2.FilterChain(
        name=f"inbound|{port}",
        filters=[listener_components_pb2.Filter(name=_HCM_FILTER, typed_config=_typed(hcm))],
    )
    if strict:
        chain.transport_socket.name = "envoy.transport_sockets.tls"
        chain.transport_socket.typed_config.CopyFrom(_typed(_downstream_tls()))
    listener = listener_pb2.Listener(name=server_listener_name(ip, port), filter_chains=[chain])
    listener.address.socket_address.address = ip
    listener.address.socket_address.port_value = port
    listener.traffic_direction = 1  # INBOUND
    return listener


def _downstream_tls() -> tls_pb2.DownstreamTlsContext:
    out = tls_pb2.DownstreamTlsContext()
    out.require_client_certificate.value = True
    common = out.common_tls_context
    common.tls_certificate_provider_instance.instance_name = CERTIFICATE_PROVIDER
    common.tls_certificate_provider_instance.certificate_name = WORKLOAD_SECRET
    validation = common.combined_validation_context.default_validation_context
    validation.ca_certificate_provider_instance.instance_name = CERTIFICATE_PROVIDER
    validation.ca_certificate_provider_instance.certificate_name = ROOT_SECRET
    return out
