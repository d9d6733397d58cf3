"""Gateway listeners: one `0.0.0.0_PORT` listener per port of the Gateway servers selecting a router.

Servers are merged per port as Istio's `mergeGateways` does, the first server on a port deciding
its kind:

- plaintext HTTP servers share one filter chain and the RDS route config `http.PORT`;
- HTTPS servers that terminate TLS get a chain each, matched on the SNI of their hosts (`*` means
  no SNI match), with their own DownstreamTlsContext and route config
  `https.PORT.PORTNAME.GATEWAY.NAMESPACE`;
- TLS PASSTHROUGH servers get a chain per VirtualService `tls` match bound to the gateway, matched
  on its `sniHosts`, forwarding with tcp_proxy;
- TCP servers (and TLS servers terminating TLS) forward with tcp_proxy per the first VirtualService
  `tcp` route bound to the gateway.

A server that conflicts with the port's kind (plaintext next to TLS, a second TCP server), repeats
another TLS server's hosts, or asks for TLS meshctl cannot serve (credentialName, ISTIO_MUTUAL,
AUTO_PASSTHROUGH, see `listener_tls`) is left out with a warning naming the Gateway and port.
`httpsRedirect` needs nothing here: the route config answers plaintext requests with a redirect.
A server `bind` gives the listener that address (`10.0.0.5_80`) and, as in Istio, suffixes its
route config names with `.BIND`. Istio translates a server port to the target port of the
gateway's own Kubernetes Service (`resolvePorts`); a VM gateway has no Kubernetes Service, so
the server port is the port bound, and `meshctl dump` says so for a gateway whose own
ServiceEntry maps the port elsewhere (`targetPort`), where mesh clients would be sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from meshctl.config.model import Config
from meshctl.registry.model import Protocol
from meshctl.security.authorization import ignored_policies
from meshctl.security.authorization import policies_for_workload as authorization_policies
from meshctl.security.request_authentication import jwt_rules_for_workload
from meshctl.snapshot.model import spec
from meshctl.snapshot.scope import ProxyScope, gateway_ref
from meshctl.xds import listener_filters as lf
from meshctl.xds.listener_l4 import Filters, gateway_hosts_match, gateway_refs, route_filters
from meshctl.xds.listener_tls import downstream_tls_context, is_passthrough, unsupported_reason
from meshctl.xds.names import gateway_https_route_name, gateway_route_name, listener_name
from meshctl.xds.rbac import InboundAuthz

logger = logging.getLogger("meshctl.xds.listeners")

WILDCARD: Final = "0.0.0.0"


@dataclass(slots=True)
class GatewayServer:
    """One server of one Gateway, with its hosts' namespaces resolved."""

    gateway: Config
    server: Any
    protocol: Protocol
    tls: Any  # ServerTLSSettings or None
    hosts: tuple[str, ...]

    @property
    def number(self) -> int:
        return int(self.server.port.number)

    @property
    def bind(self) -> str:
        return str(self.server.bind)

    @property
    def ref(self) -> str:
        return gateway_ref(self.gateway)

    @property
    def is_http_server(self) -> bool:
        """Istio's `IsHTTPServer`: HTTP, or HTTPS terminating TLS."""
        return self.protocol.is_http or self.terminates_https

    @property
    def terminates_https(self) -> bool:
        return self.protocol is Protocol.HTTPS and self.tls is not None and not is_passthrough(self.tls)

    @property
    def is_tls_server(self) -> bool:
        """Istio's `IsTLSServer`: a non-HTTP server with TLS settings (terminated or passed through)."""
        return self.tls is not None and not self.protocol.is_http

    @property
    def sni_hosts(self) -> tuple[str, ...]:
        return tuple(sorted({h.partition("/")[2] or h for h in self.hosts}))

    @property
    def route_name(self) -> str:
        """Istio's `gatewayRDSRouteName`; empty for servers without an HCM."""
        suffix = f".{self.bind}" if self.bind else ""
        if self.protocol.is_http:
            return gateway_route_name("http", self.number) + suffix
        if self.terminates_https:
            gw = self.gateway
            return gateway_https_route_name(self.number, self.server.port.name, gw.name, gw.namespace) + suffix
        return ""

    def describe(self) -> str:
        return f"Gateway {self.gateway.namespace}/{self.gateway.name} server {self.number}/{self.server.port.protocol}"


@dataclass(slots=True)
class MergedPort:
    """The servers that share one listener (a port and bind)."""

    number: int
    bind: str
    protocol: Protocol
    servers: list[GatewayServer] = field(default_factory=list)

    @property
    def name(self) -> str:
        return listener_name(self.bind or WILDCARD, self.number)


def _sanitize_hosts(hosts: Any, namespace: str) -> tuple[str, ...]:
    """Istio's `sanitizeServerHostNamespace`: `./h` -> `NS/h`, `*/h` -> `h`, `*/*` -> `*`."""
    out = []
    for h in hosts:
        ns, sep, host = h.partition("/")
        if not sep:
            out.append(h)
        elif ns == ".":
            out.append(f"{namespace}/{host}")
        elif ns == "*":
            if host == "*":
                return ("*",)
            out.append(host)
        else:
            out.append(h)
    return tuple(out)


def merge_servers(scope: ProxyScope) -> list[MergedPort]:
    """The Gateway servers selecting the router, merged per listener as Istio's `mergeGateways`:
    the first server on a port and bind decides what else may join it."""
    merged: dict[tuple[int, str], MergedPort] = {}
    route_names: set[str] = set()
    tls_hosts: dict[tuple[int, str], set[str]] = {}
    for gw in scope.gateways:
        for s in spec(gw).servers:
            if not s.HasField("port"):
                continue
            srv = GatewayServer(
                gateway=gw,
                server=s,
                protocol=Protocol.parse(s.port.protocol),
                tls=s.tls if s.HasField("tls") else None,
                hosts=_sanitize_hosts(s.hosts, gw.namespace),
            )
            if srv.bind.startswith("unix://"):
                # Gateways on unix sockets serve in-host clients only; not offered on VMs yet.
                logger.warning("%s: a unix socket bind (%s) is not supported; server skipped", srv.describe(), srv.bind)
                continue
            is_tls = srv.is_tls_server or srv.terminates_https
            if is_tls:
                reason = unsupported_reason(
                    srv.tls, mesh_certificates=scope.proxy.mesh_certificates, credentials=scope.proxy.credentials
                )
                if reason is not None:
                    logger.warning("%s: %s; server skipped", srv.describe(), reason)
                    continue
            key = (srv.number, srv.bind)
            port = merged.get(key)
            if port is not None and not _may_join(port, srv, route_names):
                continue
            if is_tls:
                # Two chains with the same SNI match would make Envoy reject the listener.
                known = tls_hosts.setdefault(key, set())
                dups = sorted(known.intersection(srv.hosts))
                if dups:
                    logger.warning(
                        "%s: hosts %s are already served on this port; server skipped", srv.describe(), ", ".join(dups)
                    )
                    continue
                known.update(srv.hosts)
            if port is None:
                merged[key] = MergedPort(srv.number, srv.bind, srv.protocol, [srv])
            else:
                port.servers.append(srv)
            if srv.route_name:
                route_names.add(srv.route_name)
    return list(merged.values())


def _may_join(port: MergedPort, srv: GatewayServer, route_names: set[str]) -> bool:
    """Whether `srv` can share `port`'s listener: plaintext HTTP with plaintext HTTP, TLS servers
    with TLS servers (told apart by SNI), HTTPS servers only with a route config of their own."""
    first = port.servers[0]
    if not first.is_tls_server:
        if srv.is_tls_server or not (srv.protocol.is_http and first.protocol.is_http):
            logger.warning(
                "%s conflicts with %s on listener %s; server skipped", srv.describe(), first.describe(), port.name
            )
            return False
        return True
    if srv.tls is None:
        logger.warning("%s has no TLS settings but listener %s serves TLS; server skipped", srv.describe(), port.name)
        return False
    if srv.route_name and srv.route_name in route_names:
        logger.warning(
            "%s: route config %s is already used (port names must differ); server skipped",
            srv.describe(),
            srv.route_name,
        )
        return False
    return True


# -- listeners --------------------------------------------------------------------------------


def _gateway_hcm(stat_prefix: str, rds: str, authz: InboundAuthz) -> hcm_pb2.HttpConnectionManager:
    """Istio's `buildGatewayConnectionManager`: the client address is the real one, client
    certificate details are sanitized and set from the connection, and responses name the
    server `istio-envoy` (ProxyHeaders of ListenerClassGateway); the gateway's RequestAuthentication
    and AuthorizationPolicy filters first."""
    hcm = lf.http_connection_manager(
        stat_prefix=stat_prefix,
        rds=rds,
        use_remote_address=True,
        server_name=lf.ISTIO_SERVER_NAME,
        leading_filters=authz.http,
    )
    hcm.forward_client_cert_details = hcm_pb2.HttpConnectionManager.SANITIZE_SET
    details = hcm.set_current_client_cert_details
    details.subject.value = True
    details.cert = True
    details.dns = True
    details.uri = True
    hcm.http_protocol_options.SetInParent()
    return hcm


def _virtual_services(scope: ProxyScope, srv: GatewayServer) -> list[Config]:
    """VirtualServices bound to the server's Gateway that serve one of its hosts."""
    return [
        vs
        for vs in scope.virtual_services((srv.ref,))
        if gateway_hosts_match(srv.hosts, srv.gateway.namespace, vs, scope)
    ]


def _l4_match(match: Any, srv: GatewayServer, vs_namespace: str) -> bool:
    """Istio's `l4SingleMatch` on a gateway: the server's port and this Gateway."""
    if match.port and match.port != srv.number:
        return False
    wanted = gateway_refs(match.gateways, vs_namespace)
    return not wanted or srv.ref in wanted


def _tcp_filters(scope: ProxyScope, srv: GatewayServer) -> Filters:
    """The first VirtualService `tcp` route that matches the server (Istio's
    `buildGatewayNetworkFiltersFromTCPRoutes`)."""
    for vs in _virtual_services(scope, srv):
        for tcp in spec(vs).tcp:
            if tcp.route and (not tcp.match or any(_l4_match(m, srv, vs.namespace) for m in tcp.match)):
                return route_filters(scope, tcp.route, srv.number, vs)
    return []


def _passthrough_chains(scope: ProxyScope, srv: GatewayServer) -> list[lf.ChainOpts]:
    """A chain per VirtualService `tls` match, on its SNI hosts (Istio's
    `buildGatewayNetworkFiltersFromTLSRoutes`)."""
    out = []
    for vs in _virtual_services(scope, srv):
        for tls in spec(vs).tls:
            if not tls.route:
                continue
            for m in tls.match:
                if _l4_match(m, srv, vs.namespace):
                    out.append(
                        lf.ChainOpts(
                            filters=route_filters(scope, tls.route, srv.number, vs),
                            sni_hosts=tuple(m.sni_hosts),
                            origin=f"VirtualService {vs.namespace}/{vs.name}",
                        )
                    )
    return out


def _server_chains(scope: ProxyScope, port: MergedPort, srv: GatewayServer, authz: InboundAuthz) -> list[lf.ChainOpts]:
    if srv.terminates_https:
        hcm = _gateway_hcm(srv.server.name or f"outbound_{port.name}", srv.route_name, authz)
        return [
            lf.ChainOpts(
                filters=[lf.hcm_filter(hcm)],
                sni_hosts=srv.sni_hosts,
                tls_context=downstream_tls_context(srv.tls, trust_domain=scope.snapshot.mesh.trust_domain),
                kind="http",
                origin=srv.describe(),
            )
        ]
    if srv.tls is not None and is_passthrough(srv.tls):
        return [_authorized(c, authz) for c in _passthrough_chains(scope, srv)]
    filters = _tcp_filters(scope, srv)
    if not filters:
        return []
    filters = [*authz.network, *filters]
    if srv.tls is None:
        return [lf.ChainOpts(filters=filters, origin=srv.describe())]
    return [
        lf.ChainOpts(
            filters=filters,
            sni_hosts=srv.sni_hosts,
            tls_context=downstream_tls_context(srv.tls, trust_domain=scope.snapshot.mesh.trust_domain),
            origin=srv.describe(),
        )
    ]


def _authorized(chain: lf.ChainOpts, authz: InboundAuthz) -> lf.ChainOpts:
    """`chain` with the gateway's network RBAC filters in front of its own."""
    chain.filters = [*authz.network, *chain.filters]
    return chain


def gateway_authz(scope: ProxyScope) -> InboundAuthz:
    """The RequestAuthentication and AuthorizationPolicy filters of the router's workload: Istio
    enforces the policies that select a gateway on its listeners, as a sidecar's on its inbound
    ones."""
    snapshot, proxy = scope.snapshot, scope.proxy
    return InboundAuthz(
        authorization_policies(snapshot, proxy.namespace, proxy.labels),
        snapshot.mesh.trust_domain,
        ignored=ignored_policies(snapshot, proxy.namespace),
        jwt_rules=jwt_rules_for_workload(snapshot, proxy.namespace, proxy.labels),
        clear_route_cache=True,
    )


def _port_chains(scope: ProxyScope, port: MergedPort, authz: InboundAuthz) -> list[lf.ChainOpts]:
    first = port.servers[0]
    if first.protocol.is_http:
        # Every plaintext HTTP server of the port is a set of virtual hosts in one route config.
        hcm = _gateway_hcm(f"outbound_{port.name}", first.route_name, authz)
        return [lf.ChainOpts(filters=[lf.hcm_filter(hcm)], kind="http", origin=first.describe())]
    chains: list[lf.ChainOpts] = []
    for srv in port.servers:
        new = _server_chains(scope, port, srv, authz)
        if not new:
            logger.warning(
                "%s: no VirtualService %s route bound to the gateway matches it; nothing to forward to",
                srv.describe(),
                "tls" if srv.tls is not None and is_passthrough(srv.tls) else "tcp",
            )
        for dropped in lf.merge_chains(chains, new):
            logger.warning(
                "listener %s: %s matches the same connections as an earlier chain; skipped", port.name, dropped.origin
            )
    return chains


def build_gateway(scope: ProxyScope) -> list[listener_pb2.Listener]:
    """A listener per merged port of the router's Gateways; a port with nothing to serve has none."""
    out = []
    authz = gateway_authz(scope)
    for port in merge_servers(scope):
        chains = _port_chains(scope, port, authz)
        if not chains:
            logger.warning("listener %s has no filter chain; not generated", port.name)
            continue
        listener = listener_pb2.Listener(
            name=port.name,
            address=lf.socket_address(port.bind or WILDCARD, port.number),
            traffic_direction=base_pb2.TrafficDirection.OUTBOUND,
            # Gateways wait for the TLS handshake as long as it takes: the inspector is only
            # there when the chains need what it detects.
            listener_filters_timeout=lf.zero_duration(),
        )
        listener.listener_filters.extend(lf.inspectors(chains))
        listener.filter_chains.extend(c.to_chain() for c in chains)
        out.append(listener)
    return out
