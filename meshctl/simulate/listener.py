"""Which listener takes a connection, and which of its filter chains, as Envoy decides.

With no interception (`INTERCEPTION_MODE: NONE`, the VM default) the application connects to a
port the proxy binds: the outbound listener on 127.0.0.1:PORT or 0.0.0.0:PORT, or, for a name the
proxy's DNS listener answers, on the address it answers (a TCP service's own loopback address). With REDIRECT or
TPROXY, iptables sends every outbound connection to `virtualOutbound` (15001), whose
`use_original_dst` hands it to the listener for the original destination (IP:PORT, else
0.0.0.0:PORT); with none, `virtualOutbound`'s own chains take it. A router's (gateway's)
listeners are bound on their ports.

Filter chain match follows Envoy's order of criteria (destination port, destination IP, server
name, transport protocol, application protocols), each narrowing to the most specific chains
that state a matching value, or else to those that state none. Source criteria are not modelled.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.filters.udp.dns_filter.v3 import dns_filter_pb2

from meshctl.simulate.request import Request

VIRTUAL_OUTBOUND = "virtualOutbound"
_HTTP_INSPECTOR = "envoy.filters.listener.http_inspector"
_TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"
_LOCAL = ("127.0.0.1", "0.0.0.0", "::", "::1")
_DNS_FILTER = "envoy.filters.udp.dns_filter"


@dataclass(frozen=True, slots=True)
class Connection:
    """What the filter chain match sees of a new connection."""

    port: int
    address: str | None
    server_name: str
    transport: str
    application_protocols: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ChainChoice:
    """The listener and filter chain that took the connection, and its network filter."""

    listener: str
    chain: str
    hcm: hcm_pb2.HttpConnectionManager | None = None
    tcp: tcp_proxy_pb2.TcpProxy | None = None


def _port(listener: Any) -> int:
    return int(listener.address.socket_address.port_value)


def _address(listener: Any) -> str:
    return str(listener.address.socket_address.address)


def _ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def bound_listener(listeners: Sequence[Any], request: Request, router: bool, resolved: str | None = None) -> Any | None:
    """The listener a connection to the URL's port reaches when nothing intercepts it: for a
    sidecar an outbound one on a local address, for a router any on the port; a listener on
    the URL's literal IP (or the address its name `resolved` to) before a wildcard one."""
    ip = _ip_literal(request.host) or resolved
    on_port = [ln for ln in listeners if _port(ln) == request.port and _binds(ln)]
    if not router:
        on_port = [
            ln
            for ln in on_port
            if ln.traffic_direction != 1 and (_address(ln) in _LOCAL or _address(ln) == ip)  # 1: INBOUND
        ]
    exact = [ln for ln in on_port if ip is not None and _address(ln) == ip]
    return (exact or on_port or [None])[0]


def dns_answer(listeners: Sequence[Any], host: str) -> str | None:
    """The address the proxy's DNS listener answers for `host` (`xds/dns_table.py`), or None
    (an IP literal, a name it does not know, a proxy with no DNS listener)."""
    if _ip_literal(host) is not None:
        return None
    for listener in listeners:
        for listener_filter in listener.listener_filters:
            if listener_filter.name != _DNS_FILTER:
                continue
            config = dns_filter_pb2.DnsFilterConfig()
            listener_filter.typed_config.Unpack(config)
            for domain in config.server_config.inline_dns_table.virtual_domains:
                if domain.name == host.lower().rstrip(".") and domain.endpoint.address_list.address:
                    return str(domain.endpoint.address_list.address[0])
    return None


def _binds(listener: Any) -> bool:
    return not listener.HasField("bind_to_port") or bool(listener.bind_to_port.value)


def handed_off_listener(listeners: Sequence[Any], request: Request) -> Any | None:
    """The listener `virtualOutbound` hands a redirected connection to (`use_original_dst`):
    the one on the original IP:PORT, else on 0.0.0.0:PORT; None when there is neither."""
    ip = _ip_literal(request.host)
    on_port = [ln for ln in listeners if _port(ln) == request.port and ln.name != VIRTUAL_OUTBOUND]
    exact = [ln for ln in on_port if ip is not None and _address(ln) == ip]
    wildcard = [ln for ln in on_port if _address(ln) in ("0.0.0.0", "::")]
    return (exact or wildcard or [None])[0]


def connection_for(listener: Any, request: Request) -> Connection:
    """What the listener filters of `listener` detect of a plaintext or TLS connection."""
    filters = {f.name for f in listener.listener_filters}
    tls = request.scheme in ("https", "tls")
    transport = "tls" if tls and _TLS_INSPECTOR in filters else "raw_buffer"
    if not request.is_http:
        protocols: tuple[str, ...] = ()  # no ALPN, and bytes the HTTP inspector does not take for HTTP
    elif tls:
        protocols = ("h2", "http/1.1") if _TLS_INSPECTOR in filters else ()
    else:
        protocols = ("http/1.1",) if _HTTP_INSPECTOR in filters else ()
    sni = request.server_name if request.scheme == "tls" else request.host
    server_name = sni if tls and _TLS_INSPECTOR in filters else ""
    return Connection(request.port, _ip_literal(request.host), server_name, transport, protocols)


def choose_chain(listener: Any, connection: Connection) -> tuple[int, Any] | None:
    """The filter chain Envoy picks for `connection` (its index, -1 for the default chain), or
    None when no chain matches and the listener has no default: Envoy closes the connection."""
    candidates = list(enumerate(listener.filter_chains))
    steps: list[Callable[[Any], int | None]] = [
        lambda m: _port_rank(m, connection.port),
        lambda m: _ip_rank(m, connection.address),
        lambda m: _server_name_rank(m, connection.server_name),
        lambda m: _value_rank(bool(m.transport_protocol), m.transport_protocol == connection.transport),
        lambda m: _value_rank(
            bool(m.application_protocols), any(p in connection.application_protocols for p in m.application_protocols)
        ),
    ]
    for rank in steps:
        candidates = _narrow(candidates, rank)
    if candidates:
        return candidates[0]
    if listener.HasField("default_filter_chain"):
        return -1, listener.default_filter_chain
    return None


def _narrow(candidates: list[tuple[int, Any]], rank: Callable[[Any], int | None]) -> list[tuple[int, Any]]:
    """Keep the chains whose stated value matches best (highest rank > 0); if none states a
    matching value, those that state nothing (rank 0). None: states a value that does not match."""
    ranked = [(rank(chain.filter_chain_match), i, chain) for i, chain in candidates]
    best = max((r for r, _, _ in ranked if r is not None and r > 0), default=None)
    if best is not None:
        return [(i, chain) for r, i, chain in ranked if r == best]
    return [(i, chain) for r, i, chain in ranked if r == 0]


def _value_rank(stated: bool, matched: bool) -> int | None:
    if not stated:
        return 0
    return 1 if matched else None


def _port_rank(match: Any, port: int) -> int | None:
    return _value_rank(match.HasField("destination_port"), match.destination_port.value == port)


def _ip_rank(match: Any, address: str | None) -> int | None:
    """The longest prefix range holding the destination address (its length + 1)."""
    if not match.prefix_ranges:
        return 0
    if address is None:
        return None
    ip = ipaddress.ip_address(address)
    best = None
    for cidr in match.prefix_ranges:
        try:
            network = ipaddress.ip_network(f"{cidr.address_prefix}/{cidr.prefix_len.value}", strict=False)
        except ValueError:
            continue
        if ip.version == network.version and ip in network:
            best = max(best or 0, network.prefixlen + 1)
    return best


def _server_name_rank(match: Any, server_name: str) -> int | None:
    """An exact server name before the longest wildcard (`*.example.com`) that covers it."""
    if not match.server_names:
        return 0
    if not server_name:
        return None
    best = None
    for name in match.server_names:
        if name == server_name:
            return 1 << 16
        if name.startswith("*.") and server_name.endswith(name[1:]):
            best = max(best or 0, len(name))
    return best


def describe_chain(index: int, chain: Any) -> str:
    """A chain by its name, else by its position (`#0`, `default`), with what it matches."""
    label = chain.name or ("default" if index < 0 else f"#{index}")
    match = chain.filter_chain_match
    parts = []
    if match.HasField("destination_port"):
        parts.append(f"port {match.destination_port.value}")
    if match.server_names:
        parts.append("SNI " + ",".join(match.server_names))
    if match.transport_protocol:
        parts.append(match.transport_protocol)
    if match.application_protocols:
        parts.append("ALPN " + ",".join(match.application_protocols))
    return f"{label} ({'; '.join(parts)})" if parts else label


def network_filter(listener_name: str, chain_label: str, chain: Any) -> ChainChoice:
    """The chain's terminal network filter: an HTTP connection manager or a TCP proxy."""
    for item in chain.filters:
        url = item.typed_config.type_url
        if url.endswith("/" + hcm_pb2.HttpConnectionManager.DESCRIPTOR.full_name):
            hcm = hcm_pb2.HttpConnectionManager()
            item.typed_config.Unpack(hcm)
            return ChainChoice(listener_name, chain_label, hcm=hcm)
        if url.endswith("/" + tcp_proxy_pb2.TcpProxy.DESCRIPTOR.full_name):
            tcp = tcp_proxy_pb2.TcpProxy()
            item.typed_config.Unpack(tcp)
            return ChainChoice(listener_name, chain_label, tcp=tcp)
    return ChainChoice(listener_name, chain_label)
