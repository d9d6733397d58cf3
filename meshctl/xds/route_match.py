"""VirtualService HTTP match conditions as Envoy route matches, the way istiod translates them.

Two kinds of conditions live in an Istio `HTTPMatchRequest`. Request attributes (uri, headers,
query parameters, method, authority, scheme) become an Envoy `RouteMatch`. Who is asking
(`sourceLabels`, `sourceNamespace`, `gateways`) and which port the listener serves (`port`) are
not request attributes at all: they are evaluated here, once per proxy and listener port, and a
match that does not apply is left out of the generated config, as Istio does. Envoy never sees
them, so two proxies with different labels get different routes from the same VirtualService.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from google.protobuf import wrappers_pb2

from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.labels import labels_match
from meshctl.config.references import resolve_gateway_name

MESH_GATEWAY: Final = "mesh"

#: Istio matches these request attributes as pseudo-headers.
_METHOD: Final = ":method"
_AUTHORITY: Final = ":authority"
_SCHEME: Final = ":scheme"


def normalize_gateway(ref: str, namespace: str) -> str:
    """A gateway named in a VirtualService (written in `namespace`) as `ns/name`
    (`resolve_gateway_name`, Istio's rules)."""
    return resolve_gateway_name(ref, namespace)


def applies_to(
    match: vs_pb2.HTTPMatchRequest | None,
    *,
    listen_port: int,
    proxy_labels: Mapping[str, str],
    proxy_namespace: str,
    gateways: frozenset[str],
    vs_namespace: str,
) -> bool:
    """Whether a match block can ever apply to this proxy on this listener port.

    `port` must be the listener's port. When the match names `gateways`, one of them must be
    the context the routes are built for (`mesh` for sidecars, `ns/name` of a Gateway for a
    router) and `sourceLabels` are then ignored, as in Istio; otherwise the proxy's labels must
    include `sourceLabels` and its namespace must be `sourceNamespace` when one is given.
    """
    if match is None:
        return True
    if match.port and match.port != listen_port:
        return False
    if match.gateways:
        return any(normalize_gateway(g, vs_namespace) in gateways for g in match.gateways)
    if not labels_match(match.source_labels, proxy_labels):
        return False
    return not match.source_namespace or match.source_namespace == proxy_namespace


def string_matcher(match: vs_pb2.StringMatch) -> string_pb2.StringMatcher | None:
    """An Istio StringMatch as Envoy's StringMatcher (RE2 regexes via `safe_regex`); None when
    it sets nothing."""
    kind = match.WhichOneof("match_type")
    if kind == "exact":
        return string_pb2.StringMatcher(exact=match.exact)
    if kind == "prefix":
        return string_pb2.StringMatcher(prefix=match.prefix)
    if kind == "regex":
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=match.regex))
    return None


def string_matchers(matches: Iterable[vs_pb2.StringMatch]) -> list[string_pb2.StringMatcher]:
    return [m for m in (string_matcher(x) for x in matches) if m is not None]


def _means_present(match: vs_pb2.StringMatch | None) -> bool:
    """Istio turns an empty StringMatch, and the regex `*` (not RE2, but users write it), into a
    presence check. An empty prefix matches any value too, and Envoy rejects it, so it becomes
    a presence check as well."""
    if match is None:
        return True
    kind = match.WhichOneof("match_type")
    if kind is None:
        return True
    if kind == "regex":
        return match.regex == "*"
    return kind == "prefix" and not match.prefix


def header_matcher(name: str, match: vs_pb2.StringMatch | None) -> rc.HeaderMatcher:
    out = rc.HeaderMatcher(name=name)
    if _means_present(match):
        out.present_match = True
        return out
    assert match is not None  # _means_present covers None
    matcher = string_matcher(match)
    if matcher is not None:
        out.string_match.CopyFrom(matcher)
    return out


def _query_matcher(name: str, match: vs_pb2.StringMatch) -> rc.QueryParameterMatcher:
    out = rc.QueryParameterMatcher(name=name)
    if _means_present(match):
        out.present_match = True
        return out
    matcher = string_matcher(match)
    if matcher is not None:
        out.string_match.CopyFrom(matcher)
    return out


def route_match(match: vs_pb2.HTTPMatchRequest | None, *, gateway_semantics: bool = False) -> rc.RouteMatch:
    """Istio's TranslateRouteMatch: headers (and inverted `withoutHeaders`) sorted by name, then
    method, authority and scheme as pseudo-headers; the path from `uri`; query parameters by
    name (sorted here, where Istio's map order varies); `case_sensitive` from `ignoreUriCase`
    whenever there is a match block. With `gateway_semantics` (a route made from the Gateway
    API) a prefix other than `/` matches whole path segments (`path_separated_prefix`)."""
    out = rc.RouteMatch(prefix="/")
    if match is None:
        return out
    headers: list[Any] = [header_matcher(name, match.headers[name]) for name in sorted(match.headers)]
    for name in sorted(match.without_headers):
        sm = match.without_headers[name]
        hm = header_matcher(name, sm)
        hm.invert_match = True
        if not _means_present(sm):
            # Envoy refuses treat_missing_header_as_empty together with present_match.
            hm.treat_missing_header_as_empty = True
        headers.append(hm)
    headers.sort(key=lambda h: h.name)
    if match.HasField("uri"):
        kind = match.uri.WhichOneof("match_type")
        if kind == "exact":
            out.path = match.uri.exact
        elif kind == "prefix" and gateway_semantics and match.uri.prefix not in ("", "/"):
            out.path_separated_prefix = match.uri.prefix.rstrip("/")
        elif kind == "prefix":
            out.prefix = match.uri.prefix
        elif kind == "regex":
            out.safe_regex.regex = match.uri.regex
    out.case_sensitive.CopyFrom(wrappers_pb2.BoolValue(value=not match.ignore_uri_case))
    for field, pseudo in (("method", _METHOD), ("authority", _AUTHORITY), ("scheme", _SCHEME)):
        if match.HasField(field):
            headers.append(header_matcher(pseudo, getattr(match, field)))
    out.headers.extend(headers)
    out.query_parameters.extend(_query_matcher(n, match.query_params[n]) for n in sorted(match.query_params))
    return out


def is_catch_all(match: rc.RouteMatch) -> bool:
    """A match every request satisfies: `/` prefix or `.*` regex and nothing else (Istio stops
    translating a VirtualService's later routes after one, and sorts them last on gateways)."""
    kind = match.WhichOneof("path_specifier")
    if kind == "prefix":
        anything = match.prefix == "/"
    elif kind == "path_separated_prefix":
        anything = match.path_separated_prefix == "/"
    elif kind == "safe_regex":
        anything = match.safe_regex.regex == ".*"
    else:
        anything = False
    return anything and not match.headers and not match.query_parameters and not match.dynamic_metadata


def operation_path(match: rc.RouteMatch) -> str:
    """The path part of a trace decorator (Istio's GetRouteOperation): `/prefix*`, the exact
    path, or the regex."""
    kind = match.WhichOneof("path_specifier")
    if kind == "prefix":
        return f"{match.prefix}*"
    if kind == "path_separated_prefix":
        return f"{match.path_separated_prefix}*"
    if kind == "path":
        return str(match.path)
    if kind == "safe_regex":
        return str(match.safe_regex.regex)
    return "/*"
