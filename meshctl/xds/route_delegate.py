"""VirtualService delegation: a root VirtualService hands a set of requests to another one.

An HTTP route of a root VirtualService may name a `delegate` (a VirtualService with no hosts,
typically owned by another team) instead of destinations. Istio then replaces that route by the
delegate's routes, each with its match conditions narrowed by the root's (a delegate route that
cannot be a subset of the root's conditions is dropped) and with the root's policies where the
delegate sets none. This module does that merge, following Istio's model/virtualservice.go, so
the rest of route generation only ever sees plain HTTP routes.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.config.model import Config
from meshctl.snapshot.model import spec
from meshctl.snapshot.scope import ProxyScope

#: Route fields the root's value fills when the delegate's route leaves them unset.
_INHERITED = (
    "rewrite",
    "direct_response",
    "timeout",
    "retries",
    "fault",
    "mirror",
    "mirror_percent",
    "mirror_percentage",
    "cors_policy",
    "headers",
)
_MATCH_FIELDS = ("uri", "scheme", "method", "authority")


def effective_http(scope: ProxyScope, vs: Config) -> list[vs_pb2.HTTPRoute]:
    """The HTTP routes of `vs` with every delegating route replaced by its delegate's routes;
    a delegate that is missing, has hosts, or is not exported to the root's namespace
    contributes nothing (Istio drops the route and logs a warning)."""
    routes: Sequence[vs_pb2.HTTPRoute] = spec(vs).http
    if not any(r.HasField("delegate") for r in routes):
        return list(routes)
    out: list[vs_pb2.HTTPRoute] = []
    for route in routes:
        if not route.HasField("delegate"):
            out.append(route)
            continue
        delegate = _find_delegate(scope, route.delegate, vs)
        if delegate is None:
            continue
        for sub in spec(delegate).http:
            merged = merge_route(route, sub)
            if merged is not None:
                out.append(merged)
    return out


def _find_delegate(scope: ProxyScope, ref: vs_pb2.Delegate, root: Config) -> Config | None:
    found = scope.snapshot.get("VirtualService", ref.namespace or root.namespace, ref.name)
    if found is None or spec(found).hosts or not scope.snapshot.index.exported_to(found, root.namespace):
        return None
    return found


def merge_route(root: vs_pb2.HTTPRoute, delegate: vs_pb2.HTTPRoute) -> vs_pb2.HTTPRoute | None:
    """A delegate route under a root route (Istio's mergeHTTPRoute), or None on a conflict."""
    matches = merge_matches(list(root.match), list(delegate.match))
    if matches is None:
        return None
    out = vs_pb2.HTTPRoute()
    out.CopyFrom(delegate)
    del out.match[:]
    out.match.extend(matches)
    if not out.name:
        out.name = root.name
    elif root.name:
        out.name = f"{root.name}-{out.name}"
    for name in _INHERITED:
        if not out.HasField(name) and root.HasField(name):
            getattr(out, name).CopyFrom(getattr(root, name))
    if not out.mirrors and root.mirrors:
        out.mirrors.extend(root.mirrors)
    return out


def merge_matches(
    root: list[vs_pb2.HTTPMatchRequest], delegate: list[vs_pb2.HTTPMatchRequest]
) -> list[vs_pb2.HTTPMatchRequest] | None:
    """Every delegate match combined with each root match it does not contradict; None when
    some delegate match contradicts every root match."""
    if not root:
        return delegate
    if not delegate:
        return root
    out = []
    for leaf in delegate:
        merged = [_merge_match(r, leaf) for r in root if not _conflicts(r, leaf)]
        if not merged:
            return None
        out.extend(merged)
    return out


def _merge_match(root: vs_pb2.HTTPMatchRequest, leaf: vs_pb2.HTTPMatchRequest) -> vs_pb2.HTTPMatchRequest:
    out = vs_pb2.HTTPMatchRequest()
    out.CopyFrom(leaf)
    if not out.name:
        out.name = root.name
    elif root.name:
        out.name = f"{root.name}-{out.name}"
    for name in _MATCH_FIELDS:
        if not out.HasField(name) and root.HasField(name):
            getattr(out, name).CopyFrom(getattr(root, name))
    for name in ("headers", "without_headers", "query_params"):
        target, base = getattr(out, name), getattr(root, name)
        for key in base:
            if key not in getattr(leaf, name):
                target[key].CopyFrom(base[key])
    for key, value in root.source_labels.items():
        if key not in leaf.source_labels:
            out.source_labels[key] = value
    out.port = out.port or root.port
    out.source_namespace = out.source_namespace or root.source_namespace
    if not out.gateways:
        out.gateways.extend(root.gateways)
    out.stat_prefix = out.stat_prefix or root.stat_prefix
    return out


def _conflicts(root: vs_pb2.HTTPMatchRequest, leaf: vs_pb2.HTTPMatchRequest) -> bool:
    """Istio's hasConflict: can `leaf` not be narrower than `root`?"""
    for name in _MATCH_FIELDS:
        if _string_conflict(_get(root, name), _get(leaf, name)):
            return True
    for name in ("headers", "without_headers", "query_params"):
        root_map, leaf_map = getattr(root, name), getattr(leaf, name)
        for key in leaf_map:
            if _string_conflict(root_map.get(key), leaf_map[key]):
                return True
    if root.ignore_uri_case != leaf.ignore_uri_case:
        return True
    if root.port and leaf.port and root.port != leaf.port:
        return True
    if root.source_namespace and leaf.source_namespace != root.source_namespace:
        return True
    if any(key in root.source_labels and root.source_labels[key] != v for key, v in leaf.source_labels.items()):
        return True
    if root.gateways and leaf.gateways:
        return not set(leaf.gateways) <= set(root.gateways) or len(root.gateways) < len(leaf.gateways)
    return False


def _get(match: vs_pb2.HTTPMatchRequest, name: str) -> vs_pb2.StringMatch | None:
    return getattr(match, name) if match.HasField(name) else None


def _string_conflict(root: vs_pb2.StringMatch | None, leaf: vs_pb2.StringMatch | None) -> bool:
    """Istio's stringMatchConflict: regexes cannot be narrowed, an exact value only by itself,
    a prefix only by a longer prefix or an exact value under it."""
    if root is None or leaf is None:
        return False
    if root.regex and (leaf.regex or leaf.prefix or leaf.exact):
        return True
    if leaf.regex and (root.regex or root.prefix or root.exact):
        return True
    if root.exact:
        return bool(leaf.prefix) or leaf.exact != root.exact
    if root.prefix:
        if leaf.prefix:
            return not leaf.prefix.startswith(root.prefix)
        if leaf.exact:
            return not leaf.exact.startswith(root.prefix)
    return True
