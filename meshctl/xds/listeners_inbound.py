"""Sidecar inbound listeners: traffic to the proxy's own workload, handed to the app on its port.

The inbound ports (Istio's `buildInboundChainConfigs`) are the ports of the Sidecar's `ingress`
listeners when it has any (they replace the services' ports, as in Istio without
`ENABLE_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE`: a service port they do not list is left to the
passthrough chains), else the distinct endpoint ports of the services the workload is an endpoint
of (Istio's service targets). Each goes to the cluster `inbound|PORT||`: HTTP through an HCM with
Istio's inline inbound route config (virtual host `inbound|http|SERVICEPORT`, every domain, no
timeout, a retry of requests reset before they were sent), anything else through tcp_proxy. A
port without a declared protocol gets both, told apart by the HTTP inspector.

A port's chains follow its PeerAuthentication mode and protocol by Istio's match tables
(`inbound_match`): STRICT mutual TLS only, PERMISSIVE mutual TLS (told by Istio's ALPN values),
plaintext and, on TCP and sniffed ports, TLS that is not the mesh's passed to the app untouched,
DISABLE plaintext. Every chain of a port is named after it, as Istio names them: `0.0.0.0_9080`
for a service port, the proxy's address (`10.0.0.5_9080`) or the listener's `bind` for a Sidecar
ingress listener.

How traffic arrives decides the listener:

- INTERCEPTION_MODE NONE (the VM default, no iptables): as in Istio, only the Sidecar's `ingress`
  listeners, each bound to the proxy's IP (or the listener's `bind`), handing traffic to the app at
  its `defaultEndpoint` (`127.0.0.1:8080`). Without iptables the app already owns its ports (often
  on every address, where Envoy could not bind beside it), so meshctl does not take them on its
  own: the app keeps serving clients directly, and a Sidecar ingress opts a port into the proxy.
  Nothing reaches the proxy on the other ports, so no PeerAuthentication or policy applies there
  (`meshctl validate` says so: MC0002, MC0005). A proxy on a loopback address binds it, where
  Istio (naming by a unicast address only) would bind 0.0.0.0.
- REDIRECT/TPROXY: iptables sends inbound traffic to `virtualInbound` (0.0.0.0:15006), which has
  the chains of each port (matched on the original destination port), a chain that drops traffic
  aimed at 15006 itself, and passthrough chains (`buildInboundPassthroughChains`) sending
  everything else to the original destination through `InboundPassthroughCluster`, under the
  workload's mode (STRICT refuses plaintext there too) and under their own port-level modes.

A Sidecar ingress listener with `tls` (SIMPLE/MUTUAL with certificate files) terminates TLS on
that port, as Istio does with `ENABLE_TLS_ON_SIDECAR_INGRESS`, but only where the port's mode is
DISABLE: otherwise the mesh's mutual TLS wins, as in Istio, and a warning says so.

Every chain that hands traffic to the workload (each port's mutual TLS and plaintext chains, and
the passthrough chains of `virtualInbound`) enforces the AuthorizationPolicies that select it:
RBAC HTTP filters first in the HCM, RBAC network filters before tcp_proxy (`rbac`).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import wrappers_pb2

from meshctl.api.networking.v1alpha3 import gateway_pb2
from meshctl.registry.model import Protocol
from meshctl.security.peer_authentication import MtlsMode
from meshctl.snapshot.binding import binds_to_port
from meshctl.snapshot.interception import InterceptionMode
from meshctl.snapshot.model import spec
from meshctl.xds import listener_filters as lf
from meshctl.xds import mesh_tls
from meshctl.xds.inbound_match import ChainProtocol, match_options, own_tls_options
from meshctl.xds.inbound_view import InboundView
from meshctl.xds.listener_tls import downstream_tls_context, unsupported_reason
from meshctl.xds.names import (
    BLACKHOLE_CLUSTER,
    INBOUND_PASSTHROUGH_CLUSTER,
    VIRTUAL_INBOUND,
    VIRTUAL_INBOUND_CATCHALL_HTTP,
    VIRTUAL_INBOUND_PORT,
    WILDCARD,
    inbound_cluster,
    listener_name,
)
from meshctl.xds.rbac import InboundAuthz

logger = logging.getLogger("meshctl.xds.listeners")

_TLS = gateway_pb2.ServerTLSSettings
_TERMINATING_MODES: Final = frozenset({_TLS.SIMPLE, _TLS.MUTUAL, _TLS.OPTIONAL_MUTUAL})


@dataclass(frozen=True, slots=True)
class InboundPort:
    """One port the proxy accepts traffic on for its workload."""

    target: int  # the port the app listens on, and the one matched on
    service_port: int
    protocol: Protocol
    hostname: str  # for the trace decorator, as Istio
    bind: str
    bind_to_port: bool
    tls: Any = None  # ServerTLSSettings to terminate, from a Sidecar ingress listener


def port_protocol(port: Any) -> Protocol:
    """A Sidecar port's protocol, else the one its name implies (`http-api`), as for services."""
    return Protocol.parse(port.protocol) if port.protocol else Protocol.from_port_name(port.name)


def inbound_ports(view: InboundView) -> list[InboundPort]:
    """The proxy's inbound ports by target port (Istio's `buildInboundChainConfigs`). A Sidecar
    with `ingress` listeners declares them all: the services' ports are left to the passthrough
    chains, as in Istio without ENABLE_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE. Otherwise the
    services' endpoint ports, unless nothing redirects traffic to the proxy (INTERCEPTION_MODE
    NONE). On a port named twice the first wins (Istio keeps the oldest service)."""
    proxy = view.proxy.value
    none_mode = proxy.interception is InterceptionMode.NONE
    sidecar = view.sidecar_config
    ingress = list(spec(sidecar).ingress) if sidecar is not None else []
    by_port: dict[int, InboundPort] = {}
    for inst in () if none_mode or ingress else proxy.instances:
        for sp in inst.service.ports:
            target = inst.endpoint.ports.get(sp.number)
            if target is None or sp.protocol is Protocol.UDP:
                continue
            old = by_port.get(target)
            if old is not None:
                if old.protocol is not sp.protocol:
                    logger.warning(
                        "%s: inbound port %d is %s for %s and %s for %s; keeping %s",
                        proxy.id,
                        target,
                        old.protocol,
                        old.hostname,
                        sp.protocol,
                        inst.service.hostname,
                        old.hostname,
                    )
                continue
            by_port[target] = InboundPort(target, sp.number, sp.protocol, inst.service.hostname, WILDCARD, False)
    for ing in ingress:
        assert sidecar is not None
        number = ing.port.number
        if number in by_port:
            continue
        bind_to_port = binds_to_port(ing.capture_mode, proxy.interception)
        # Istio binds (or names) the listener on the proxy's unicast address, else on 0.0.0.0; a VM
        # proxy on a loopback address still binds that address, where its app's port is free.
        bind = ing.bind or (proxy.ip if bind_to_port or _global_unicast(proxy.ip) else WILDCARD)
        where = f"{sidecar.namespace}/{sidecar.name}"
        tls = _ingress_tls(ing, where, proxy.node.mesh_certificates) if ing.HasField("tls") else None
        protocol = port_protocol(ing.port)
        if ing.HasField("tls"):
            protocol = _after_termination(protocol)
        host = f"{sidecar.name}.{sidecar.namespace}"  # Istio's synthetic name for telemetry
        by_port[number] = InboundPort(number, number, protocol, host, bind, bind_to_port, tls)
    return [by_port[p] for p in sorted(by_port)]


def _global_unicast(ip: str) -> bool:
    """Go's `IsGlobalUnicast`, which Istio's `GlobalUnicastIP` is chosen by (private ranges count)."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or str(address) == "255.255.255.255"
    )


def _ingress_tls(ing: Any, sidecar: str, mesh_certificates: bool) -> Any:
    tls = ing.tls
    if tls.mode not in _TERMINATING_MODES:
        logger.warning(
            "Sidecar %s ingress port %d: TLS mode %s cannot terminate; serving plaintext",
            sidecar,
            ing.port.number,
            _TLS.TLSmode.Name(tls.mode),
        )
        return None
    reason = unsupported_reason(tls, mesh_certificates=mesh_certificates)
    if reason is not None:
        logger.warning("Sidecar %s ingress port %d: %s; serving plaintext", sidecar, ing.port.number, reason)
        return None
    return tls


def _after_termination(protocol: Protocol) -> Protocol:
    if protocol is Protocol.HTTPS:
        return Protocol.HTTP
    if protocol is Protocol.TLS:
        return Protocol.TCP
    return protocol


#: BuildDefaultHTTPInboundRoute's retries: a request Envoy could not even start to send (the
#: app closed an idle keep-alive connection just as it was picked) is sent again, twice at most.
INBOUND_RETRY_ON: Final = "reset-before-request"
INBOUND_RETRY_ATTEMPTS: Final = 2


def inbound_route_config(
    cluster: str, hostname: str, service_port: int, protocol: Protocol
) -> route_pb2.RouteConfiguration:
    """Istio's `buildSidecarInboundHTTPRouteConfig` with BuildDefaultHTTPInboundRoute:
    everything to the app, never timing out (the caller's sidecar owns timeouts; a gRPC caller's
    `grpc-timeout` is not applied here either), and retried when it was reset before it was sent
    (features.EnableInboundRetryPolicy), except for gRPC, whose streams that retry does not suit."""
    action = route_components_pb2.RouteAction(cluster=cluster, timeout=lf.zero_duration())
    action.max_stream_duration.max_stream_duration.CopyFrom(lf.zero_duration())
    action.max_stream_duration.grpc_timeout_header_max.CopyFrom(lf.zero_duration())
    if protocol not in (Protocol.GRPC, Protocol.GRPC_WEB):
        action.retry_policy.retry_on = INBOUND_RETRY_ON
        action.retry_policy.num_retries.value = INBOUND_RETRY_ATTEMPTS
    route = route_components_pb2.Route(
        name="default",
        match=route_components_pb2.RouteMatch(prefix="/"),
        decorator=route_components_pb2.Decorator(operation=f"{hostname}:{service_port}/*"),
        route=action,
    )
    vhost = route_components_pb2.VirtualHost(name=f"inbound|http|{service_port}", domains=["*"], routes=[route])
    return route_pb2.RouteConfiguration(
        name=cluster, virtual_hosts=[vhost], validate_clusters=wrappers_pb2.BoolValue(value=False)
    )


def _inbound_hcm(stat_prefix: str, route_config: route_pb2.RouteConfiguration, http2: bool, authz: InboundAuthz) -> Any:
    """Istio's buildSidecarInboundHTTPOpts: client certificate details appended and forwarded,
    responses named `istio-envoy` (ProxyHeaders of ListenerClassSidecarInbound), HTTP/2 options
    for HTTP/2 and gRPC ports; the workload's RBAC filters before the others."""
    hcm = lf.http_connection_manager(
        stat_prefix=stat_prefix, route_config=route_config, server_name=lf.ISTIO_SERVER_NAME, leading_filters=authz.http
    )
    hcm.forward_client_cert_details = hcm_pb2.HttpConnectionManager.APPEND_FORWARD
    details = hcm.set_current_client_cert_details
    details.subject.value = True
    details.dns = True
    details.uri = True
    if http2:
        hcm.http2_protocol_options.SetInParent()
    return hcm


def _chain_filters(port: InboundPort, name: str, *, http: bool, authz: InboundAuthz) -> list[Any]:
    """An HTTP chain's connection manager with Istio's inline inbound route, or a TCP chain's
    RBAC and tcp_proxy."""
    cluster = inbound_cluster(port.target)
    if http:
        rc = inbound_route_config(cluster, port.hostname, port.service_port, port.protocol)
        return [lf.hcm_filter(_inbound_hcm(f"inbound_{name}", rc, port.protocol.is_http2, authz))]
    return [*authz.network, *lf.cluster_filters(cluster)]


def inbound_chains(port: InboundPort, view: InboundView, authz: InboundAuthz | None = None) -> list[lf.ChainOpts]:
    """The filter chains of one inbound port (Istio's `buildInboundListeners` per chain config):
    its own TLS when a Sidecar ingress listener sets `tls` and the port's mTLS mode is DISABLE,
    else the chains of its mTLS mode and protocol (`inbound_match`). Every chain is named after
    the port (`0.0.0.0_9080`, `10.0.0.5_9080` for a Sidecar ingress listener) and enforces the
    same `authz` (by default the view's policies)."""
    if authz is None:
        authz = inbound_authz(view)
    trust_domain = view.mesh.trust_domain
    mode = view.mtls.for_port(port.target)
    protocol = port.protocol
    name = listener_name(port.bind, port.target)
    if port.tls is not None and mode is MtlsMode.DISABLE:
        chain_protocol = ChainProtocol.of(protocol)
        options = own_tls_options(chain_protocol)
        own_context = downstream_tls_context(port.tls, trust_domain=trust_domain)
    else:
        if port.tls is not None:
            logger.warning(
                "%s: Sidecar ingress port %d sets tls, but the port's mTLS mode is %s; as in Istio, "
                "the ingress tls is used only under DISABLE, so the port takes the mesh's mutual TLS",
                view.proxy.value.id,
                port.target,
                mode.value,
            )
        options = match_options(
            mode, ChainProtocol.of(protocol), mesh_certificates=view.proxy.value.node.mesh_certificates
        )
        own_context = None
    chains = []
    for option in options:
        context = None
        if option.terminate:
            context = own_context if own_context is not None else mesh_tls.downstream_context(trust_domain, option.http)
        chains.append(
            lf.ChainOpts(
                filters=_chain_filters(port, name, http=option.http, authz=authz),
                destination_port=port.target,
                transport_protocol=option.transport,
                application_protocols=option.alpns,
                tls_context=context,
                name=name,
                kind="http" if option.http else "tcp",
            )
        )
    return chains


def _inbound_listener(
    name: str, ip: str, port: int, chains: list[lf.ChainOpts], *, bound: bool, interception: InterceptionMode
) -> listener_pb2.Listener:
    listener = listener_pb2.Listener(
        name=name,
        address=lf.socket_address(ip, port),
        traffic_direction=base_pb2.TrafficDirection.INBOUND,
        continue_on_listener_filters_timeout=True,
        listener_filters_timeout=lf.zero_duration(),
    )
    if not bound:
        listener.listener_filters.append(lf.original_dst())
        if interception is InterceptionMode.TPROXY:
            listener.listener_filters.append(lf.original_src())
            listener.transparent.value = True
    listener.listener_filters.extend(lf.inspectors(chains))
    listener.filter_chains.extend(c.to_chain() for c in chains)
    return listener


def inbound_authz(view: InboundView) -> InboundAuthz:
    """The RBAC filters of the view's workload."""
    return InboundAuthz(
        view.authorization_policies,
        view.mesh.trust_domain,
        ignored=view.ignored_authorization_policies,
        jwt_rules=view.jwt_rules,
    )


def _passthrough_chains(view: InboundView, declared: set[int], authz: InboundAuthz) -> list[lf.ChainOpts]:
    """Istio's `buildInboundPassthroughChains`: 15006 itself is dropped (it would loop), and
    traffic to any other port no chain declares goes to its original destination, through the
    workload's RBAC filters as every inbound chain, with the chains of the workload's mTLS mode
    for a sniffed port (so STRICT refuses plaintext there too). A port-level mode for a port no
    chain declares gets passthrough chains of its own (`ForPassthrough`)."""
    blackhole = lf.ChainOpts(
        filters=lf.cluster_filters(BLACKHOLE_CLUSTER),
        destination_port=VIRTUAL_INBOUND_PORT,
        name=f"{VIRTUAL_INBOUND}-blackhole",
    )
    trust_domain = view.mesh.trust_domain
    certificates = view.proxy.value.node.mesh_certificates
    rc = inbound_route_config(INBOUND_PASSTHROUGH_CLUSTER, "", 0, Protocol.HTTP)
    modes = [(0, view.mtls.mode), *((p, m) for p, m in view.mtls.ports if p not in declared)]
    out = [blackhole]
    for port, mode in modes:
        for option in match_options(mode, ChainProtocol.AUTO, mesh_certificates=certificates):
            if option.http:
                filters = [lf.hcm_filter(_inbound_hcm(INBOUND_PASSTHROUGH_CLUSTER, rc, http2=False, authz=authz))]
            else:
                filters = [*authz.network, *lf.cluster_filters(INBOUND_PASSTHROUGH_CLUSTER)]
            context = mesh_tls.downstream_context(trust_domain, option.http) if option.terminate else None
            out.append(
                lf.ChainOpts(
                    filters=filters,
                    destination_port=port,
                    application_protocols=option.alpns,
                    transport_protocol=option.transport,
                    tls_context=context,
                    name=VIRTUAL_INBOUND_CATCHALL_HTTP if option.http else VIRTUAL_INBOUND,
                    kind="http" if option.http else "tcp",
                )
            )
    return out


def build_inbound(view: InboundView) -> list[listener_pb2.Listener]:
    """Bound inbound listeners, and `virtualInbound` when traffic is redirected."""
    interception = view.proxy.value.interception
    out = []
    virtual_chains: list[lf.ChainOpts] = []
    proxy = view.proxy.value
    authz = inbound_authz(view)
    for port in inbound_ports(view):
        chains = inbound_chains(port, view, authz)
        if not chains:
            logger.warning(
                "%s: inbound port %d is STRICT mutual TLS but the proxy gets no workload certificate; "
                "it accepts no connection there",
                proxy.id,
                port.target,
            )
            continue
        if port.bind_to_port:
            name = listener_name(port.bind, port.target)
            out.append(_inbound_listener(name, port.bind, port.target, chains, bound=True, interception=interception))
        else:
            virtual_chains.extend(chains)
    if interception is not InterceptionMode.NONE:
        declared = {c.destination_port for c in virtual_chains}
        chains = _passthrough_chains(view, declared, authz) + virtual_chains
        out.append(
            _inbound_listener(
                VIRTUAL_INBOUND, WILDCARD, VIRTUAL_INBOUND_PORT, chains, bound=False, interception=interception
            )
        )
    elif virtual_chains:
        logger.warning(
            "%s: Sidecar ingress ports %s use IPTABLES capture but the proxy has INTERCEPTION_MODE NONE; "
            "no listener serves them",
            view.proxy.value.id,
            ", ".join(str(c.destination_port) for c in virtual_chains),
        )
    return out
