"""Route rules to VirtualService routes, as Istio's conversion writes them.

Each HTTPRoute (and GRPCRoute) rule becomes one VirtualService HTTP route per match (one
without a match when it has none), named `NAMESPACE.ROUTE.RULE` or by the rule's own name;
filters become the route's headers, redirect, rewrite and mirrors; backendRefs its weighted
destinations; `timeouts` its timeout and `retry` its retries. The routes of every route bound
to one listener and host are then ordered as the Gateway API has it (`order`): exact paths
first, then longer paths, then those matching a method, more headers, more query parameters.
A rule left with no backend it may use answers 500, as the Gateway API asks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from meshctl.config.gateway_api.model import BackendRef, Match, Rule
from meshctl.config.gateway_api.references import Resolved
from meshctl.config.gateway_api.status import UNSUPPORTED_VALUE

#: Istio's retry conditions for a Gateway API `retry` (its codes are added to them).
RETRY_ON: Final = "connect-failure,refused-stream,unavailable,cancelled"
_URI_RANK: Final = {"exact": 3, "prefix": 2, "regex": 1}

#: (backend, path of the reference) -> its destination or why it has none.
Resolve = Callable[[BackendRef], Resolved]
#: (field path, reason, message): a condition the caller records.
Report = Callable[[tuple[str | int, ...], str, str], None]


def _duration(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".") + "s"


def _string_match(kind: str | None, value: str) -> dict[str, str]:
    return {"regex": value} if kind == "RegularExpression" else {"exact": value}


def _http_match(match: Match) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if match.grpc_method is not None:
        m = match.grpc_method
        service, method = m.get("service"), m.get("method")
        if m.get("type", "Exact") == "RegularExpression":
            out["uri"] = {"regex": f"/{service or '[^/]+'}/{method or '[^/]+'}"}
        elif service and method:
            out["uri"] = {"exact": f"/{service}/{method}"}
        elif service:
            out["uri"] = {"prefix": f"/{service}/"}
        else:
            out["uri"] = {"regex": f"/[^/]+/{method}"}
    elif match.path is not None:
        kind, value = match.path.get("type", "PathPrefix"), str(match.path.get("value", "/"))
        if kind == "Exact":
            out["uri"] = {"exact": value}
        elif kind == "RegularExpression":
            out["uri"] = {"regex": value}
        else:
            out["uri"] = {"prefix": value if value == "/" else value.rstrip("/")}
    if match.headers:
        out["headers"] = {str(h["name"]).lower(): _string_match(h.get("type"), str(h["value"])) for h in match.headers}
    if match.query:
        out["queryParams"] = {str(q["name"]): _string_match(q.get("type"), str(q["value"])) for q in match.query}
    if match.method:
        out["method"] = {"exact": match.method}
    return out


def _headers(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op in ("set", "add"):
        values = {str(h.get("name")): str(h.get("value", "")) for h in config.get(op) or () if isinstance(h, dict)}
        if values:
            out[op] = values
    if config.get("remove"):
        out["remove"] = [str(name) for name in config["remove"]]
    return out


def _redirect(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"redirectCode": int(config.get("statusCode", 302))}
    if config.get("scheme"):
        out["scheme"] = config["scheme"]
    if config.get("hostname"):
        out["authority"] = config["hostname"]
    if config.get("port"):
        out["port"] = int(config["port"])
    path = config.get("path") or {}
    if path.get("type") == "ReplaceFullPath":
        out["uri"] = str(path.get("replaceFullPath", ""))
    elif path.get("type") == "ReplacePrefixMatch":
        out["prefixRewrite"] = str(path.get("replacePrefixMatch", "")) or "/"
    return out


def _rewrite(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config.get("hostname"):
        out["authority"] = config["hostname"]
    path = config.get("path") or {}
    if path.get("type") == "ReplacePrefixMatch":
        out["uri"] = str(path.get("replacePrefixMatch", "")) or "/"
    elif path.get("type") == "ReplaceFullPath":
        out["uriRegexRewrite"] = {"match": "/.*", "rewrite": str(path.get("replaceFullPath", ""))}
    return out


def _mirror_percent(config: Any) -> float | None:
    fraction = config.get("fraction")
    if isinstance(fraction, dict) and fraction.get("numerator") is not None:
        denominator = fraction.get("denominator", 100) or 100
        return 100.0 * float(fraction["numerator"]) / float(denominator)
    if config.get("percent") is not None:
        return float(config["percent"])
    return None


def _destination(resolved: Resolved) -> dict[str, Any]:
    out: dict[str, Any] = {"host": resolved.host}
    if resolved.port is not None:
        out["port"] = {"number": resolved.port}
    return out


def destinations(backends: Sequence[BackendRef], resolve: Resolve, report: Report) -> list[dict[str, Any]]:
    """The weighted destinations of the backends that resolve; the others are reported."""
    out = []
    for ref in backends:
        resolved = resolve(ref)
        if resolved.reason:
            report(ref.path, resolved.reason, resolved.message)
            continue
        if ref.weight == 0:
            continue
        out.append({"destination": _destination(resolved), "weight": ref.weight})
    if len(out) == 1:
        del out[0]["weight"]
    return out


def http_routes(
    rule: Rule, route_name: str, resolve: Resolve, report: Report, port: int | None = None
) -> list[dict[str, Any]]:
    """One rule's VirtualService HTTP routes (one per match); `port` restricts them to one port
    of a service (a GAMMA parentRef's port)."""
    base: dict[str, Any] = {"name": rule.name or route_name}
    headers: dict[str, Any] = {}
    redirect = False
    for f in rule.filters:
        if f.type == "RequestHeaderModifier":
            headers["request"] = _headers(f.config)
        elif f.type == "ResponseHeaderModifier":
            headers["response"] = _headers(f.config)
        elif f.type == "RequestRedirect":
            base["redirect"] = _redirect(f.config)
            redirect = True
        elif f.type == "URLRewrite":
            rewrite = _rewrite(f.config)
            if rewrite:  # an empty one changes nothing, and Istio's VirtualService refuses it
                base["rewrite"] = rewrite
        elif f.type == "RequestMirror" and f.backend is not None:
            resolved = resolve(f.backend)
            if resolved.reason:
                report(f.backend.path, resolved.reason, resolved.message)
                continue
            mirror: dict[str, Any] = {"destination": _destination(resolved)}
            percent = _mirror_percent(f.config)
            if percent is not None:
                mirror["percentage"] = {"value": percent}
            base.setdefault("mirrors", []).append(mirror)
        else:
            report(f.path, UNSUPPORTED_VALUE, f"filter {f.type} is not served; the rule is served without it")
    if headers:
        base["headers"] = headers
    if not redirect:
        routes = destinations(rule.backends, resolve, report)
        if routes:
            base["route"] = routes
        else:
            base.pop("rewrite", None)  # nothing to rewrite for: Istio's VirtualService forbids both
            base["directResponse"] = {"status": 500}
    if rule.timeout is not None and rule.timeout > 0:
        base["timeout"] = _duration(rule.timeout)
    if rule.retry is not None:
        attempts = rule.retry["attempts"]
        if attempts is None or attempts:
            retries: dict[str, Any] = {"attempts": 2 if attempts is None else attempts}
            retries["retryOn"] = ",".join([RETRY_ON, *map(str, rule.retry["codes"])])
            if rule.retry["backoff"]:
                retries["backoff"] = _duration(rule.retry["backoff"])
            base["retries"] = retries
        else:
            base["retries"] = {}
    if not rule.matches:
        return [{**base, "match": [{"port": port}]} if port else base]
    out = []
    for match in rule.matches:
        m = _http_match(match)
        if port:
            m["port"] = port
        out.append({**base, "match": [m]})
    return out


def order(routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Istio's order of the HTTP routes of one host (a stable sort, on each route's one match):
    exact over prefix over regex paths, longer paths first, then routes matching a method, more
    headers, more query parameters; routes without a match last, in the order given."""

    def key(route: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
        matches = route.get("match") or []
        if not matches or set(matches[0]) <= {"port"}:
            return (1, 0, 0, 0, 0, 0)
        m = matches[0]
        uri = m.get("uri") or {}
        kind, value = next(iter(uri.items()), ("", ""))
        return (
            0,
            -_URI_RANK.get(kind, 0),
            -len(value),
            0 if "method" in m else 1,
            -len(m.get("headers") or {}),
            -len(m.get("queryParams") or {}),
        )

    return sorted(routes, key=key)
