"""VirtualService rules: hosts, gateways, and every HTTP, TLS and TCP route.

A VirtualService without hosts is a delegate: it is only reachable through another
VirtualService's `delegate`, so it may not name gateways or carry TLS/TCP routes. Rules that can
never match (after a catch-all, or with a match an earlier rule already has) are warnings, as in
Istio: the config works, it just does not do what it says.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.hosts import is_ip
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    MESH_GATEWAY,
    Report,
    check_destination,
    check_export_to,
    check_labels,
    duration_problem,
    fractional_percent_problem,
    gateway_name_issues,
    header_name_problem,
    header_value_problem,
    host_within,
    hosts_overlap,
    ip_or_cidr_problem,
    is_dns_label,
    is_jwt_claim_header,
    port_problem,
    regex_problem,
    wildcard_domain_problem,
)
from meshctl.config.validation.envoy_limits import line_break_problem

# Envoy's x-envoy-retry-on and x-envoy-retry-grpc-on policies.
_RETRY_ON: Final = frozenset(
    (
        "5xx", "gateway-error", "reset", "reset-before-request", "connect-failure", "retriable-4xx",
        "refused-stream", "retriable-status-codes", "retriable-headers", "envoy-ratelimited",
        "http3-post-connect-failure", "cancelled", "deadline-exceeded", "internal", "resource-exhausted",
        "unavailable",
    )
)  # fmt: skip
# CORS methods Istio accepts (its supportedCORSMethods): Go's method names, and "*" for any.
_CORS_METHODS: Final = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*"))
_GRPC_STATUSES: Final = frozenset(
    (
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
    )
)  # fmt: skip
_HTTP_STATUS_CODES: Final = frozenset(s.value for s in HTTPStatus)
# Gateways route auto-generated SNI names such as `outbound_.80_._.reviews.shop.mesh`.
_OUTBOUND_SNI = re.compile(r"outbound_.([0-8].*).*")
_KIB: Final = 1024


def validate(spec: Message) -> list[Issue]:
    vs: Any = spec
    report = Report()
    gateways = list(vs.gateways)
    delegate = not vs.hosts
    gateway_only = bool(gateways) and MESH_GATEWAY not in gateways
    for field, what in (("gateways", "gateways"), ("tls", "tls routes"), ("tcp", "tcp routes")):
        if delegate and getattr(vs, field):
            report.error(("spec", field), f"a delegate VirtualService (one without hosts) cannot have {what}")
    gateway_name_issues(report, ("spec", "gateways"), gateways)
    _hosts(report, vs, gateway_only)
    if not (vs.http or vs.tcp or vs.tls):
        report.error(("spec",), "a VirtualService needs at least one http, tcp or tls route")
    for i, http in enumerate(vs.http):
        _http_route(report, ("spec", "http", i), http, delegate=delegate, gateway_only=gateway_only)
    for i, tls in enumerate(vs.tls):
        _tls_route(report, ("spec", "tls", i), tls, vs)
    for i, tcp in enumerate(vs.tcp):
        path: FieldPath = ("spec", "tcp", i)
        for j, match in enumerate(tcp.match):
            _l4_match(report, (*path, "match", j), match)
        if not tcp.route:
            report.error(path, "a tcp route needs at least one destination in route")
        _route_destinations(report, (*path, "route"), tcp.route, http=False)
    for kind in ("http", "tcp", "tls"):
        _source_match_warnings(report, kind, getattr(vs, kind), gateways)
    check_export_to(report, ("spec", "exportTo"), vs.export_to, service_entry=False)
    for kind in ("http", "tcp", "tls"):
        _unreachable_rules(report, kind, getattr(vs, kind))
    return report.issues


def _gateway_host_problem(host: str, sni: bool) -> str | None:
    first = host.split(".", 1)[0]
    if sni and first == "outbound_":
        return None if _OUTBOUND_SNI.match(host) else f'invalid host "{host}": malformed outbound_ SNI name'
    return wildcard_domain_problem(host)


def _hosts(report: Report, vs: Any, gateway_only: bool) -> None:
    sni = any(match.sni_hosts for tls in vs.tls for match in tls.match)
    hosts = list(vs.hosts)
    all_valid = True
    for i, host in enumerate(hosts):
        problem = _gateway_host_problem(host, sni) if gateway_only else wildcard_domain_problem(host)
        if problem and not is_ip(host):
            report.error(("spec", "hosts", i), problem)
            all_valid = False
        elif not problem and not gateway_only and host == "*":
            report.error(("spec", "hosts", i), 'host "*" is not allowed in a VirtualService bound to the mesh')
            all_valid = False
    if all_valid:
        for j, later in enumerate(hosts):
            for earlier in hosts[:j]:
                if hosts_overlap(earlier, later):
                    report.error(("spec", "hosts", j), f'duplicate host: "{later}" overlaps "{earlier}"')
                    break


# --- HTTP ----------------------------------------------------------------------------------


def _http_route(report: Report, path: FieldPath, http: Any, *, delegate: bool, gateway_only: bool) -> None:
    _http_conflicts(report, path, http, delegate=delegate)
    for j, match in enumerate(http.match):
        _http_match(report, (*path, "match", j), match, gateway_only)
    if http.HasField("headers"):
        _header_operations(report, (*path, "headers"), http.headers)
    _authority_rewritten_once(report, path, http)
    if http.HasField("cors_policy"):
        _cors(report, (*path, "corsPolicy"), http.cors_policy)
    if http.HasField("fault"):
        _fault(report, (*path, "fault"), http.fault)
    if http.HasField("mirror_percent"):
        value = http.mirror_percent.value
        if value > 100:
            report.error((*path, "mirror_percent"), f"mirror_percent {value} must be at most 100")
        report.warn((*path, "mirror_percent"), 'mirror_percent is deprecated: use "mirrorPercentage"')
    if http.HasField("mirror_percentage"):
        _mirror_percentage(report, (*path, "mirrorPercentage"), http.mirror_percentage.value)
    if http.HasField("mirror"):
        check_destination(report, (*path, "mirror"), http.mirror)
    for j, mirror in enumerate(http.mirrors):
        if not mirror.HasField("destination"):
            report.error((*path, "mirrors", j), "a mirror needs a destination")
            continue
        check_destination(report, (*path, "mirrors", j, "destination"), mirror.destination)
        if mirror.HasField("percentage"):
            _mirror_percentage(report, (*path, "mirrors", j, "percentage"), mirror.percentage.value)
    if http.HasField("redirect"):
        _redirect(report, (*path, "redirect"), http.redirect)
        _prefix_rewrite_matches(report, path, http)
    if http.HasField("direct_response"):
        _direct_response(report, (*path, "directResponse"), http.direct_response)
    if http.HasField("retries"):
        _retries(report, (*path, "retries"), http.retries)
    if http.HasField("rewrite"):
        _rewrite(report, (*path, "rewrite"), http.rewrite)
    _route_destinations(report, (*path, "route"), http.route, http=True)
    if http.HasField("timeout"):
        report.error((*path, "timeout"), duration_problem(http.timeout))


def _http_conflicts(report: Report, path: FieldPath, http: Any, *, delegate: bool) -> None:
    redirect, direct = http.HasField("redirect"), http.HasField("direct_response")
    if not delegate and http.HasField("delegate"):
        if redirect:
            report.error((*path, "redirect"), "an HTTP route that delegates cannot also redirect")
        if http.route:
            report.error((*path, "route"), "an HTTP route that delegates cannot also have route")
        return
    if delegate and http.HasField("delegate"):
        report.error((*path, "delegate"), "a delegate VirtualService cannot delegate again")

    present = {
        "route": bool(http.route),
        "fault": http.HasField("fault"),
        "rewrite": http.HasField("rewrite"),
        "directResponse": direct,
    }
    action = "redirect" if redirect else "directResponse" if direct else None
    if action is not None:
        for name, there in present.items():
            if there and name != action:
                report.error((*path, name), f'an HTTP route cannot have both "{name}" and "{action}"')
    elif not http.route:
        needs = (
            '"route", "redirect" or "directResponse"'
            if delegate
            else '"route", "redirect", "directResponse" or "delegate"'
        )
        report.error(path, f"an HTTP route needs {needs}")
    if http.HasField("mirror") and http.mirrors:
        report.error((*path, "mirrors"), 'an HTTP route cannot have both "mirror" and "mirrors"')


def _string_match(report: Report, path: FieldPath, match: Any, *, empty_prefix: bool = False) -> None:
    kind = match.WhichOneof("match_type")
    if kind == "prefix" and not match.prefix and not empty_prefix:
        report.error((*path, "prefix"), "prefix must not be empty")
    elif kind == "regex":
        report.error((*path, "regex"), regex_problem(match.regex))


def _http_match(report: Report, path: FieldPath, match: Any, gateway_only: bool) -> None:
    for field, json_name in (("headers", "headers"), ("without_headers", "withoutHeaders")):
        for name, header in sorted(getattr(match, field).items()):
            at = (*path, json_name, name)
            report.error(at, header_name_problem(name, jwt_claims=True, pseudo=True))
            if is_jwt_claim_header(name) and not gateway_only:
                report.error(at, f'routing on a JWT claim ("{name}") is only supported for gateways')
            # In withoutHeaders a regex of "*" means "header present", not an RE2 pattern.
            if field == "headers" or header.regex != "*":
                _string_match(report, at, header)
    if match.HasField("uri"):  # an empty uri prefix is Envoy's catch-all "/"
        _string_match(report, (*path, "uri"), match.uri, empty_prefix=True)
    for field in ("scheme", "method", "authority"):
        if match.HasField(field):
            _string_match(report, (*path, field), getattr(match, field))
    for name, param in sorted(match.query_params.items()):
        _string_match(report, (*path, "queryParams", name), param)
    if match.port:
        report.error((*path, "port"), port_problem(match.port))
    check_labels(report, (*path, "sourceLabels"), match.source_labels)
    gateway_name_issues(report, (*path, "gateways"), match.gateways)
    if match.source_namespace and not is_dns_label(match.source_namespace):
        report.error((*path, "sourceNamespace"), f'invalid sourceNamespace "{match.source_namespace}"')


def _header_operations(report: Report, path: FieldPath, headers: Any) -> None:
    for side in ("request", "response"):
        if not headers.HasField(side):
            continue
        operations = getattr(headers, side)
        for op in ("set", "add"):
            for name, value in sorted(getattr(operations, op).items()):
                at = (*path, side, op, name)
                report.error(at, _operation_name_problem(name, authority_ok=side == "request"))
                report.error(at, header_value_problem(value))
        for i, name in enumerate(operations.remove):
            report.error((*path, side, "remove", i), _operation_name_problem(name, authority_ok=False))


def _is_authority(name: str) -> bool:
    return name.lower() in (":authority", "host")


def _operation_name_problem(name: str, *, authority_ok: bool) -> str | None:
    """Pseudo-headers (`:path`) cannot be changed; the authority only by setting a request header."""
    if not name:
        return "header name must not be empty"
    if authority_ok and _is_authority(name):
        return None
    if name.lower() == "host" or name.startswith(":"):
        return f'header "{name}" cannot be changed here'
    return None


def _authority_rewritten_once(report: Report, path: FieldPath, http: Any) -> None:
    current = http.rewrite.authority if http.HasField("rewrite") else ""
    request = http.headers.request
    for op in ("set", "add"):
        for name, value in sorted(getattr(request, op).items()):
            if not _is_authority(name):
                continue
            if current:
                report.error(
                    (*path, "headers", "request", op, name),
                    f'the authority is rewritten more than once: "{current}", then "{value}"',
                )
            current = value


def _cors(report: Report, path: FieldPath, cors: Any) -> None:
    for i, origin in enumerate(cors.allow_origins):
        kind = origin.WhichOneof("match_type")
        if not kind or not getattr(origin, kind):
            report.error((*path, "allowOrigins", i), "an allowOrigins entry needs a non-empty exact, prefix or regex")
        elif kind == "regex":
            report.error((*path, "allowOrigins", i, "regex"), regex_problem(origin.regex))
    for i, method in enumerate(cors.allow_methods):
        if method not in _CORS_METHODS:
            report.error((*path, "allowMethods", i), f'"{method}" is not a supported HTTP method')
    for field, json_name in (("allow_headers", "allowHeaders"), ("expose_headers", "exposeHeaders")):
        for i, name in enumerate(getattr(cors, field)):
            if name != "*":
                report.error((*path, json_name, i), header_name_problem(name))
    if cors.HasField("max_age"):
        report.error((*path, "maxAge"), duration_problem(cors.max_age))
        if cors.max_age.nanos:
            report.error((*path, "maxAge"), "maxAge is only accurate to whole seconds")


def _fault(report: Report, path: FieldPath, fault: Any) -> None:
    if not fault.HasField("abort") and not fault.HasField("delay"):
        report.error(path, "fault injection needs an abort, a delay, or both")
    if fault.HasField("abort"):
        abort, at = fault.abort, (*path, "abort")
        if abort.HasField("percentage"):
            report.error((*at, "percentage", "value"), fractional_percent_problem(abort.percentage.value))
        kind = abort.WhichOneof("error_type")
        if kind == "http_status" and not 200 <= abort.http_status <= 599:
            report.error((*at, "httpStatus"), f"HTTP status {abort.http_status} must be in the range 200..599")
        elif kind == "grpc_status" and abort.grpc_status not in _GRPC_STATUSES:
            report.error((*at, "grpcStatus"), f'unknown gRPC status "{abort.grpc_status}" (e.g. "UNAVAILABLE")')
        elif kind == "http2_error":
            report.error((*at, "http2Error"), "HTTP/2 abort fault injection is not supported")
        elif kind is None:
            report.warn(at, "abort has no httpStatus or grpcStatus: it aborts nothing")
    if fault.HasField("delay"):
        delay, at = fault.delay, (*path, "delay")
        if delay.HasField("percentage"):
            report.error((*at, "percentage", "value"), fractional_percent_problem(delay.percentage.value))
        if delay.HasField("fixed_delay"):
            report.error((*at, "fixedDelay"), duration_problem(delay.fixed_delay))
        if delay.HasField("exponential_delay"):
            report.error((*at, "exponentialDelay"), "exponentialDelay is not supported: use fixedDelay")


def _mirror_percentage(report: Report, path: FieldPath, value: float) -> None:
    if not 0 <= value <= 100:
        report.error(path, f"mirror percentage {value:g} must be in the range 0..100")


def _redirect(report: Report, path: FieldPath, redirect: Any) -> None:
    # Istio's validateHTTPRedirect: any one of these makes a redirect (prefixRewrite alone too).
    if not (
        redirect.uri
        or redirect.authority
        or redirect.scheme
        or redirect.prefix_rewrite
        or redirect.WhichOneof("redirect_port")
    ):
        report.error(path, "a redirect needs at least one of uri, authority, scheme, port or prefixRewrite")
    if redirect.redirect_code and not 300 <= redirect.redirect_code <= 399:
        report.error((*path, "redirectCode"), f"redirectCode {redirect.redirect_code} must be a 3xx code")
    if redirect.scheme and redirect.scheme not in ("http", "https"):
        report.error((*path, "scheme"), f'redirect scheme "{redirect.scheme}" must be "http" or "https"')
    if redirect.WhichOneof("redirect_port") == "port" and redirect.port:
        report.error((*path, "port"), port_problem(redirect.port))
    for field, json_name in (("uri", "uri"), ("authority", "authority"), ("prefix_rewrite", "prefixRewrite")):
        report.error((*path, json_name), line_break_problem(getattr(redirect, field), f"redirect {json_name}"))


def _prefix_rewrite_matches(report: Report, path: FieldPath, http: Any) -> None:
    """A redirect's `prefixRewrite` swaps the matched prefix: it cannot go with `uri` (Envoy's
    RedirectAction takes one path rewrite), and needs every uri match to be a prefix."""
    redirect = http.redirect
    if not redirect.prefix_rewrite:
        return
    at: FieldPath = (*path, "redirect", "prefixRewrite")
    if redirect.uri:
        report.error(at, "a redirect cannot set both uri and prefixRewrite")
    for j, match in enumerate(http.match):
        kind = match.uri.WhichOneof("match_type") if match.HasField("uri") else None
        if kind in ("exact", "regex"):
            report.error(
                (*path, "match", j, "uri", kind),
                f"prefixRewrite in a redirect needs prefix uri matches, found a {kind} match",
            )


def _direct_response(report: Report, path: FieldPath, response: Any) -> None:
    if not 200 <= response.status <= 599:
        report.error((*path, "status"), f"status {response.status} must be in the range 200..599")
    if response.HasField("body"):
        kind = response.body.WhichOneof("specifier")
        body = response.body.string.encode() if kind == "string" else response.body.bytes if kind else b""
        if len(body) > 1024 * _KIB:
            report.error((*path, "body"), "the body is over 1MB: large direct responses slow the control plane")
        elif len(body) > 100 * _KIB:
            report.warn((*path, "body"), "the body is over 100KB: large direct responses slow the control plane")


def _retries(report: Report, path: FieldPath, retries: Any) -> None:
    if retries.attempts < 0:
        report.error((*path, "attempts"), "retry attempts must not be negative")
    if retries.attempts == 0 and (
        retries.HasField("per_try_timeout") or retries.retry_on or retries.HasField("retry_remote_localities")
    ):
        report.error((*path, "attempts"), "retries are disabled (attempts is 0) but other retry settings are set")
    if retries.HasField("per_try_timeout"):
        report.error((*path, "perTryTimeout"), duration_problem(retries.per_try_timeout))
    if retries.HasField("backoff"):  # Envoy's base retry interval: Istio's ValidateDuration bounds
        report.error((*path, "backoff"), duration_problem(retries.backoff))
    if retries.retry_on:
        for policy in retries.retry_on.split(","):
            if (policy.isdigit() and int(policy) in _HTTP_STATUS_CODES) or policy in _RETRY_ON:
                continue
            hint = " (no spaces around commas)" if policy.strip() != policy else ""
            report.error((*path, "retryOn"), f'"{policy}" is not a valid retryOn policy{hint}')


def _rewrite(report: Report, path: FieldPath, rewrite: Any) -> None:
    regex = rewrite.HasField("uri_regex_rewrite")
    if rewrite.uri and regex:
        report.error(path, 'a rewrite can have "uri" or "uriRegexRewrite", not both')
    elif not (rewrite.uri or regex or rewrite.authority):
        report.error(path, 'a rewrite needs "uri", "uriRegexRewrite" or "authority"')
    if regex:
        match, replacement = rewrite.uri_regex_rewrite.match, rewrite.uri_regex_rewrite.rewrite
        if not match or not replacement:
            report.error((*path, "uriRegexRewrite"), 'uriRegexRewrite needs both "match" and "rewrite"')
        else:
            report.error((*path, "uriRegexRewrite", "match"), regex_problem(match))
            report.error((*path, "uriRegexRewrite", "rewrite"), line_break_problem(replacement, "rewrite"))
    for field in ("uri", "authority"):
        report.error((*path, field), line_break_problem(getattr(rewrite, field), f"rewrite {field}"))


def _route_destinations(report: Report, path: FieldPath, routes: Any, *, http: bool) -> None:
    """Weights are relative: any non-negative numbers, as long as they are not all zero."""
    total = 0
    for i, route in enumerate(routes):
        if not route.HasField("destination"):
            report.error((*path, i), "a route needs a destination")
        else:
            check_destination(report, (*path, i, "destination"), route.destination)
        if http and route.HasField("headers"):
            _header_operations(report, (*path, i, "headers"), route.headers)
        if route.weight < 0:
            report.error((*path, i, "weight"), f"weight {route.weight} must not be negative")
        total += route.weight
    if len(routes) > 1 and total == 0:
        report.error(path, "the destination weights add up to 0: give at least one a positive weight")


# --- TLS and TCP ---------------------------------------------------------------------------


def _tls_route(report: Report, path: FieldPath, tls: Any, vs: Any) -> None:
    if not tls.match:
        report.error(path, "a tls route needs at least one match with sniHosts")
    sni_gateway = MESH_GATEWAY not in vs.gateways
    for j, match in enumerate(tls.match):
        at = (*path, "match", j)
        if not match.sni_hosts:
            report.error(at, "a tls match needs at least one host in sniHosts")
        for k, sni in enumerate(match.sni_hosts):
            _sni_host(report, (*at, "sniHosts", k), sni, list(vs.hosts), sni_gateway)
        _l4_match(report, at, match)
    if not tls.route:
        report.error(path, "a tls route needs at least one destination in route")
    _route_destinations(report, (*path, "route"), tls.route, http=False)


def _sni_host(report: Report, path: FieldPath, sni: str, hosts: list[str], gateway: bool) -> None:
    problem = _gateway_host_problem(sni, True) if gateway else wildcard_domain_problem(sni)
    if problem:
        if is_ip(sni):
            report.warn(
                path, f'SNI host "{sni}" is an IP address: the SNI spec forbids it and most clients never send one'
            )
        else:
            report.error(path, problem)
        return
    if not any(host_within(sni, host) for host in hosts):
        report.error(path, f'SNI host "{sni}" is not within the VirtualService hosts ({", ".join(hosts)})')


def _l4_match(report: Report, path: FieldPath, match: Any) -> None:
    for k, subnet in enumerate(match.destination_subnets):
        report.error((*path, "destinationSubnets", k), ip_or_cidr_problem(subnet))
    if match.port:
        report.error((*path, "port"), port_problem(match.port))
    check_labels(report, (*path, "sourceLabels"), match.source_labels)
    gateway_name_issues(report, (*path, "gateways"), match.gateways)


# --- warnings ------------------------------------------------------------------------------


def _source_match_warnings(report: Report, kind: str, rules: Any, gateways: list[str]) -> None:
    """`sourceLabels` and `sourceNamespace` select the calling sidecars; in a rule bound only to
    gateways they are compared with the gateway's own labels and namespace instead."""
    for i, rule in enumerate(rules):
        for j, match in enumerate(rule.match):
            bound = list(match.gateways) or gateways
            if not bound or MESH_GATEWAY in bound:
                continue
            for field, json_name in (("source_labels", "sourceLabels"), ("source_namespace", "sourceNamespace")):
                if getattr(match, field):
                    report.warn(
                        ("spec", kind, i, "match", j, json_name),
                        f'{json_name} applies to sidecar clients, but this rule is not bound to "mesh": '
                        "it matches the gateway itself",
                    )


def _rule_name(kind: str, rule: Any, index: int) -> str:
    return f'"{rule.name}"' if kind == "http" and rule.name else f"#{index}"


def _without(match: Any, *fields: str) -> bytes:
    """A match's bytes with `fields` left out, to compare what is left."""
    copy = type(match)()
    copy.CopyFrom(match)
    for field in fields:
        copy.ClearField(field)
    data: bytes = copy.SerializeToString(deterministic=True)
    return data


def _unreachable_rules(report: Report, kind: str, rules: Any) -> None:
    """Rules after a rule without match, and matches an earlier rule already takes: the same
    match (ignoring its name), or a uri under an earlier uri prefix with nothing else different."""
    catch_all: int | None = None
    seen: dict[bytes, int] = {}
    prefixes: list[tuple[str, bytes, int]] = []
    for i, rule in enumerate(rules):
        name = _rule_name(kind, rule, i)
        if catch_all is not None:
            earlier = _rule_name(kind, rules[catch_all], catch_all)
            report.warn(
                ("spec", kind, i),
                f"{kind} rule {name} is never used: rule {earlier} has no match and takes all traffic",
            )
            continue
        if not rule.match:
            catch_all = i
            continue
        taken = 0
        for j, match in enumerate(rule.match):
            at: FieldPath = ("spec", kind, i, "match", j)
            key = _without(match, "name") if kind == "http" else _without(match)
            if key in seen:
                taken += 1
                first = _rule_name(kind, rules[seen[key]], seen[key])
                report.warn(at, f"{kind} rule {name} match #{j} is never used: rule {first} has the same match")
                continue
            seen[key] = i
            uri_kind = match.uri.WhichOneof("match_type") if kind == "http" and match.HasField("uri") else None
            if uri_kind not in ("exact", "prefix"):
                continue
            uri, rest = getattr(match.uri, uri_kind), _without(match, "name", "uri")
            cover = next((p for p in prefixes if p[1] == rest and uri.startswith(p[0])), None)
            if cover is not None:
                taken += 1
                first = _rule_name(kind, rules[cover[2]], cover[2])
                report.warn(
                    (*at, "uri"),
                    f'{kind} rule {name} match #{j} is never used: rule {first} takes uri prefix "{cover[0]}" first',
                )
            elif uri_kind == "prefix":
                prefixes.append((uri, rest, i))
        if taken == len(rule.match):
            report.warn(("spec", kind, i), f"{kind} rule {name} is never used: earlier rules take all its matches")
