"""Gateway API documents (gateway.networking.k8s.io) read into plain, typed values.

There is no protobuf schema for the Gateway API: the loader keeps each spec as a
`google.protobuf.Struct` (so a Config stays plain, hashable data like every other kind) and this
module reads it into the dataclasses the translation works on, collecting a field-path issue for
every value the Gateway API's own validation would refuse. `validate` is what the loader runs;
`parse_*` is what the translation runs, on specs that validated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.gateway_api.reader import SECTION, Reader, plain
from meshctl.config.validation.issue import Issue

GROUP: Final = "gateway.networking.k8s.io"
#: The group of Istio's own kinds a route may name (`Hostname`, `ServiceEntry`).
ISTIO_GROUP: Final = "networking.istio.io"
#: How each Gateway API kind is written -> the kind meshctl keys it by. Only the Gateway is
#: renamed, as Istio's own registry does: `Gateway` is Istio's networking kind.
KINDS: Final[Mapping[str, str]] = {
    "Gateway": "KubernetesGateway",
    "GatewayClass": "GatewayClass",
    "HTTPRoute": "HTTPRoute",
    "GRPCRoute": "GRPCRoute",
    "TCPRoute": "TCPRoute",
    "TLSRoute": "TLSRoute",
    "ReferenceGrant": "ReferenceGrant",
}
#: The kind meshctl keys by -> how it is written (for messages).
WRITTEN: Final[Mapping[str, str]] = {v: k for k, v in KINDS.items()}
ROUTE_KINDS: Final = ("HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute")
PROTOCOLS: Final = ("HTTP", "HTTPS", "TLS", "TCP", "UDP")

# -- references -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParentRef:
    group: str
    kind: str
    name: str
    namespace: str | None
    section_name: str | None
    port: int | None
    path: FieldPath


@dataclass(frozen=True, slots=True)
class BackendRef:
    group: str
    kind: str
    name: str
    namespace: str | None
    port: int | None
    weight: int
    path: FieldPath
    filters: tuple[Filter, ...] = ()


@dataclass(frozen=True, slots=True)
class SecretRef:
    group: str
    kind: str
    name: str
    namespace: str | None
    path: FieldPath


def _core(group: str | None) -> str:
    return "" if group in (None, "", "core") else group


def _parent_ref(r: Reader, data: Any, path: FieldPath) -> ParentRef | None:
    d = r.obj(data, path)
    name = r.text(d, "name", path, required=True)
    section = r.text(d, "sectionName", path)
    if section is not None and not SECTION.fullmatch(section):
        r.bad((*path, "sectionName"), f"invalid sectionName {section!r}: a DNS label")
    port = r.number(d, "port", path, 1, 65535)
    if name is None:
        return None
    group = d.get("group", GROUP)
    return ParentRef(
        _core(group if isinstance(group, str) else GROUP),
        str(d.get("kind", "Gateway")),
        name,
        r.text(d, "namespace", path),
        section,
        port,
        path,
    )


def _backend_ref(r: Reader, data: Any, path: FieldPath, *, with_filters: bool = True) -> BackendRef | None:
    d = r.obj(data, path)
    name = r.text(d, "name", path, required=True)
    group = _core(r.text(d, "group", path))
    kind = r.text(d, "kind", path) or "Service"
    port = r.number(d, "port", path, 1, 65535)
    weight = r.number(d, "weight", path, 0, 1_000_000)
    if group == "" and kind == "Service" and port is None and name is not None:
        r.bad((*path, "port"), "port is required for a Service backend")
    filters = tuple(_filters(r, d.get("filters"), (*path, "filters"))) if with_filters else ()
    if name is None:
        return None
    return BackendRef(
        group, kind, name, r.text(d, "namespace", path), port, 1 if weight is None else weight, path, filters
    )


def _secret_ref(r: Reader, data: Any, path: FieldPath) -> SecretRef | None:
    d = r.obj(data, path)
    name = r.text(d, "name", path, required=True)
    if name is None:
        return None
    return SecretRef(
        _core(r.text(d, "group", path)), r.text(d, "kind", path) or "Secret", name, r.text(d, "namespace", path), path
    )


# -- Gateway --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    port: int
    protocol: str
    hostname: str | None
    tls_mode: str | None
    certificates: tuple[SecretRef, ...]
    #: allowedRoutes.namespaces.from: Same, All or Selector.
    allowed_from: str
    #: allowedRoutes.namespaces.selector.matchLabels (Selector only).
    selector: Mapping[str, str]
    #: allowedRoutes.kinds as (group, kind); empty for the protocol's default kinds.
    kinds: tuple[tuple[str, str], ...]
    path: FieldPath


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    class_name: str
    listeners: tuple[Listener, ...]


def parse_gateway(data: dict[str, Any]) -> tuple[GatewaySpec, list[Issue]]:
    r = Reader()
    class_name = r.text(data, "gatewayClassName", ("spec",), required=True) or ""
    listeners: list[Listener] = []
    seen: dict[str, FieldPath] = {}
    entries = r.items(data.get("listeners"), ("spec", "listeners"))
    if not entries:
        r.bad(("spec", "listeners"), "a Gateway needs at least one listener")
    for path, item in entries:
        d = r.obj(item, path)
        name = r.text(d, "name", path, required=True)
        if name is not None and not SECTION.fullmatch(name):
            r.bad((*path, "name"), f"invalid listener name {name!r}: a DNS label")
        if name is not None and name in seen:
            r.bad((*path, "name"), f"listener name {name!r} is used twice")
        port = r.number(d, "port", path, 1, 65535, required=True)
        protocol = r.text(d, "protocol", path, required=True)
        hostname = d.get("hostname")
        if hostname is not None:
            hostname = r.hostname(hostname, (*path, "hostname"))
        tls = r.obj(d.get("tls"), (*path, "tls"))
        tls_mode = r.choice(tls, "mode", (*path, "tls"), ("Terminate", "Passthrough"), "Terminate") if tls else None
        certificates = tuple(
            ref
            for p, c in r.items(tls.get("certificateRefs"), (*path, "tls", "certificateRefs"))
            if (ref := _secret_ref(r, c, p)) is not None
        )
        if protocol == "HTTPS" and (tls_mode != "Terminate" or not certificates):
            r.bad((*path, "tls"), "an HTTPS listener needs tls.mode Terminate with certificateRefs")
        if protocol == "TLS" and tls_mode == "Terminate" and not certificates:
            r.bad((*path, "tls", "certificateRefs"), "a TLS listener that terminates needs certificateRefs")
        if protocol == "TLS" and not tls:
            r.bad((*path, "tls"), "a TLS listener needs tls (mode Passthrough or Terminate)")
        allowed = r.obj(d.get("allowedRoutes"), (*path, "allowedRoutes"))
        namespaces = r.obj(allowed.get("namespaces"), (*path, "allowedRoutes", "namespaces"))
        npath = (*path, "allowedRoutes", "namespaces")
        allowed_from = r.choice(namespaces, "from", npath, ("Same", "All", "Selector"), "Same") or "Same"
        selector_data = r.obj(namespaces.get("selector"), (*npath, "selector"))
        selector = {
            str(k): str(v)
            for k, v in r.obj(selector_data.get("matchLabels"), (*npath, "selector", "matchLabels")).items()
        }
        if selector_data.get("matchExpressions"):
            r.bad((*npath, "selector", "matchExpressions"), "matchExpressions are not served: use matchLabels")
        if allowed_from == "Selector" and not selector_data:
            r.bad((*npath, "selector"), "from: Selector needs a selector")
        kinds = []
        for p, k in r.items(allowed.get("kinds"), (*path, "allowedRoutes", "kinds")):
            kd = r.obj(k, p)
            kind = r.text(kd, "kind", p, required=True)
            if kind is not None:
                kinds.append((_core(kd.get("group", GROUP)), kind))
        if name is None or port is None or protocol is None:
            continue
        seen[name] = path
        listeners.append(
            Listener(name, port, protocol, hostname, tls_mode, certificates, allowed_from, selector, tuple(kinds), path)
        )
    return GatewaySpec(class_name, tuple(listeners)), r.issues


# -- routes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    type: str
    #: The filter's own settings (`requestHeaderModifier: {...}` and the like), as written.
    config: Mapping[str, Any]
    path: FieldPath
    #: RequestMirror's backend.
    backend: BackendRef | None = None


@dataclass(frozen=True, slots=True)
class Match:
    #: HTTP: path (type, value); GRPC: method (type, service, method), as written.
    path: Mapping[str, Any] | None
    headers: tuple[Mapping[str, Any], ...]
    query: tuple[Mapping[str, Any], ...]
    method: str | None
    grpc_method: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    index: int
    name: str | None
    matches: tuple[Match, ...]
    filters: tuple[Filter, ...]
    backends: tuple[BackendRef, ...]
    timeout: float | None
    #: `attempts` (None when not given), `backoff` (seconds or None) and `codes`, as validated.
    retry: Mapping[str, Any] | None
    path: FieldPath


@dataclass(frozen=True, slots=True)
class RouteSpec:
    kind: str
    parents: tuple[ParentRef, ...]
    hostnames: tuple[str, ...]
    rules: tuple[Rule, ...]


_FILTERS: Final = {
    "RequestHeaderModifier": "requestHeaderModifier",
    "ResponseHeaderModifier": "responseHeaderModifier",
    "RequestRedirect": "requestRedirect",
    "URLRewrite": "urlRewrite",
    "RequestMirror": "requestMirror",
    "CORS": "cors",
    "ExtensionRef": "extensionRef",
}
_HEADER_TYPES: Final = ("Exact", "RegularExpression")
_PATH_TYPES: Final = ("Exact", "PathPrefix", "RegularExpression")
_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")


def _filters(r: Reader, data: Any, path: FieldPath) -> list[Filter]:
    out = []
    for p, item in r.items(data, path, 16):
        d = r.obj(item, p)
        kind = r.choice(d, "type", p, tuple(_FILTERS))
        if kind is None:
            continue
        field_name = _FILTERS[kind]
        config = r.obj(d.get(field_name), (*p, field_name))
        if field_name not in d:
            r.bad(p, f"a {kind} filter needs {field_name}")
        backend = None
        at = (*p, field_name)
        if kind == "RequestMirror":
            backend = _backend_ref(r, config.get("backendRef"), (*at, "backendRef"), with_filters=False)
            if backend is None and "backendRef" not in config:
                r.bad(at, "a RequestMirror filter needs backendRef")
        _filter_settings(r, kind, config, at)
        out.append(Filter(kind, config, p, backend))
    return out


_REDIRECT_CODES: Final = (301, 302, 303, 307, 308)


def _filter_settings(r: Reader, kind: str, config: dict[str, Any], at: FieldPath) -> None:
    """The Gateway API's rules for one filter's settings, so translating them cannot meet a
    value of the wrong type."""
    if kind in ("RequestHeaderModifier", "ResponseHeaderModifier"):
        for op in ("set", "add"):
            for p, header in r.items(config.get(op), (*at, op), 16):
                h = r.obj(header, p)
                r.text(h, "name", p, required=True)
                r.text(h, "value", p, required=True)
        for p, name in r.items(config.get("remove"), (*at, "remove"), 16):
            if not isinstance(name, str):
                r.bad(p, "must be a string")
    elif kind in ("RequestRedirect", "URLRewrite"):
        r.text(config, "hostname", at)
        if kind == "RequestRedirect":
            r.choice(config, "scheme", at, ("http", "https"))
            r.number(config, "port", at, 1, 65535)
            code = config.get("statusCode")
            if code is not None and code not in _REDIRECT_CODES:
                r.bad((*at, "statusCode"), f"must be one of {', '.join(map(str, _REDIRECT_CODES))}")
        path = r.obj(config.get("path"), (*at, "path"))
        if path:
            which = r.choice(path, "type", (*at, "path"), ("ReplaceFullPath", "ReplacePrefixMatch"))
            if which is not None:
                key = "replaceFullPath" if which == "ReplaceFullPath" else "replacePrefixMatch"
                r.text(path, key, (*at, "path"), required=True)
    elif kind == "RequestMirror":
        r.number(config, "percent", at, 0, 100)
        fraction = r.obj(config.get("fraction"), (*at, "fraction"))
        if fraction:
            numerator = r.number(fraction, "numerator", (*at, "fraction"), 0, 1_000_000, required=True)
            denominator = r.number(fraction, "denominator", (*at, "fraction"), 1, 1_000_000)
            if numerator is not None and numerator > (denominator or 100):
                r.bad((*at, "fraction"), "numerator must not exceed denominator")


def _header_matches(r: Reader, data: Any, path: FieldPath) -> tuple[Mapping[str, Any], ...]:
    out = []
    for p, item in r.items(data, path, 16):
        d = r.obj(item, p)
        if r.text(d, "name", p, required=True) is None or r.text(d, "value", p, required=True) is None:
            continue
        r.choice(d, "type", p, _HEADER_TYPES)
        out.append(d)
    return tuple(out)


def _match(r: Reader, kind: str, data: Any, path: FieldPath) -> Match:
    d = r.obj(data, path)
    headers = _header_matches(r, d.get("headers"), (*path, "headers"))
    if kind == "GRPCRoute":
        method = r.obj(d.get("method"), (*path, "method"))
        if method:
            r.choice(method, "type", (*path, "method"), _HEADER_TYPES)
            if not method.get("service") and not method.get("method"):
                r.bad((*path, "method"), "a method match needs service or method")
        return Match(None, headers, (), None, method or None)
    route_path = r.obj(d.get("path"), (*path, "path"))
    if route_path:
        r.choice(route_path, "type", (*path, "path"), _PATH_TYPES)
        value = r.text(route_path, "value", (*path, "path"))
        if (
            value is not None
            and route_path.get("type", "PathPrefix") != "RegularExpression"
            and not value.startswith("/")
        ):
            r.bad((*path, "path", "value"), "a path must start with '/'")
    query = _header_matches(r, d.get("queryParams"), (*path, "queryParams"))
    http_method = r.choice(d, "method", path, _METHODS)
    return Match(route_path or None, headers, query, http_method)


def parse_route(kind: str, data: dict[str, Any]) -> tuple[RouteSpec, list[Issue]]:
    r = Reader()
    parents = tuple(
        ref
        for p, item in r.items(data.get("parentRefs"), ("spec", "parentRefs"), 32)
        if (ref := _parent_ref(r, item, p))
    )
    hostnames = []
    if kind not in ("TCPRoute",):
        for p, h in r.items(data.get("hostnames"), ("spec", "hostnames"), 16):
            if (host := r.hostname(h, p)) is not None:
                hostnames.append(host)
    rules = []
    entries = r.items(data.get("rules"), ("spec", "rules"), 64)
    if not entries and kind != "HTTPRoute":
        r.bad(("spec", "rules"), f"a {kind} needs at least one rule")
    for index, (path, item) in enumerate(entries):
        d = r.obj(item, path)
        layer7 = kind in ("HTTPRoute", "GRPCRoute")
        matches = (
            tuple(_match(r, kind, m, p) for p, m in r.items(d.get("matches"), (*path, "matches"))) if layer7 else ()
        )
        filters = tuple(_filters(r, d.get("filters"), (*path, "filters"))) if layer7 else ()
        backends = tuple(
            backend
            for p, b in r.items(d.get("backendRefs"), (*path, "backendRefs"), 16)
            if (backend := _backend_ref(r, b, p, with_filters=layer7)) is not None
        )
        kinds = [f.type for f in filters]
        if "RequestRedirect" in kinds and "URLRewrite" in kinds:
            r.bad((*path, "filters"), "a rule cannot have both RequestRedirect and URLRewrite filters")
        if "RequestRedirect" in kinds and backends:
            r.bad((*path, "backendRefs"), "a rule with a RequestRedirect filter cannot have backendRefs")
        if kinds.count("RequestHeaderModifier") > 1 or kinds.count("ResponseHeaderModifier") > 1:
            r.bad((*path, "filters"), "a header modifier filter may be given once per rule")
        timeouts = r.obj(d.get("timeouts"), (*path, "timeouts")) if kind == "HTTPRoute" else {}
        request = r.duration(timeouts, "request", (*path, "timeouts"))
        backend_request = r.duration(timeouts, "backendRequest", (*path, "timeouts"))
        retry: dict[str, Any] | None = None
        if kind == "HTTPRoute" and "retry" in d:
            given = r.obj(d.get("retry"), (*path, "retry"))
            retry = {
                "attempts": r.number(given, "attempts", (*path, "retry"), 0, 1000),
                "backoff": r.duration(given, "backoff", (*path, "retry")),
                "codes": [],
            }
            for p, code in r.items(given.get("codes"), (*path, "retry", "codes")):
                if not isinstance(code, int) or isinstance(code, bool) or not 400 <= code <= 599:
                    r.bad(p, "a retry code is an HTTP status from 400 to 599")
                else:
                    retry["codes"].append(code)
        rules.append(
            Rule(
                index,
                r.text(d, "name", path),
                matches,
                filters,
                backends,
                backend_request if backend_request is not None else request,
                retry,
                path,
            )
        )
    return RouteSpec(kind, parents, tuple(hostnames), tuple(rules)), r.issues


# -- ReferenceGrant and GatewayClass --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrantFrom:
    group: str
    kind: str
    namespace: str


@dataclass(frozen=True, slots=True)
class GrantTo:
    group: str
    kind: str
    name: str | None


@dataclass(frozen=True, slots=True)
class GrantSpec:
    sources: tuple[GrantFrom, ...]
    targets: tuple[GrantTo, ...]


def parse_grant(data: dict[str, Any]) -> tuple[GrantSpec, list[Issue]]:
    r = Reader()
    sources, targets = [], []
    for p, item in r.items(data.get("from"), ("spec", "from"), 16):
        d = r.obj(item, p)
        kind, namespace = r.text(d, "kind", p, required=True), r.text(d, "namespace", p, required=True)
        if kind is not None and namespace is not None:
            sources.append(GrantFrom(_core(d.get("group")), kind, namespace))
    for p, item in r.items(data.get("to"), ("spec", "to"), 16):
        d = r.obj(item, p)
        kind = r.text(d, "kind", p, required=True)
        if kind is not None:
            targets.append(GrantTo(_core(d.get("group")), kind, r.text(d, "name", p)))
    if not sources:
        r.bad(("spec", "from"), "a ReferenceGrant needs at least one from")
    if not targets:
        r.bad(("spec", "to"), "a ReferenceGrant needs at least one to")
    return GrantSpec(tuple(sources), tuple(targets)), r.issues


def parse_class(data: dict[str, Any]) -> tuple[str, list[Issue]]:
    r = Reader()
    return r.text(data, "controllerName", ("spec",), required=True) or "", r.issues


def _parser(kind: str) -> Callable[[dict[str, Any]], tuple[Any, list[Issue]]]:
    if kind == "KubernetesGateway":
        return parse_gateway
    if kind == "ReferenceGrant":
        return parse_grant
    if kind == "GatewayClass":
        return parse_class
    return lambda data: parse_route(kind, data)


def validate(kind: str, spec: Message) -> list[Issue]:
    """The Gateway API's own rules for one resource (what its CRD's schema and CEL rules refuse)."""
    return _parser(kind)(plain(spec))[1]
