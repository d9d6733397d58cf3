"""The walk: listener, filter chain, network filter, route config, virtual host, route, action,
clusters, endpoints; and at the step where it stops, what Envoy answers and why.

Its input is what the generators produce for one proxy (`meshctl.xds.generate.generate`), keyed
by type URL, and a request; the only other input is an optional lookup of where an Istio resource
was read, to show the file:line a route came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meshctl.simulate import http
from meshctl.simulate import listener as listen
from meshctl.simulate.request import Request
from meshctl.simulate.result import Outcome, Simulation, Upstream
from meshctl.simulate.upstream import DYNAMIC_FORWARD_PROXY, SourceLookup, healthy, source_of, upstream
from meshctl.xds import types

BLACKHOLE = "BlackHoleCluster"
PASSTHROUGH = "PassthroughCluster"
#: The virtual host Istio adds for the REGISTRY_ONLY outbound traffic policy (a 502 for any host).
BLOCK_ALL = "block_all"


@dataclass(frozen=True, slots=True)
class Target:
    """The proxy the resources were generated for: a router binds its listeners' ports, a
    sidecar with interception (REDIRECT, TPROXY) takes connections on `virtualOutbound`."""

    proxy_id: str
    router: bool = False
    intercepted: bool = False


@dataclass
class _Walk:
    """The steps taken so far, to end with an outcome at any of them."""

    request: Request
    target: Target
    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The request as given, shown in the result when Envoy routes a normalized one.
    given: Request | None = None

    def end(self, status: int | None, flag: str, reason: str, routed: bool) -> Simulation:
        return Simulation(
            request=request_dict(self.given or self.request),
            proxy=self.target.proxy_id,
            outcome=Outcome(status, flag, reason, routed),
            notes=tuple(self.notes),
            **self.fields,
        )


def request_dict(request: Request) -> dict[str, Any]:
    return {
        "method": request.method,
        "url": request.url(),
        "authority": request.authority,
        "path": request.path_and_query,
        "headers": dict(request.headers),
    }


def simulate(
    resources: Mapping[str, Sequence[Any]],
    request: Request,
    target: Target,
    lookup: SourceLookup | None = None,
) -> Simulation:
    """Where `request`, sent by the proxy `resources` were generated for, goes."""
    walk = _Walk(request, target)
    listeners = resources.get(types.LISTENER, ())
    chosen = _listener(walk, listeners)
    if chosen is None:
        ports = sorted({int(ln.address.socket_address.port_value) for ln in listeners})
        return walk.end(
            None,
            "",
            f"connection refused: the proxy has no listener for port {request.port}"
            f" (its listeners' ports: {', '.join(map(str, ports)) or 'none'})",
            False,
        )
    walk.fields["listener"] = chosen.name
    found = listen.choose_chain(chosen, listen.connection_for(chosen, request))
    if found is None:
        return walk.end(None, "NR", f"no filter chain of {chosen.name} matches the connection: Envoy closes it", False)
    index, chain = found
    choice = listen.network_filter(chosen.name, listen.describe_chain(index, chain), chain)
    walk.fields["filter_chain"] = choice.chain
    if choice.tcp is not None:
        return _tcp(walk, choice.tcp, resources, lookup)
    if choice.hcm is None:
        return walk.end(
            None, "", f"filter chain {choice.chain} has neither an HTTP connection manager nor a TCP proxy", False
        )
    if not request.is_http:
        return walk.end(
            None,
            "",
            f"filter chain {choice.chain} serves HTTP: a connection that does not speak HTTP fails there "
            "(declare the port's protocol TCP or TLS to pass it through)",
            False,
        )
    return _http(walk, choice.hcm, resources, lookup)


def _listener(walk: _Walk, listeners: Sequence[Any]) -> Any | None:
    request, target = walk.request, walk.target
    if target.router or not target.intercepted:
        resolved = None if target.router else listen.dns_answer(listeners, request.host)
        if resolved is not None:
            walk.notes.append(f"{request.host} resolves to {resolved} (the proxy's DNS table)")
        return listen.bound_listener(listeners, request, target.router, resolved)
    virtual = next((ln for ln in listeners if ln.name == listen.VIRTUAL_OUTBOUND), None)
    if virtual is None:
        return None
    handed = listen.handed_off_listener(listeners, request)
    if handed is None:
        walk.notes.append(f"no listener for port {request.port}: {listen.VIRTUAL_OUTBOUND} keeps the connection")
        return virtual
    walk.notes.append(f"{listen.VIRTUAL_OUTBOUND} hands the connection to {handed.name} (use_original_dst)")
    return handed


def _tcp(walk: _Walk, tcp: Any, resources: Mapping[str, Sequence[Any]], lookup: SourceLookup | None) -> Simulation:
    if tcp.HasField("weighted_clusters"):
        targets = [(c.name, c.weight) for c in tcp.weighted_clusters.clusters]
    else:
        targets = [(tcp.cluster, 100)]
    walk.fields["action"] = {"kind": "tcp_proxy", "clusters": [{"name": n, "weight": w} for n, w in targets]}
    walk.notes.append("the filter chain proxies TCP: the request's host, path and headers are not looked at")
    return _upstreams(walk, targets, resources, lookup)


def _http(walk: _Walk, hcm: Any, resources: Mapping[str, Sequence[Any]], lookup: SourceLookup | None) -> Simulation:
    path, status = http.normalized_path(hcm, walk.request.path)
    if path is None:
        return walk.end(status, "", f"the path {walk.request.path} has an escaped slash: Envoy rejects it", False)
    if path != walk.request.path:
        walk.notes.append(f"the connection manager normalizes the path {walk.request.path} to {path}")
        walk.given, walk.request = walk.request, replace(walk.request, path=path)
    if status is not None:
        location = f"{path}?{walk.request.query}" if walk.request.query else path
        return walk.end(status, "", f"Envoy redirects to the path with its slashes unescaped: {location}", True)
    request = walk.request
    if hcm.HasField("rds"):
        name = hcm.rds.route_config_name
        walk.fields["route_config"] = name
        config = next((r for r in resources.get(types.ROUTE, ()) if r.name == name), None)
        if config is None:
            return walk.end(404, "NR", f"route config {name} is not among the proxy's resources", False)
    elif hcm.HasField("route_config"):
        config = hcm.route_config
        walk.fields["route_config"] = f"{config.name or '(inline)'} (inline)"
    else:
        return walk.end(None, "", "the HTTP connection manager uses scoped routes, which are not simulated", False)
    vhost = http.choose_virtual_host(config, request.authority)
    if vhost is None:
        return walk.end(
            404,
            "NR",
            f"no virtual host of route config {config.name} has a domain for {request.authority!r}"
            " (the host is not a service this proxy's Sidecar egress imports, or not on this port)",
            False,
        )
    walk.fields["virtual_host"] = vhost.name
    tls_location = http.tls_redirect(hcm, vhost, request)
    if tls_location is not None:
        walk.fields["action"] = {"kind": "redirect", "status": 301, "location": tls_location}
        return walk.end(
            301, "", f"virtual host {vhost.name} requires TLS (require_tls): Envoy redirects to {tls_location}", True
        )
    route = http.choose_route(vhost, request)
    if route is None:
        return walk.end(
            404, "NR", f"no route of virtual host {vhost.name} matches {request.method} {request.path_and_query}", False
        )
    walk.fields["route_name"] = route.name
    walk.fields["route_match"] = http.describe_match(route.match)
    walk.fields["source"] = source_of(route.metadata, lookup)
    action = http.action_of(config, vhost, route)
    walk.fields["action"] = action
    return _answer(walk, vhost, action, resources, lookup)


def _answer(
    walk: _Walk,
    vhost: Any,
    action: dict[str, Any],
    resources: Mapping[str, Sequence[Any]],
    lookup: SourceLookup | None,
) -> Simulation:
    request = walk.request
    if vhost.name == BLOCK_ALL:
        status = action.get("status")
        return walk.end(
            status,
            "",
            f"{request.host} is not a host this proxy imports, and Istio's outbound traffic policy is"
            f" REGISTRY_ONLY: Envoy answers {status} (virtual host {BLOCK_ALL})",
            False,
        )
    abort = (action.get("fault") or {}).get("abort")
    if abort and abort.get("percent", 0) >= 100 and "http_status" in abort:
        return walk.end(
            abort["http_status"], "FI", f"the fault filter aborts every request with {abort['http_status']}", True
        )
    if abort:
        walk.notes.append(f"the fault filter aborts {abort.get('percent')}% of requests: {abort}")
    delay = (action.get("fault") or {}).get("delay")
    if delay:
        walk.notes.append(f"the fault filter delays {delay['percent']}% of requests by {delay['fixed_delay']}")
    kind = action["kind"]
    if kind == "direct_response":
        return walk.end(action["status"], "", f"the route answers {action['status']} itself (direct response)", True)
    if kind == "redirect":
        location = http.redirect_location(action, request)
        action["location"] = location
        return walk.end(action["status"], "", f"the route redirects to {location}", True)
    if kind != "route":
        return walk.end(None, "", f"route action {kind} is not simulated", False)
    if "weighted_clusters" in action:
        targets = [(c["name"], c["weight"]) for c in action["weighted_clusters"]]
    elif "cluster" in action:
        targets = [(action["cluster"], 100)]
    else:
        return walk.end(
            None, "", "the route picks its cluster at request time (cluster_header, ...): not simulated", True
        )
    return _upstreams(walk, targets, resources, lookup)


def _upstreams(
    walk: _Walk, targets: Sequence[tuple[str, int]], resources: Mapping[str, Sequence[Any]], lookup: SourceLookup | None
) -> Simulation:
    clusters = {c.name: c for c in resources.get(types.CLUSTER, ())}
    assignments = {a.cluster_name: a for a in resources.get(types.ENDPOINT, ())}
    chosen = tuple(upstream(name, weight, clusters, assignments, lookup) for name, weight in targets)
    walk.fields["clusters"] = chosen
    total = sum(u.weight for u in chosen) or 1
    missing = [u for u in chosen if not u.found]
    empty = [u for u in chosen if u.found and not _can_connect(u)]
    for u in missing:
        walk.notes.append(f"{round(100 * u.weight / total)}% of requests: cluster {u.name} not found (503 NC)")
    for u in empty:
        walk.notes.append(f"{round(100 * u.weight / total)}% of requests: {u.name} has no healthy endpoint (503 UH)")
    names = ", ".join(u.name for u in chosen)
    if len(missing) == len(chosen):
        return walk.end(503, "NC", f"cluster {names} is not among the proxy's clusters", False)
    if len(missing) + len(empty) == len(chosen):
        why = " (Istio's outbound traffic policy or a port without a service)" if BLACKHOLE in names else ""
        return walk.end(503, "UH", f"no healthy endpoint in {names}{why}", False)
    if len(chosen) == 1 and chosen[0].name == PASSTHROUGH:
        return walk.end(
            None,
            "",
            "PassthroughCluster: Istio's ALLOW_ANY outbound traffic policy forwards it to its original destination",
            True,
        )
    live = [u for u in chosen if u.found and _can_connect(u)]
    if any(u.type == DYNAMIC_FORWARD_PROXY for u in live):
        walk.notes.append(f"the dynamic forward proxy resolves {_named_host(walk)} when the request comes")
    counts = ", ".join(f"{u.name} ({_reach(u)})" for u in live)
    return walk.end(None, "", f"forwarded to {counts}", True)


def _named_host(walk: _Walk) -> str:
    """What a dynamic forward proxy resolves: the Host (with its port, 80 without one) of an
    HTTP request, the SNI, on the service port, of a TLS connection."""
    request = walk.request
    if request.is_http:
        host = request.authority
        return f"the Host {host}" if ":" in host else f"the Host {host} (port 80)"
    return f"the SNI {request.server_name or '(none)'}"


def _reach(u: Upstream) -> str:
    if u.type == "ORIGINAL_DST":
        return "its original destination"
    if u.type == DYNAMIC_FORWARD_PROXY:
        return "dynamic forward proxy: the host the request names"
    return f"{len(healthy(u.endpoints))} healthy endpoint(s)"


def _can_connect(u: Upstream) -> bool:
    """A cluster Envoy can send to: one with a healthy endpoint, or one that needs none listed
    (ORIGINAL_DST, Istio's PassthroughCluster; a dynamic forward proxy, which resolves the name
    each request gives)."""
    return u.type in ("ORIGINAL_DST", DYNAMIC_FORWARD_PROXY) or bool(healthy(u.endpoints))


__all__ = ["Target", "simulate"]
