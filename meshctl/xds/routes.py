"""RDS: a proxy's route configurations, as istiod builds them (pilot/pkg/networking/core/httproute.go).

A sidecar gets one route configuration per HTTP service port it can call, named by the port
(`9080`); its outbound listener on that port names it. In it, every service with that port gets
a virtual host `HOST:PORT` answering to the service's names and addresses (with any port in the
Host header: route configurations ignore it, as Istio's do), routed by the
VirtualService that claims the host or, without one, by a default route to the service's
cluster (with Istio's default retries and no timeout). A catch-all virtual host comes last:
`allow_any` to PassthroughCluster when the outbound policy is ALLOW_ANY (to
AllowAnyDynamicDNSCluster under ALLOW_ANY_DYNAMIC_DNS), `block_all` (502) under REGISTRY_ONLY.
A virtual host whose routes reach a dynamic forward proxy cluster (a DYNAMIC_DNS service's, the
catch-all's) enables the DFP HTTP filter of that cluster's DNS cache (`dynamic_forward`).

A router (gateway) gets one per plain-HTTP server port (`http.80`) and one per TLS-terminating
HTTPS server (`https.443.https.GATEWAY.NS`), holding the hosts its servers expose that
VirtualServices bound to the Gateway route (see `route_gateway`).

Every VirtualService HTTP route is translated by `route_actions`; generation is a pure function
of the scope, and the result is sorted by name. With a memo, the server's builds take over what
the build before of the same route configuration found where it read the same
(`route_drafts`), so a change costs the pieces it touched, not the namespace's services.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from meshctl.config.hosts import hosts_overlap
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Protocol, Service
from meshctl.snapshot.interception import InterceptionMode
from meshctl.snapshot.model import spec
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.scope import MESH_GATEWAY, ProxyScope, parse_egress_hosts
from meshctl.xds import dynamic_forward as dfp
from meshctl.xds import route_policy as policy
from meshctl.xds.names import PASSTHROUGH_CLUSTER, sidecar_route_name
from meshctl.xds.resources import Serialized
from meshctl.xds.route_actions import ConsistentHash, RouteContext, http_routes
from meshctl.xds.route_assembly import assemble_route_configuration, virtual_host_field
from meshctl.xds.route_context import (
    destination_cluster,
    route_configuration,
    route_context,
    service_hash,
    service_on_port,
    virtual_service_hosts,
)
from meshctl.xds.route_delegate import effective_http
from meshctl.xds.route_drafts import Basis, DraftKey, KeptVirtualHost, RouteDraftState, VirtualServiceGroup, tell
from meshctl.xds.route_gateway import build_gateway_routes
from meshctl.xds.route_memo import RouteMemo
from meshctl.xds.route_plan import DomainPlan, Host, domain_plan

__all__ = ["build_route_resources", "build_routes", "destination_cluster", "route_configuration"]

#: Names of the catch-all virtual hosts (and their routes), as Istio names them.
ALLOW_ANY = "allow_any"
BLOCK_ALL = "block_all"
DEFAULT_ROUTE = "default"
#: Istio's hack: VirtualService hosts outside the registry are served on port 80 only.
_PLAIN_HTTP_PORT = 80


def build_routes(scope: ProxyScope, memo: RouteMemo | None = None) -> list[route_pb2.RouteConfiguration]:
    """Every route configuration of the proxy, sorted by name; with `memo`, a sidecar's
    VirtualService translations are reused where they read the same (`route_memo`)."""
    router = scope.proxy.type is ProxyType.ROUTER
    configs = build_gateway_routes(scope) if router else build_sidecar_routes(scope, memo)
    return sorted(configs, key=lambda c: c.name)


def build_route_resources(scope: ProxyScope, memo: RouteMemo) -> list[route_pb2.RouteConfiguration | Serialized]:
    """`build_routes`, with a sidecar's route configurations as their bytes, assembled from
    virtual hosts serialized once (`route_assembly`): what the server serializes anyway, without
    building the whole messages. The same bytes as `build_routes`' messages serialized."""
    if scope.proxy.type is ProxyType.ROUTER:
        return list(build_routes(scope, memo))
    out = [_assembled(config, memo) for config in _sidecar_route_drafts(scope, memo)]
    return sorted(out, key=lambda c: c.name)


def build_sidecar_routes(scope: ProxyScope, memo: RouteMemo | None = None) -> list[route_pb2.RouteConfiguration]:
    return [config.message() for config in _sidecar_route_drafts(scope, memo)]


def _sidecar_route_drafts(scope: ProxyScope, memo: RouteMemo | None) -> list[_RouteDraft]:
    ports = sorted({p.number for s in scope.services for p in s.ports if _has_routes(p.protocol)})
    virtual_services = scope.virtual_services((MESH_GATEWAY,))
    configs = [
        _sidecar_route_config(
            scope, port, virtual_services, {s.hostname: s for s in scope.services if s.port(port)}, memo
        )
        for port in ports
    ]
    configs.extend(_egress_route_configs(scope, set(ports), virtual_services, memo))
    return configs


def _egress_route_configs(
    scope: ProxyScope, taken: set[int], virtual_services: Sequence[Config], memo: RouteMemo | None
) -> list[_RouteDraft]:
    """Route configs for Sidecar egress listeners on an HTTP port no service has (a VM whose app
    owns a service port reaches that service on another local port): each holds the services the
    listener imports, each reached on its own port (the one it has, or its only HTTP port)."""
    sidecar = scope.sidecar
    if sidecar is None:
        return []
    out = []
    for listener in spec(sidecar).egress:
        number = listener.port.number
        # As the listener decides it: declared, else implied by the name, else sniffed.
        protocol = (
            Protocol.parse(listener.port.protocol)
            if listener.port.protocol
            else Protocol.from_port_name(listener.port.name)
        )
        if not number or number in taken or not _has_routes(protocol):
            continue
        taken.add(number)
        hosts = parse_egress_hosts(listener.hosts, scope.proxy.namespace)
        services: dict[str, Service] = {}
        for svc in scope.services:
            if not any(h.covers(svc.namespace, svc.hostname) for h in hosts):
                continue
            http_ports = [p for p in svc.ports if p.protocol.is_http]
            own = svc.port(number) or (http_ports[0] if len(http_ports) == 1 else None)
            if own is not None:
                services[svc.hostname] = dataclasses.replace(svc, ports=(own,))
        out.append(_sidecar_route_config(scope, number, virtual_services, services, memo, egress=True))
    return out


@dataclass
class _HostGroup:
    """Hosts that share one list of routes: a VirtualService's, or a service's default."""

    routes: tuple[rc.Route, ...]
    services: list[Service] = field(default_factory=list)
    #: VirtualService hosts that name no service (`api.example.com`): served under their own name.
    other_hosts: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _VirtualHostDraft:
    """Everything a sidecar virtual host is made of; `message` builds it."""

    name: str
    domains: tuple[str, ...]
    routes: tuple[rc.Route, ...]
    #: the dynamic forward proxy cache its routes fill, if any
    dfp_cache: str | None

    def message(self) -> rc.VirtualHost:
        vh = rc.VirtualHost(
            name=self.name, domains=self.domains, routes=self.routes, include_request_attempt_count=True
        )
        if self.dfp_cache is not None:
            dfp.enable(vh, self.dfp_cache)
        return vh


@dataclass(frozen=True, slots=True)
class _RouteDraft:
    """A sidecar route configuration before it is built: its virtual hosts in order, the
    catch-all (if any) last."""

    name: str
    virtual_hosts: list[_VirtualHostDraft]
    catch_all: rc.VirtualHost | None
    #: this build, kept for the next (`route_drafts`), with the key to keep it by
    kept: tuple[DraftKey, RouteDraftState, dict[str, KeptVirtualHost]] | None = None

    def message(self) -> route_pb2.RouteConfiguration:
        hosts = [vh.message() for vh in self.virtual_hosts]
        return route_configuration(self.name, hosts if self.catch_all is None else [*hosts, self.catch_all])


def _assembled(draft: _RouteDraft, memo: RouteMemo) -> Serialized:
    """The draft's route configuration as bytes, each virtual host serialized once per what it
    is made of: the route messages the memo shares stand, by identity, for their content. A
    virtual host the build before made alike keeps its bytes (`route_drafts`)."""
    kept = draft.kept
    made = kept[2] if kept is not None else {}
    fields = []
    for vh in draft.virtual_hosts:
        found = made.get(vh.name)
        if found is not None and found.draft is vh and found.data:
            fields.append(found.data[0])
            continue
        data = memo.virtual_hosts.field(
            (vh.name, vh.domains, tuple(map(id, vh.routes)), vh.dfp_cache), vh.routes, vh.message
        )
        if found is not None and found.draft is vh:
            found.data.append(data)
        fields.append(data)
    if draft.catch_all is not None:
        fields.append(virtual_host_field(draft.catch_all))
    if kept is not None:
        memo.keep_draft(kept[0], kept[1])
    return assemble_route_configuration(draft.name, fields)


def _sidecar_route_config(
    scope: ProxyScope,
    port: int,
    virtual_services: Sequence[Config],
    services: dict[str, Service],
    memo: RouteMemo | None = None,
    *,
    egress: bool = False,
) -> _RouteDraft:
    """The route config of listener port `port`, over `services` (each of which either has that
    port, or has been reduced to the one port it is reached on from this listener). With `memo`,
    what the build before of the same configuration found is taken over where it read the same
    (`route_drafts`), and this build is kept for the next."""
    reduced = any(s.port(port) is None for s in services.values())
    lookup = services.get if reduced else service_on_port(scope, port)
    ctx = route_context(scope, port, frozenset({MESH_GATEWAY}), lookup)
    key: DraftKey = (scope.proxy, port, egress)
    prior = memo.draft(key) if memo is not None else None
    basis = Basis.of(scope)
    same_basis = prior is not None and prior.basis.same(basis)
    same_rules = prior is not None and prior.basis.same_rules(basis)
    groups: list[_HostGroup] = []
    claimed: set[str] = set()
    made_groups: dict[ConfigKey, VirtualServiceGroup] = {}
    for vs in virtual_services:
        found = prior.groups.get(vs.key) if same_basis and prior is not None else None
        if found is not None and found.vs is vs and (same_rules or found.rules_hold(scope)) and found.holds(scope):
            found.told(scope)
            made = found
            if memo is not None:
                memo.kept(found.translations)
                memo.groups_kept += 1
        else:
            made = _virtual_service_group(scope, vs, services, ctx, memo)
            if memo is not None:
                memo.groups_made += 1
        made_groups[vs.key] = made
        if made.group is not None:
            routes, http_services, other_hosts = made.group
            groups.append(_HostGroup(routes, list(http_services), list(other_hosts)))
            claimed.update(s.hostname for s in http_services)
    defaults = prior.defaults if prior is not None else {}
    made_defaults: dict[str, tuple[Service, object, tuple[rc.Route, ...]]] = {}
    for host in sorted(services):
        svc = services[host]
        if host not in claimed and _is_http(svc, port):
            rule = scope.destination_rule(host)  # what the default route reads of the rules
            was = defaults.get(host)
            if was is not None and was[0] is svc and was[1] is rule:
                if memo is not None:
                    memo.defaults_kept += 1
                made_defaults[host] = was
            else:
                made_defaults[host] = (svc, rule, (_default_route(scope, svc, port, memo),))
            groups.append(_HostGroup(made_defaults[host][2], [svc]))
    virtual_hosts, state = _virtual_hosts(scope, port, groups, memo, prior)
    # A VirtualService for `*` on port 80 already catches everything; Envoy refuses a second `*`.
    catch_all = None if any("*" in vh.domains for vh in virtual_hosts) else _catch_all(scope)
    kept = None
    if memo is not None:
        hosts, plan, made_hosts = state
        kept = (key, RouteDraftState(basis, made_groups, made_defaults, hosts, plan, made_hosts), made_hosts)
    return _RouteDraft(sidecar_route_name(port), virtual_hosts, catch_all, kept)


def _virtual_service_group(
    scope: ProxyScope, vs: Config, services: dict[str, Service], ctx: RouteContext, memo: RouteMemo | None
) -> VirtualServiceGroup:
    """What `vs` makes of the route configuration of `port`: its routes and the hosts they
    serve, or None; with the rules and short names it asked for, and the scope's answers to
    which VirtualService routes each host it claimed or passed over."""
    rule_trace, name_trace = scope.rule_trace, scope.name_trace
    rules: dict[str, object] = {}
    names: set[tuple[str, str]] = set()
    scope.rule_trace, scope.name_trace = rules, names
    claims: list[tuple[str, ConfigKey | None]] = []
    noted: list[Any] = []
    try:
        group = _group_of(scope, vs, services, ctx, memo, claims=claims, noted=noted)
    finally:
        scope.rule_trace, scope.name_trace = rule_trace, name_trace
    tell(scope, rules, names)
    delegates = any(r.HasField("delegate") for r in spec(vs).http)
    return VirtualServiceGroup(vs, group, tuple(claims), rules, frozenset(names), delegates, tuple(noted))


def _group_of(
    scope: ProxyScope,
    vs: Config,
    services: dict[str, Service],
    ctx: RouteContext,
    memo: RouteMemo | None,
    *,
    claims: list[tuple[str, ConfigKey | None]],
    noted: list[Any],
) -> tuple[tuple[rc.Route, ...], tuple[Service, ...], tuple[str, ...]] | None:
    port = ctx.listen_port
    hosts = virtual_service_hosts(scope, vs)
    if port != _PLAIN_HTTP_PORT and not _overlaps_any(hosts, services):
        return None
    http = effective_http(scope, vs)
    routes = memo.routes(vs, ctx, http, noted) if memo is not None else http_routes(vs, ctx, http)
    if not routes:
        # No route applies to this proxy: its hosts keep their default routes, as in Istio.
        return None
    other_hosts, matched = _claimed_hosts(scope, vs, hosts, services, claims)
    http_services = [s for s in matched if _is_http(s, port)]
    if not http_services and port != _PLAIN_HTTP_PORT:
        return None
    return tuple(routes), tuple(http_services), tuple(other_hosts)


def _overlaps_any(hosts: Sequence[str], services: dict[str, Service]) -> bool:
    """True when a host (exact or wildcard) covers one of `services`, or a service's wildcard
    host covers it: exact hosts by lookup, only wildcards by scanning."""
    if any(h in services for h in hosts):
        return True
    wild_services = [s for s in services if s.startswith("*")]
    for h in hosts:
        if h.startswith("*"):
            if any(hosts_overlap(h, s) for s in services):
                return True
        elif any(hosts_overlap(h, s) for s in wild_services):
            return True
    return False


def _serving_port(svc: Service, port: int) -> int:
    """The service port a request on listener `port` reaches: `port` itself, or the single port
    a service reached through a Sidecar egress listener was reduced to."""
    own = svc.port(port)
    return own.number if own is not None else svc.ports[0].number


def _has_routes(protocol: Protocol) -> bool:
    """HTTP ports, and sniffed ports, whose outbound listeners send what is HTTP to an HCM."""
    return protocol.is_http or protocol.is_sniffed


def _is_http(svc: Service, port: int) -> bool:
    p = svc.port(port) or (svc.ports[0] if len(svc.ports) == 1 else None)
    return p is not None and _has_routes(p.protocol)


def _claimed_hosts(
    scope: ProxyScope,
    vs: Config,
    hosts: Sequence[str],
    services: dict[str, Service],
    claims: list[tuple[str, ConfigKey | None]],
) -> tuple[list[str], list[Service]]:
    """Which services (with the listener's port) this VirtualService routes, and which of its
    hosts name no such service. A service is routed by the one VirtualService the scope picks
    for it (an exact host over the longest wildcard), so no host gets two virtual hosts."""
    other: list[str] = []
    matched: list[Service] = []

    def claim(svc: Service) -> None:
        chosen = scope.virtual_service_for(svc.hostname)
        claims.append((svc.hostname, chosen.key if chosen is not None else None))
        if chosen is not None and chosen.key == vs.key and svc not in matched:
            matched.append(svc)

    for host in hosts:
        if not host.startswith("*"):
            if host in services:
                claim(services[host])
            else:
                other.append(host)
            continue
        found = False
        for svc_host in sorted(services):
            if hosts_overlap(host, svc_host):
                found = True
                claim(services[svc_host])
        if not found:
            other.append(host)
    return other, matched


def _default_route(scope: ProxyScope, svc: Service, port: int, memo: RouteMemo | None = None) -> rc.Route:
    """Istio's BuildDefaultHTTPOutboundRoute: everything to the service's cluster, Istio's
    default retries, no timeout, and the DestinationRule's consistent hash if it has one. A
    function of exactly these, so `memo` shares one per (host, port, target, hash)."""
    target = _serving_port(svc, port)
    hashing = service_hash(scope, svc.hostname, target)
    if memo is None:
        return _build_default_route(svc.hostname, port, target, hashing)
    key = (svc.hostname, port, target, hashing.SerializeToString(deterministic=True) if hashing is not None else None)
    return memo.default_route(key, lambda: _build_default_route(svc.hostname, port, target, hashing))


def _build_default_route(host: str, port: int, target: int, hashing: ConsistentHash | None) -> rc.Route:
    action = rc.RouteAction(cluster=f"outbound|{target}||{host}")
    action.retry_policy.CopyFrom(policy.default_retry_policy())
    policy.set_timeout(action, None)
    hash_policy = policy.hash_policy(hashing)
    if hash_policy is not None:
        action.hash_policy.append(hash_policy)
    return rc.Route(
        name=DEFAULT_ROUTE,
        match=rc.RouteMatch(prefix="/"),
        route=action,
        decorator=rc.Decorator(operation=f"{host}:{port}/*"),
    )


def _virtual_hosts(
    scope: ProxyScope,
    port: int,
    groups: Sequence[_HostGroup],
    memo: RouteMemo | None = None,
    prior: RouteDraftState | None = None,
) -> tuple[list[_VirtualHostDraft], tuple[tuple[Host, ...], DomainPlan | None, dict[str, KeptVirtualHost]]]:
    """One virtual host per service and per other VirtualService host, named `HOST:PORT`,
    with each domain given to the first that asks (Envoy refuses duplicates). The route
    configuration ignores the port of the Host header, so domains carry none (Istio's
    BuildSidecarOutboundVirtualHosts with SidecarIgnorePort: a VirtualService host alone, a
    service's names and addresses from generateVirtualHostDomains without a port).

    Which virtual host gets which domains is a function of the port, the proxy's DNS domain and
    the hosts in order (`route_plan`); with `memo` it is worked out once per those, and shared
    by every namespace and config version that asks for it, or from the plan before where a few
    services came (`updated_plan`). With `prior` (this configuration's build before), its plan
    stands for equal hosts, and each virtual host made of the same parts is taken over. Also
    returns what this build is kept as: the hosts, the plan and the virtual hosts made."""
    proxy_domain = scope.proxy.domain or f"{scope.proxy.namespace}.svc.cluster.local"
    entries: list[tuple[Service | None, tuple[rc.Route, ...]]] = []
    hosts: list[Host] = []
    for group in groups:
        routes = group.routes
        for host in group.other_hosts:
            entries.append((None, routes))
            hosts.append((host, None))
        for svc in group.services:
            entries.append((svc, routes))
            hosts.append((svc.hostname, svc.addresses))
    ordered = tuple(hosts)
    key = (port, proxy_domain, ordered)
    if prior is not None and prior.plan is not None and prior.hosts == ordered:
        plan = prior.plan
    elif memo is None:
        plan = domain_plan(*key)
    else:
        plan = memo.virtual_hosts.plan(key, lambda: memo.virtual_hosts.planned(*key))
    before = prior.virtual_hosts if prior is not None else {}
    made: dict[str, KeptVirtualHost] = {}
    out = []
    for index, name, domains in plan.entries:
        served, routes = entries[index]
        was = before.get(name)
        if (
            was is not None
            and was.served is served
            and _same_routes(was.routes, routes)
            and (was.domains is domains or was.domains == domains)
        ):
            made[name] = was
            out.append(was.draft)
            continue
        cache = dfp.cache_name(served.hostname) if served is not None and dfp.is_dynamic(served) else None
        draft = _VirtualHostDraft(name, domains, routes, cache)
        made[name] = KeptVirtualHost(served, routes, domains, draft)
        out.append(draft)
    return out, (ordered, plan if memo is not None else None, made)


def _same_routes(a: tuple[rc.Route, ...], b: tuple[rc.Route, ...]) -> bool:
    """The very same route messages (a translation taken over hands out the ones it made)."""
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True)))


def _catch_all(scope: ProxyScope) -> rc.VirtualHost:
    """Where requests for unknown hosts go: PassthroughCluster (or the Sidecar's egress proxy)
    under ALLOW_ANY, a 502 under REGISTRY_ONLY, as in Istio. A proxy without interception has
    no original destination to pass through to, so it answers 502 (or uses the egress proxy)."""
    cluster = ""
    if dfp.allow_any_dynamic_dns(scope) and scope.proxy.type is ProxyType.SIDECAR:
        # Istio's ALLOW_ANY_DYNAMIC_DNS: resolved by the Host header, with or without iptables.
        action = rc.RouteAction(cluster=dfp.ALLOW_ANY_DYNAMIC_DNS_CLUSTER)
        policy.set_timeout(action, None)
        route = rc.Route(name=ALLOW_ANY, match=rc.RouteMatch(prefix="/"), route=action)
        vh = rc.VirtualHost(name=ALLOW_ANY, domains=["*"], routes=[route], include_request_attempt_count=True)
        dfp.enable(vh, dfp.cache_name(dfp.ALLOW_ANY_DYNAMIC_DNS_CLUSTER))
        return vh
    if scope.outbound_traffic_policy in ("ALLOW_ANY", dfp.ALLOW_ANY_DYNAMIC_DNS):
        sidecar = scope.sidecar
        if sidecar is not None and spec(sidecar).outbound_traffic_policy.HasField("egress_proxy"):
            cluster = destination_cluster(
                scope, spec(sidecar).outbound_traffic_policy.egress_proxy, 0, sidecar.namespace
            )
        elif scope.proxy.interception is not InterceptionMode.NONE:
            # Without iptables the original destination is this very listener: passing the
            # request through would send it back to Envoy, so unknown hosts get the 502 instead.
            cluster = PASSTHROUGH_CLUSTER
    if cluster:
        action = rc.RouteAction(cluster=cluster)
        policy.set_timeout(action, None)
        route = rc.Route(name=ALLOW_ANY, match=rc.RouteMatch(prefix="/"), route=action)
        name = ALLOW_ANY
    else:
        route = rc.Route(
            name=BLOCK_ALL, match=rc.RouteMatch(prefix="/"), direct_response=rc.DirectResponseAction(status=502)
        )
        name = BLOCK_ALL
    return rc.VirtualHost(name=name, domains=["*"], routes=[route], include_request_attempt_count=True)
