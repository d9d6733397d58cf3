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

import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.http.fault.v3 import fault_pb2
from google.protobuf import json_format

from meshctl.simulate.match import route_matches
from meshctl.simulate.request import Request

FAULT_FILTER = "envoy.filters.http.fault"
#: RedirectAction.RedirectResponseCode, by enum number.
REDIRECT_STATUS = {0: 301, 1: 302, 2: 303, 3: 307, 4: 308}
_DENOMINATORS = {0: 100, 1: 10_000, 2: 1_000_000}


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPED_SLASH = re.compile("%2f|%5c", re.IGNORECASE)
#: HttpConnectionManager.PathWithEscapedSlashesAction, by enum number.
_REJECT, _UNESCAPE_AND_REDIRECT, _UNESCAPE_AND_FORWARD = 2, 3, 4


def normalized_path(hcm: Any, path: str) -> tuple[str | None, int | None]:
    """The path the routes see once the connection manager has normalized it (Istio turns on
    `normalize_path`; a request with `/b/../api` is routed as `/api`, `/%61` as `/a`), and the
    status Envoy answers itself instead of routing: 400 for a rejected escaped slash, 307 to
    the unescaped path for UNESCAPE_AND_REDIRECT. Order as ConnectionManagerUtility::
    maybeNormalizePath: escaped slashes, then RFC 3986 normalization, then merging slashes."""
    action = hcm.path_with_escaped_slashes_action
    if action in (_REJECT, _UNESCAPE_AND_REDIRECT, _UNESCAPE_AND_FORWARD) and _ESCAPED_SLASH.search(path):
        if action == _REJECT:
            return None, 400
        path = _ESCAPED_SLASH.sub(lambda m: "/" if m.group(0).lower() == "%2f" else "\\", path)
        if action == _UNESCAPE_AND_REDIRECT:
            return path, 307
    if hcm.HasField("normalize_path") and hcm.normalize_path.value:
        path = _canonical_path(path)
    if hcm.merge_slashes:
        path = re.sub("/{2,}", "/", path)
    return path, None


def _canonical_path(path: str) -> str:
    """PathUtil::canonicalPath (Chromium's path canonicalization): escapes of unreserved
    characters decoded, dot segments removed (a last `.` or `..` leaves a trailing slash)."""
    decoded = re.sub(
        "%([0-9a-fA-F]{2})",
        lambda m: chr(int(m.group(1), 16)) if chr(int(m.group(1), 16)) in _UNRESERVED else m.group(0),
        path,
    )
    out: list[str] = []
    segments = decoded[1:].split("/") if decoded.startswith("/") else decoded.split("/")
    for n, segment in enumerate(segments):
        last = n == len(segments) - 1
        if segment == ".":
            if last:
                out.append("")
        elif segment == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out)


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
    """Envoy's virtual host for `authority` in RouteConfiguration `config`, or None (404 NR):
    an exact domain, else the longest `*suffix`, else the longest `prefix*`, else `*` (the first
    virtual host in the config wins a tie, as in Envoy)."""
    host = host_for_matching(authority, config.ignore_port_in_host_matching)
    index = _domain_index(config)
    found = index.exact.get(host)
    if found is not None:
        return found
    for suffix, vhost in index.suffixes:
        if host.endswith(suffix) and len(host) > len(suffix):
            return vhost
    for prefix, vhost in index.prefixes:
        if host.startswith(prefix) and len(host) > len(prefix):
            return vhost
    return index.anything


@dataclass(frozen=True, slots=True)
class _DomainIndex:
    """A route config's domains as Envoy looks them up: exact ones in a dict, wildcards longest
    first. Built once per route config: a mesh's config has a virtual host per service, and a
    file of routing tests asks the same config again and again."""

    exact: Mapping[str, Any]
    suffixes: tuple[tuple[str, Any], ...]
    prefixes: tuple[tuple[str, Any], ...]
    anything: Any | None


#: Route config -> its index, for the most recent configs (held here, so `id` stays theirs).
_INDEXES: OrderedDict[int, tuple[Any, _DomainIndex]] = OrderedDict()
_INDEXES_KEPT = 256


def _domain_index(config: Any) -> _DomainIndex:
    held = _INDEXES.get(id(config))
    if held is not None and held[0] is config:
        _INDEXES.move_to_end(id(config))
        return held[1]
    exact: dict[str, Any] = {}
    suffixes: list[tuple[int, int, str, Any]] = []
    prefixes: list[tuple[int, int, str, Any]] = []
    anything = None
    order = 0
    for vhost in config.virtual_hosts:
        for given in vhost.domains:
            domain = given.lower()
            order += 1
            if domain == "*":
                anything = anything if anything is not None else vhost
            elif domain.startswith("*"):
                suffixes.append((-len(domain), order, domain[1:], vhost))
            elif domain.endswith("*"):
                prefixes.append((-len(domain), order, domain[:-1], vhost))
            else:
                exact.setdefault(domain, vhost)
    index = _DomainIndex(
        exact,
        tuple((s, v) for _, _, s, v in sorted(suffixes, key=lambda item: item[:2])),
        tuple((p, v) for _, _, p, v in sorted(prefixes, key=lambda item: item[:2])),
        anything,
    )
    _INDEXES[id(config)] = (config, index)
    if len(_INDEXES) > _INDEXES_KEPT:
        _INDEXES.popitem(last=False)
    return index


#: VirtualHost.TlsRequirementType, by enum number.
_TLS_EXTERNAL_ONLY, _TLS_ALL = 1, 2


def tls_redirect(hcm: Any, vhost: Any, request: Request) -> str | None:
    """The Location of the redirect Envoy answers before any route when the virtual host's
    `require_tls` is not met (Istio's Gateway `httpsRedirect` sets ALL), else None.

    Envoy (VirtualHostImpl::getRouteFromEntries) goes by `x-forwarded-proto`: a connection
    manager that uses the remote address (a gateway's) sets it from the connection, a sidecar's
    keeps the one the client sent, else the connection's. EXTERNAL_ONLY spares requests marked
    internal (`x-envoy-internal: true`). The Location is `https://` with the Host and path as
    sent (Http::Utility::createSslRedirectPath)."""
    requirement = vhost.require_tls
    if requirement not in (_TLS_EXTERNAL_ONLY, _TLS_ALL):
        return None
    forwarded = request.scheme
    if not (hcm.HasField("use_remote_address") and hcm.use_remote_address.value):
        forwarded = request.headers.get("x-forwarded-proto", request.scheme)
    if forwarded == "https":
        return None
    if requirement == _TLS_EXTERNAL_ONLY and request.headers.get("x-envoy-internal") == "true":
        return None
    return f"https://{request.authority}{request.path_and_query}"


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
    parts += [f"header {_header_matcher(h)}" for h in match.headers]
    parts += [f"query {_query(q)}" for q in match.query_parameters]
    return "; ".join(parts)


def _header_matcher(matcher: Any) -> str:
    """A HeaderMatcher as a person reads it: `end-user exact "jason"`, `x-debug present`,
    `version not prefix "v1"`, in the words of Envoy's own field names."""
    kind = matcher.WhichOneof("header_match_specifier")
    negate = "not " if matcher.invert_match else ""
    if kind == "present_match":
        present = bool(matcher.present_match) != bool(matcher.invert_match)
        return f"{matcher.name} {'present' if present else 'absent'}"
    if kind is None:
        return f"{matcher.name} {'absent' if matcher.invert_match else 'present'}"
    if kind == "string_match":
        text = _string(matcher.string_match)
    elif kind == "safe_regex_match":
        text = f"regex {json.dumps(matcher.safe_regex_match.regex)}"
    elif kind == "range_match":
        text = f"in [{matcher.range_match.start}, {matcher.range_match.end})"
    else:  # the deprecated exact_match, prefix_match, ...: their kind, then the value
        text = f"{kind.removesuffix('_match')} {json.dumps(getattr(matcher, kind))}"
    missing = " (missing as empty)" if matcher.treat_missing_header_as_empty else ""
    return f"{matcher.name} {negate}{text}{missing}"


def _query(matcher: Any) -> str:
    kind = matcher.WhichOneof("query_parameter_match_specifier")
    if kind == "string_match":
        return f"{matcher.name} {_string(matcher.string_match)}"
    if kind == "present_match" and not matcher.present_match:
        return f"{matcher.name} absent"
    return f"{matcher.name} present"


def _string(matcher: Any) -> str:
    """A StringMatcher: `exact "jason"`, `prefix "v1" (any case)`, `regex "^a.*"`."""
    kind = matcher.WhichOneof("match_pattern")
    if kind == "safe_regex":
        return f"regex {json.dumps(matcher.safe_regex.regex)}"
    if kind is None:
        return "?"
    return f"{kind} {json.dumps(getattr(matcher, kind))}" + (" (any case)" if matcher.ignore_case else "")


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
    """The Location Envoy sends for a redirect action (Http::Utility::newUri): the parts the
    action states, the request's others. Without `host_redirect` the host is the request's Host
    header as sent, port included: Envoy drops that port only for a `port_redirect`, or when the
    scheme changes and the port is the old scheme's default. A `port_redirect` is always written."""
    scheme = redirect.get("scheme_redirect") or request.scheme
    port = f":{redirect['port_redirect']}" if redirect.get("port_redirect") else ""
    host = redirect.get("host_redirect") or _request_host(request, scheme, port)
    path = redirect.get("path_redirect") or request.path
    if not path.startswith("/"):
        path = f"/{path}"
    if "?" not in path and request.query and not redirect.get("strip_query"):
        path = f"{path}?{request.query}"
    return f"{scheme}://{host}{port}{path}"


def _request_host(request: Request, new_scheme: str, new_port: str) -> str:
    """Utility::processRequestHost: the Host header, its port dropped as Envoy drops it."""
    given = request.authority
    if given.startswith("["):
        end = given.rfind("]:")
        end = end + 1 if end >= 0 else -1
    else:
        end = given.rfind(":")
    if end < 0:
        return given
    old_port = given[end:]
    remove = bool(new_port) or (
        new_scheme != request.scheme
        and ((request.scheme == "https" and old_port == ":443") or (request.scheme == "http" and old_port == ":80"))
    )
    return given[:end] if remove else given


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
