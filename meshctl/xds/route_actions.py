"""One VirtualService HTTP route as Envoy routes: Istio's TranslateRoute, for sidecars and gateways.

A `RouteContext` carries everything the translation depends on besides the route itself: the
listener port (the default destination port, and what `match.port` is compared with), the
gateway context (`mesh` or `ns/name`), the proxy's labels and namespace (for `sourceLabels`),
whether the listener terminates TLS (the default redirect scheme), how to find a destination's
service (its only port is the default destination port) and its consistent-hash key. Sidecars
and gateways differ only in the context they pass.

Each match block of an HTTP route becomes one Envoy route, in order; translation stops after a
route that matches every request, since Envoy would never reach the ones after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from google.protobuf import struct_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.hosts import is_short_name
from meshctl.config.model import Config
from meshctl.registry.model import Service
from meshctl.snapshot.model import spec
from meshctl.xds import route_policy as policy
from meshctl.xds.names import config_path, outbound_cluster, parse_cluster_name
from meshctl.xds.route_match import applies_to, is_catch_all, operation_path, route_match

ConsistentHash = dr_pb2.LoadBalancerSettings.ConsistentHashLB

_REDIRECT_CODES: Final = {
    0: rc.RedirectAction.MOVED_PERMANENTLY,
    301: rc.RedirectAction.MOVED_PERMANENTLY,
    302: rc.RedirectAction.FOUND,
    303: rc.RedirectAction.SEE_OTHER,
    307: rc.RedirectAction.TEMPORARY_REDIRECT,
    308: rc.RedirectAction.PERMANENT_REDIRECT,
}


#: Istio's annotation of a VirtualService made from the Gateway API (`gateway_api`): its path
#: prefixes match whole path segments, as the Gateway API's PathPrefix does.
ROUTE_SEMANTICS: Final = "internal.istio.io/route-semantics"


def resolve_destination_host(host: str, namespace: str, known: Iterable[str]) -> str:
    """A destination host as written in `namespace`: a short name (`reviews`) stands for the
    known service `reviews.<namespace>.<suffix>` (the first, in name order, if several);
    anything else, or a short name nothing matches, stays as written."""
    if not is_short_name(host):
        return host
    prefix = f"{host}.{namespace}."
    matches = sorted(h for h in known if h.startswith(prefix))
    return matches[0] if matches else host


def cluster_for(host: str, subset: str, explicit_port: int, service: Service | None, default_port: int) -> str:
    """Istio's GetDestinationCluster: `outbound|PORT|SUBSET|HOST` with the destination's port,
    else the service's only port, else `default_port` (the listener's). A host no registry
    knows still gets its Istio name: Envoy then answers 503 (no cluster), as with Istio."""
    port = default_port
    if explicit_port:
        port = explicit_port
    elif service is not None and len(service.ports) == 1:
        port = service.ports[0].number
    return outbound_cluster(port, host, subset)


@dataclass(frozen=True)
class RouteContext:
    """Where routes are being built: see the module docstring."""

    listen_port: int
    gateways: frozenset[str]
    proxy_labels: Mapping[str, str]
    proxy_namespace: str
    #: (host as written, lower-cased; the namespace it is written in) -> the host it stands for
    #: (`resolve_destination_host` over the known services)
    resolve_host: Callable[[str, str], str]
    lookup_service: Callable[[str], Service | None]
    lookup_hash: Callable[[vs_pb2.Destination, str], ConsistentHash | None]
    is_tls: bool = False

    def host(self, destination: vs_pb2.Destination, namespace: str) -> str:
        return self.resolve_host(destination.host.lower(), namespace)

    def cluster(self, destination: vs_pb2.Destination, namespace: str) -> str:
        host = self.host(destination, namespace)
        port = destination.port.number if destination.HasField("port") else 0
        return cluster_for(host, destination.subset, port, self.lookup_service(host), self.listen_port)


def istio_metadata(vs: Config) -> base_pb2.Metadata:
    """`filter_metadata.istio.config`, the path back to the VirtualService, as Istio sets it."""
    out = base_pb2.Metadata()
    out.filter_metadata["istio"].CopyFrom(
        struct_pb2.Struct(fields={"config": struct_pb2.Value(string_value=config_path(vs))})
    )
    return out


def http_routes(vs: Config, ctx: RouteContext, http: Sequence[vs_pb2.HTTPRoute] | None = None) -> list[rc.Route]:
    """Istio's BuildHTTPRoutesForVirtualService: the routes of `vs` (or of `http`, its routes
    with delegates already merged) that apply in `ctx`, in order, up to the first catch-all."""
    out: list[rc.Route] = []
    for route in spec(vs).http if http is None else http:
        if not route.match:
            translated = translate_route(vs, route, None, ctx)
            if translated is not None:
                out.append(translated)
            break
        stop = False
        for match in route.match:
            translated = translate_route(vs, route, match, ctx)
            if translated is None:
                continue
            out.append(translated)
            if is_catch_all(translated.match):
                stop = True
                break
        if stop:
            break
    return out


def translate_route(
    vs: Config, route: vs_pb2.HTTPRoute, match: vs_pb2.HTTPMatchRequest | None, ctx: RouteContext
) -> rc.Route | None:
    """One HTTP route under one match block, or None when the match does not apply here or the
    route has nothing Envoy could do (no destination, an unsupported redirect code)."""
    if not applies_to(
        match,
        listen_port=ctx.listen_port,
        proxy_labels=ctx.proxy_labels,
        proxy_namespace=ctx.proxy_namespace,
        gateways=ctx.gateways,
        vs_namespace=vs.namespace,
    ):
        return None
    name = route.name
    if match is not None and match.name:
        name = f"{name}.{match.name}"
    gateway_semantics = vs.annotations.get(ROUTE_SEMANTICS) == "gateway"
    out = rc.Route(
        name=name, match=route_match(match, gateway_semantics=gateway_semantics), metadata=istio_metadata(vs)
    )
    if match is not None and match.stat_prefix:
        out.stat_prefix = match.stat_prefix
    authority = ""
    if route.HasField("headers"):
        ops = policy.header_operations(route.headers)
        out.request_headers_to_add.extend(ops.request_add)
        out.response_headers_to_add.extend(ops.response_add)
        out.request_headers_to_remove.extend(ops.request_remove)
        out.response_headers_to_remove.extend(ops.response_remove)
        authority = ops.authority
    if route.HasField("redirect"):
        if not _apply_redirect(out, route.redirect, ctx):
            return None
    elif route.HasField("direct_response"):
        _apply_direct_response(out, route.direct_response)
    elif not _apply_destinations(out, vs, route, ctx, authority):
        return None
    out.decorator.operation = _operation(out, vs.name, ctx.listen_port)
    if route.HasField("fault"):
        fault = policy.fault_config(route.fault)
        if fault is not None:
            out.typed_per_filter_config[policy.FAULT_FILTER].CopyFrom(policy.pack(fault))
    if route.HasField("cors_policy"):
        out.typed_per_filter_config[policy.CORS_FILTER].CopyFrom(policy.pack(policy.cors_policy(route.cors_policy)))
    return out


def _operation(route: rc.Route, vs_name: str, port: int) -> str:
    """Istio's trace operation: `HOST:PORT/path` for a single-cluster route, else named after
    the VirtualService."""
    path = operation_path(route.match)
    if route.WhichOneof("action") == "route" and route.route.WhichOneof("cluster_specifier") == "cluster":
        parsed = parse_cluster_name(route.route.cluster)
        if parsed is not None:
            return f"{parsed.host}:{parsed.port}{path}"
    return f"{vs_name}:{port}{path}"


def _apply_redirect(out: rc.Route, redirect: vs_pb2.HTTPRedirect, ctx: RouteContext) -> bool:
    """Istio's ApplyRedirect. `derivePort: FROM_REQUEST_PORT` is the listener's port (routes are
    built per port); a port that is the scheme's default is left out of the Location."""
    if redirect.redirect_code not in _REDIRECT_CODES:
        return False
    action = rc.RedirectAction(host_redirect=redirect.authority, response_code=_REDIRECT_CODES[redirect.redirect_code])
    if not redirect.uri and redirect.prefix_rewrite:
        action.prefix_rewrite = redirect.prefix_rewrite
    else:
        action.path_redirect = redirect.uri
    if redirect.scheme:
        action.scheme_redirect = redirect.scheme
    which = redirect.WhichOneof("redirect_port")
    if which is not None:
        if which == "port":
            action.port_redirect = redirect.port
        elif redirect.derive_port == vs_pb2.HTTPRedirect.RedirectPortSelection.FROM_REQUEST_PORT:
            action.port_redirect = ctx.listen_port
        scheme = redirect.scheme or ("https" if ctx.is_tls else "http")
        if (action.port_redirect, scheme) in ((80, "http"), (443, "https")):
            action.port_redirect = 0
    out.redirect.CopyFrom(action)
    return True


def _apply_direct_response(out: rc.Route, response: vs_pb2.HTTPDirectResponse) -> None:
    action = rc.DirectResponseAction(status=response.status)
    kind = response.body.WhichOneof("specifier") if response.HasField("body") else None
    if kind == "string":
        action.body.inline_string = response.body.string
    elif kind == "bytes":
        action.body.inline_bytes = response.body.bytes
    out.direct_response.CopyFrom(action)


def _apply_destinations(out: rc.Route, vs: Config, route: vs_pb2.HTTPRoute, ctx: RouteContext, authority: str) -> bool:
    """Istio's applyHTTPRouteDestination: timeout, rewrites, mirrors, one cluster or weighted
    clusters (zero weights dropped), per-destination headers and hash policies, retries."""
    destinations = list(route.route)
    if len(destinations) > 1:
        destinations = [d for d in destinations if d.weight > 0]
    if not destinations:
        return False
    action = out.route
    policy.set_timeout(action, route.timeout if route.HasField("timeout") else None)
    if route.HasField("rewrite"):
        rewrite = route.rewrite
        if rewrite.HasField("uri_regex_rewrite"):
            action.regex_rewrite.pattern.regex = rewrite.uri_regex_rewrite.match
            action.regex_rewrite.substitution = rewrite.uri_regex_rewrite.rewrite
        elif rewrite.uri:
            action.prefix_rewrite = rewrite.uri
        if rewrite.authority:
            authority = rewrite.authority
    if authority:
        action.host_rewrite_literal = authority
    ns = vs.namespace
    if route.HasField("mirror"):
        legacy = route.mirror_percent.value if route.HasField("mirror_percent") else None
        fraction = policy.mirror_fraction(
            route.mirror_percentage if route.HasField("mirror_percentage") else None, legacy
        )
        if fraction is not None:
            _add_mirror(action, ctx.cluster(route.mirror, ns), fraction)
    for mirror in route.mirrors:
        if not mirror.HasField("destination"):
            continue
        fraction = policy.mirror_fraction(mirror.percentage if mirror.HasField("percentage") else None)
        if fraction is not None:
            _add_mirror(action, ctx.cluster(mirror.destination, ns), fraction)
    consistent_hash = False
    if len(route.route) == 1:
        dst = route.route[0]
        action.cluster = ctx.cluster(dst.destination, ns)
        if dst.HasField("headers"):
            ops = policy.header_operations(dst.headers)
            out.request_headers_to_add.extend(ops.request_add)
            out.request_headers_to_remove.extend(ops.request_remove)
            out.response_headers_to_add.extend(ops.response_add)
            out.response_headers_to_remove.extend(ops.response_remove)
            if ops.authority and action.WhichOneof("host_rewrite_specifier") is None:
                action.host_rewrite_literal = ops.authority
        consistent_hash = _add_hash_policy(action, dst.destination, ns, ctx)
    else:
        for dst in destinations:
            weighted = action.weighted_clusters.clusters.add(name=ctx.cluster(dst.destination, ns))
            weighted.weight.value = dst.weight
            if dst.HasField("headers"):
                ops = policy.header_operations(dst.headers)
                weighted.request_headers_to_add.extend(ops.request_add)
                weighted.request_headers_to_remove.extend(ops.request_remove)
                weighted.response_headers_to_add.extend(ops.response_add)
                weighted.response_headers_to_remove.extend(ops.response_remove)
                if ops.authority:
                    weighted.host_rewrite_literal = ops.authority
            _add_hash_policy(action, dst.destination, ns, ctx)
    retry = policy.retry_policy(route.retries if route.HasField("retries") else None, consistent_hash=consistent_hash)
    if retry is not None:
        action.retry_policy.CopyFrom(retry)
    return True


def _add_mirror(action: rc.RouteAction, cluster: str, fraction: base_pb2.RuntimeFractionalPercent) -> None:
    mirror = action.request_mirror_policies.add(cluster=cluster)
    mirror.runtime_fraction.CopyFrom(fraction)
    mirror.trace_sampled.value = False


def _add_hash_policy(
    action: rc.RouteAction, destination: vs_pb2.Destination, namespace: str, ctx: RouteContext
) -> bool:
    found = policy.hash_policy(ctx.lookup_hash(destination, ctx.host(destination, namespace)))
    if found is None:
        return False
    action.hash_policy.append(found)
    return True
