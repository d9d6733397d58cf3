"""An HTTP request through a route configuration: virtual host, route, action.

The virtual host is chosen as Envoy chooses it, by the `:authority` lower-cased (its port
dropped when the config sets `ignore_port_in_host_matching`, as Istio's do): an exact domain,
then the longest `*suffix` wildcard, then the longest `prefix*` wildcard, then `*`. The route is
the first of the virtual host's routes whose match holds (`match.route_matches`).

The action is shown as the route states it: the cluster or weighted clusters, redirect, or
direct response, with the policies Envoy applies on the way (timeout, retries, mirrors, the
fault filter's per-route config, header changes of the route, virtual host and route config).
"""

from __future__ import annotations

from typing import Any

from envoy.extensions.filters.http.fault.v3 import fault_pb2
from google.protobuf import json_format

from meshctl.simulate.match import route_matches
from meshctl.simulate.request import Request

FAULT_FILTER = "envoy.filters.http.fault"
#: RedirectAction.RedirectResponseCode, by enum number.
REDIRECT_STATUS = {0: 301, 1: 302, 2: 303, 3: 307, 4: 308}
_DENOMINATORS = {0: 100, 1: 10_000, 2: 1_000_000}


def host_for_matching(authority: str, ignore_port: bool) -> str:
    host = authority.lower()
    if ignore_port:
        if host.startswith("["):
            return host.partition("]")[0] + "]"
        head, sep, tail = host.rpartition(":")
        if sep and tail.isdigit():
            return head
    return host


def choose_virtual_host(config: Any, authority: str) -> Any | None:
    """Envoy's virtual host for `authority` in RouteConfiguration `config`, or None (404 NR)."""
    host = host_for_matching(authority, config.ignore_port_in_host_matching)
    exact, suffixes, prefixes, anything = None, [], [], None
    for vhost in config.virtual_hosts:
        for given in vhost.domains:
            domain = given.lower()
            if domain == "*":
                anything = anything or vhost
            elif domain.startswith("*"):
                if host.endswith(domain[1:]) and len(host) > len(domain) - 1:
                    suffixes.append((len(domain), vhost))
            elif domain.endswith("*"):
                if host.startswith(domain[:-1]) and len(host) > len(domain) - 1:
                    prefixes.append((len(domain), vhost))
            elif domain == host and exact is None:
                exact = vhost
    if exact is not None:
        return exact
    for found in (suffixes, prefixes):
        if found:
            return max(found, key=lambda item: item[0])[1]
    return anything


def choose_route(vhost: Any, request: Request) -> Any | None:
    """The first route of `vhost` whose match holds, or None (404 NR)."""
    return next((route for route in vhost.routes if route_matches(route.match, request)), None)


def describe_match(match: Any) -> str:
    """A route's match in one line: the path specifier, then headers and query parameters."""
    kind = match.WhichOneof("path_specifier")
    value = getattr(match, kind) if kind else ""
    if kind == "safe_regex":
        text = f"regex {match.safe_regex.regex}"
    elif kind == "prefix":
        text = f"prefix {value}"
    elif kind == "path":
        text = f"path {value}"
    elif kind == "path_separated_prefix":
        text = f"path_separated_prefix {value}"
    else:
        text = kind or "?"
    if match.HasField("case_sensitive") and not match.case_sensitive.value:
        text += " (any case)"
    parts = [text]
    parts += [f"header {_compact(h, 'name')}" for h in match.headers]
    parts += [f"query {_compact(q, 'name')}" for q in match.query_parameters]
    return "; ".join(parts)


def _compact(message: Any, name_field: str) -> str:
    data = json_format.MessageToDict(message, preserving_proto_field_name=True)
    name = data.pop(name_field, "")
    return f"{name} {data}" if data else name


def action_of(config: Any, vhost: Any, route: Any) -> dict[str, Any]:
    """The route's action as plain data, with the header changes of all three levels."""
    kind = route.WhichOneof("action")
    out: dict[str, Any] = {"kind": kind}
    if kind == "route":
        out.update(_route_action(route.route))
    elif kind == "redirect":
        out.update(_redirect(route.redirect))
    elif kind == "direct_response":
        out["status"] = route.direct_response.status
        if route.direct_response.body.WhichOneof("specifier") == "inline_string":
            out["body"] = route.direct_response.body.inline_string
    fault = fault_of(route)
    if fault:
        out["fault"] = fault
    added = [
        _header(h, level)
        for level, item in (("route", route), ("vhost", vhost), ("route_config", config))
        for h in item.request_headers_to_add
    ]
    removed = [*route.request_headers_to_remove, *vhost.request_headers_to_remove, *config.request_headers_to_remove]
    if added:
        out["request_headers_to_add"] = added
    if removed:
        out["request_headers_to_remove"] = removed
    return out


def _header(option: Any, level: str) -> dict[str, Any]:
    action = json_format.MessageToDict(option, preserving_proto_field_name=True).get("append_action", "")
    return {"name": option.header.key, "value": option.header.value, "append_action": action, "from": level}


def _duration(message: Any) -> str:
    """A Duration as Envoy's JSON writes it (`3s`, `0.500s` as `0.5s`)."""
    return f"{message.seconds + message.nanos / 1e9:g}s"


def _route_action(action: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    target = action.WhichOneof("cluster_specifier")
    if target == "cluster":
        out["cluster"] = action.cluster
    elif target == "weighted_clusters":
        out["weighted_clusters"] = [
            {"name": c.name, "weight": c.weight.value} for c in action.weighted_clusters.clusters
        ]
    elif target is not None:
        value = getattr(action, target)
        out[target] = value if isinstance(value, str) else json_format.MessageToDict(value)
    # Envoy's default route timeout is 15s; Istio always states one (0s: none).
    out["timeout"] = _duration(action.timeout) if action.HasField("timeout") else "15s"
    if action.HasField("retry_policy"):
        retry = action.retry_policy
        out["retries"] = {
            "retry_on": retry.retry_on,
            "num_retries": retry.num_retries.value if retry.HasField("num_retries") else 1,
            "per_try_timeout": _duration(retry.per_try_timeout) if retry.HasField("per_try_timeout") else None,
        }
    if action.request_mirror_policies:
        out["mirrors"] = [
            {
                "cluster": m.cluster,
                "percent": _percent(m.runtime_fraction.default_value) if m.HasField("runtime_fraction") else 100.0,
            }
            for m in action.request_mirror_policies
        ]
    if action.prefix_rewrite:
        out["prefix_rewrite"] = action.prefix_rewrite
    if action.HasField("regex_rewrite"):
        out["regex_rewrite"] = {
            "pattern": action.regex_rewrite.pattern.regex,
            "substitution": action.regex_rewrite.substitution,
        }
    if action.host_rewrite_literal:
        out["host_rewrite"] = action.host_rewrite_literal
    return out


def _redirect(redirect: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"status": REDIRECT_STATUS.get(redirect.response_code, 301)}
    for field in ("scheme_redirect", "host_redirect", "path_redirect", "prefix_rewrite"):
        value = getattr(redirect, field)
        if value:
            out[field] = value
    if redirect.port_redirect:
        out["port_redirect"] = redirect.port_redirect
    if redirect.strip_query:
        out["strip_query"] = True
    return out


def redirect_location(redirect: dict[str, Any], request: Request) -> str:
    """The Location Envoy sends for a redirect action (the parts it states, the request's others)."""
    scheme = redirect.get("scheme_redirect") or request.scheme
    host = redirect.get("host_redirect") or request.host
    port = redirect.get("port_redirect") or (request.port if "host_redirect" not in redirect else 0)
    default = {"http": 80, "https": 443}.get(scheme)
    authority = host if not port or port == default else f"{host}:{port}"
    path = redirect.get("path_redirect") or request.path
    query = "" if redirect.get("strip_query") or not request.query else f"?{request.query}"
    return f"{scheme}://{authority}{path}{query}"


def fault_of(route: Any) -> dict[str, Any] | None:
    """The fault filter's per-route config: delay and abort, each with its percentage."""
    if FAULT_FILTER not in route.typed_per_filter_config:
        return None
    fault = fault_pb2.HTTPFault()
    route.typed_per_filter_config[FAULT_FILTER].Unpack(fault)
    out: dict[str, Any] = {}
    if fault.HasField("delay"):
        out["delay"] = {"fixed_delay": _duration(fault.delay.fixed_delay), "percent": _percent(fault.delay.percentage)}
    if fault.HasField("abort"):
        abort = fault.abort
        kind = abort.WhichOneof("error_type")
        out["abort"] = {
            kind or "http_status": getattr(abort, kind) if kind else 0,
            "percent": _percent(abort.percentage),
        }
    return out or None


def _percent(fraction: Any) -> float:
    """A FractionalPercent as a percentage; an unset one is 0, as Envoy reads it."""
    return float(round(100.0 * fraction.numerator / _DENOMINATORS.get(fraction.denominator, 100), 4))
