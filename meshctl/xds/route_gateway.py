"""Route configurations of a router (an ingress or egress gateway), as istiod builds them
(pilot/pkg/networking/core/gateway.go, buildGatewayHTTPRouteConfig, and model/gateway.go).

The servers of every Gateway selecting the router are grouped the way Istio merges them: all
plain-HTTP servers on one port share `http.PORT` (hosts tell them apart inside it), and each
HTTPS server that terminates TLS gets its own `https.PORT.PORTNAME.GATEWAY.NAMESPACE`, since its
filter chain (and certificate) is its own. A port holds either plain-HTTP servers or TLS ones:
whichever comes first keeps it, as in Istio. Passthrough TLS and TCP servers have no routes.

A virtual host exists for each host that a server exposes and a VirtualService bound to that
Gateway routes: the more specific of the two when a wildcard meets a name (`*.example.com` on
the server and `api.example.com` in the VirtualService give `api.example.com`), with any port in
the Host header (the route configuration ignores it, as Istio's does). Requests for
other hosts get Envoy's 404, since there is no catch-all; a server with `httpsRedirect` answers
every host it exposes with a redirect to HTTPS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from meshctl.config.hosts import host_matches
from meshctl.config.model import Config
from meshctl.registry.model import Protocol
from meshctl.snapshot.model import spec
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.names import gateway_https_route_name, gateway_route_name
from meshctl.xds.route_actions import http_routes
from meshctl.xds.route_context import route_configuration, route_context, virtual_service_hosts
from meshctl.xds.route_delegate import effective_http
from meshctl.xds.route_domains import domain_name
from meshctl.xds.route_match import is_catch_all

# ServerTLSSettings.TLSmode values that do not terminate TLS on the gateway.
_PASSTHROUGH_MODES = frozenset({"PASSTHROUGH", "AUTO_PASSTHROUGH"})


@dataclass
class _ServerGroup:
    """The servers behind one route configuration, each with the Gateway it belongs to."""

    port: int
    servers: list[tuple[Any, Config]] = field(default_factory=list)


def _is_plain_http(server: Any) -> bool:
    return Protocol.parse(server.port.protocol).is_http


def _terminates_https(server: Any) -> bool:
    if Protocol.parse(server.port.protocol) is not Protocol.HTTPS:
        return False
    if not server.HasField("tls"):
        return True
    return type(server.tls).TLSmode.Name(server.tls.mode) not in _PASSTHROUGH_MODES


def route_name_for(server: Any, gateway: Config) -> str | None:
    """The route configuration a gateway server's listener names (Istio's gatewayRDSRouteName),
    with `.BIND` appended when the server binds an address; None for servers without routes."""
    bind = f".{server.bind}" if server.bind else ""
    if _is_plain_http(server):
        return f"{gateway_route_name('http', server.port.number)}{bind}"
    if _terminates_https(server):
        name = gateway_https_route_name(server.port.number, server.port.name, gateway.name, gateway.namespace)
        return f"{name}{bind}"
    return None


def gateway_server_groups(scope: ProxyScope) -> dict[str, _ServerGroup]:
    """Route configuration name -> the servers it serves, for the Gateways selecting the router."""
    plain_ports: dict[int, bool] = {}
    out: dict[str, _ServerGroup] = {}
    for gateway in scope.gateways:
        for server in spec(gateway).servers:
            port = server.port.number
            plain = _is_plain_http(server)
            # One port carries plain HTTP or TLS, never both: the first server decides.
            if plain_ports.setdefault(port, plain) != plain:
                continue
            name = route_name_for(server, gateway)
            if name is None:
                continue
            out.setdefault(name, _ServerGroup(port)).servers.append((server, gateway))
    return out


def build_gateway_routes(scope: ProxyScope) -> list[route_pb2.RouteConfiguration]:
    return [_route_config(scope, name, group) for name, group in gateway_server_groups(scope).items()]


def server_hosts(server: Any, gateway_namespace: str) -> list[str]:
    """A server's hosts with `./` made the Gateway's namespace and `*/` dropped (Istio's
    sanitizeServerHostNamespace); `*/*` stands for every host."""
    out = []
    for raw in server.hosts:
        ns, sep, host = raw.partition("/")
        if not sep:
            out.append(raw)
        elif ns == ".":
            out.append(f"{gateway_namespace}/{host}")
        elif ns == "*":
            if host == "*":
                return ["*"]
            out.append(host)
        else:
            out.append(raw)
    return out


def hosts_for_namespace(hosts: Sequence[str], namespace: str) -> list[str]:
    """Server hosts a VirtualService in `namespace` may bind: unqualified ones, `*/host`, and
    `namespace/host` (Istio's NamesForNamespace)."""
    out = []
    for h in hosts:
        ns, sep, host = h.partition("/")
        if not sep:
            out.append(h.lower())
        elif ns in (namespace, "*"):
            out.append(host.lower())
    return out


def intersect_hosts(server: Sequence[str], virtual_service: Sequence[str]) -> list[str]:
    """For each server host and VirtualService host that overlap, the narrower of the two."""
    out: list[str] = []
    for a in server:
        for b in virtual_service:
            if host_matches(b, a):
                narrower = a
            elif host_matches(a, b):
                narrower = b
            else:
                continue
            if narrower not in out:
                out.append(narrower)
    return out


def gateway_domains(host: str) -> list[str]:
    """Istio's buildGatewayHTTPRouteConfig: a gateway virtual host answers to the host alone; the
    route configuration ignores the Host header's port (IgnorePortInHostMatching)."""
    return [host]


@dataclass
class _VirtualHost:
    name: str
    domains: list[str]
    routes: list[rc.Route]
    require_tls: bool = False


def _route_config(scope: ProxyScope, name: str, group: _ServerGroup) -> route_pb2.RouteConfiguration:
    vhosts: dict[str, _VirtualHost] = {}
    cache: dict[tuple[str, tuple[str, str]], list[rc.Route]] = {}
    for server, gateway in group.servers:
        gateway_ref = f"{gateway.namespace}/{gateway.name}"
        port = server.port.number
        redirect = server.HasField("tls") and server.tls.https_redirect
        hosts = server_hosts(server, gateway.namespace)
        for vs in scope.virtual_services((gateway_ref,)):
            matched = intersect_hosts(hosts_for_namespace(hosts, vs.namespace), virtual_service_hosts(scope, vs))
            if not matched:
                continue
            key = (gateway_ref, (vs.namespace, vs.name))
            if key not in cache:
                ctx = route_context(scope, port, frozenset({gateway_ref}), is_tls=server.HasField("tls"))
                cache[key] = http_routes(vs, ctx, effective_http(scope, vs))
            routes = cache[key]
            if not routes:
                continue
            for host in matched:
                vh = vhosts.get(host)
                if vh is None:
                    vhosts[host] = _VirtualHost(domain_name(host, port), gateway_domains(host), list(routes), redirect)
                else:
                    vh.routes.extend(routes)
                    vh.require_tls = vh.require_tls or redirect
        if redirect:
            for raw in hosts:
                host = raw.rpartition("/")[2].lower()
                if host in vhosts:
                    vhosts[host].require_tls = True
                else:
                    vhosts[host] = _VirtualHost(domain_name(host, port), gateway_domains(host), [], True)
    if not vhosts:
        # Istio's placeholder: a virtual host that matches everything and routes nothing (404).
        blackhole = rc.VirtualHost(name=domain_name("blackhole", group.port), domains=["*"])
        return route_configuration(name, [blackhole])
    out = [_finish(vh) for vh in _collapse(vhosts)]
    out.sort(key=lambda vh: vh.name)
    return route_configuration(name, out)


def _collapse(vhosts: dict[str, _VirtualHost]) -> list[_VirtualHost]:
    """Hosts with the very same routes share one virtual host (Istio's collapseDuplicateRoutes),
    keyed by the first host in name order, so a VirtualService with many hosts is sent once."""
    by_routes: dict[tuple[tuple[int, ...], bool], _VirtualHost] = {}
    out = []
    for host in sorted(vhosts):
        vh = vhosts[host]
        key = (tuple(id(r) for r in vh.routes), vh.require_tls)
        primary = by_routes.get(key)
        if primary is not None:
            primary.domains.extend(vh.domains)
            continue
        by_routes[key] = vh
        out.append(vh)
    return out


def _finish(vh: _VirtualHost) -> rc.VirtualHost:
    """Catch-all routes move to the end, keeping order otherwise (Istio's SortVHostRoutes): a
    second VirtualService's specific routes must not hide behind the first one's catch-all."""
    routes = [r for r in vh.routes if not is_catch_all(r.match)] + [r for r in vh.routes if is_catch_all(r.match)]
    out = rc.VirtualHost(name=vh.name, domains=vh.domains, routes=routes, include_request_attempt_count=True)
    if vh.require_tls:
        out.require_tls = rc.VirtualHost.ALL
    return out
