"""Per-route policies of a VirtualService in Envoy's terms: retries, timeouts, faults, CORS,
header rewrites, mirroring percentages and consistent-hash keys, with Istio's defaults.

The defaults matter more than the translations: a route with no `retries` still retries twice on
connection failures, but not on any status code (Istio's default policy: a backend's 503 reaches
the caller), a route with no `timeout` has none (Envoy's own 15 s default is switched off with
`0s`), and a mirror without a percentage mirrors everything. Users moving from Istio rely on each
of these, so they are spelled out here once and tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.api.networking.v1alpha3 import virtual_service_pb2 as vs_pb2
from meshctl.xds.route_match import string_matchers

#: HTTP filter names the listener's connection manager must carry for per-route faults and CORS.
FAULT_FILTER: Final = "envoy.filters.http.fault"
CORS_FILTER: Final = "envoy.filters.http.cors"

#: Istio's retry.DefaultPolicy. `retriable-status-codes` stays in the list, but with no codes it
#: matches nothing (but the `x-envoy-retriable-status-codes` a caller may send); Istio dropped its
#: default 503 (EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY, now always on): a 503 from a backend that
#: already did the work must not make it do the work again.
DEFAULT_RETRY_ON: Final = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
DEFAULT_RETRY_ATTEMPTS: Final = 2
HOST_SELECTION_RETRY_MAX_ATTEMPTS: Final = 5
PREVIOUS_HOSTS: Final = "envoy.retry_host_predicates.previous_hosts"
PREVIOUS_PRIORITIES: Final = "envoy.retry_priorities.previous_priorities"

#: gRPC status names Istio accepts for fault aborts, with their codes.
GRPC_STATUS: Final[Mapping[str, int]] = {
    name: code
    for code, name in enumerate(
        (
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        )
    )
}

# HTTP status codes a `retryOn` entry may name (Go's http.StatusText knows exactly these).
_HTTP_STATUS_CODES: Final = frozenset(
    {100, 101, 102, 103, *range(200, 209), 226, *range(300, 306), 307, 308}
    | {*range(400, 419), 421, 422, 423, 424, 425, 426, 428, 429, 431, 451}
    | {*range(500, 509), 510, 511}
)


def pack(message: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def zero_duration() -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=0)


def set_timeout(action: rc.RouteAction, timeout: duration_pb2.Duration | None) -> None:
    """Istio's setTimeout, without the `max_grpc_timeout` Envoy deprecates: the VirtualService's
    timeout T, else `0s` (no timeout, where Envoy would default to 15 s).

    Istio also sets `max_grpc_timeout: T` (`0s` for none), so that gRPC requests follow their
    `grpc-timeout` header capped at T. Its replacement, `max_stream_duration.grpc_timeout_header_max`,
    is no drop-in: with any `max_stream_duration` on a route, Envoy (1.40 included) ignores the
    route's `timeout` for every request on it, so T would be lost for plain HTTP and for gRPC
    calls without a deadline (Envoy issue 32948; the "regressions" Istio cites for keeping the
    old field). So it is set only where there is no timeout to lose:

    - No timeout: `max_stream_duration.grpc_timeout_header_max: 0s` as well, which does what
      `max_grpc_timeout: 0s` did. Plain requests have no timeout; a gRPC request is held to its
      own `grpc-timeout`, uncapped, and the header goes upstream; without one it has no timeout.
      (Envoy now times that deadline from the request's start, as gRPC does, not its end.)
    - A timeout T: `timeout: T` alone. Every request, gRPC ones included, times out T after it
      was received, as before when the caller's deadline is T or later or absent; a shorter
      deadline still ends the call first, enforced by the gRPC client and by the server it is
      forwarded to. What changes: Envoy no longer writes T into the `grpc-timeout` it sends
      upstream, so the server is not told of T, and at T the caller gets Envoy's UNAVAILABLE
      ("upstream request timeout") where the server may have answered DEADLINE_EXCEEDED first.
      Keeping that with `max_stream_duration: T` would instead time every request from its
      first byte: slow uploads would fail and websockets and gRPC streams be cut at T.
    """
    if timeout is not None and timeout.ToNanoseconds() > 0:
        action.timeout.CopyFrom(timeout)
        return
    action.timeout.CopyFrom(zero_duration())
    action.max_stream_duration.grpc_timeout_header_max.CopyFrom(zero_duration())


def _previous_hosts() -> rc.RetryPolicy.RetryHostPredicate:
    return rc.RetryPolicy.RetryHostPredicate(
        name=PREVIOUS_HOSTS, typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate())
    )


def default_retry_policy(*, consistent_hash: bool = False) -> rc.RetryPolicy:
    """Istio's retry.DefaultPolicy (DefaultConsistentHashPolicy when the route hashes): two
    retries on connection-level failures (connect-failure, refused-stream, unavailable,
    cancelled) and no status code, on another host (unless the route hashes to a host, where
    moving defeats the purpose)."""
    out = rc.RetryPolicy(
        retry_on=DEFAULT_RETRY_ON,
        num_retries=wrappers_pb2.UInt32Value(value=DEFAULT_RETRY_ATTEMPTS),
        host_selection_retry_max_attempts=HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    )
    if not consistent_hash:
        out.retry_host_predicate.append(_previous_hosts())
    return out


def _parse_retry_on(text: str) -> tuple[str, list[int]]:
    """Envoy conditions and bare status codes (`5xx,503,gateway-error`) apart."""
    conditions: list[str] = []
    codes: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        if part.isdigit() and int(part) in _HTTP_STATUS_CODES:
            codes.append(int(part))
        else:
            conditions.append(part)
    return ",".join(conditions), codes


def retry_policy(retries: vs_pb2.HTTPRetry | None, *, consistent_hash: bool = False) -> rc.RetryPolicy | None:
    """Istio's ConvertPolicy: None (no retries) for `attempts: 0`, else the default overridden
    field by field. Status codes in `retryOn` become `retriable_status_codes` (and switch on
    `retriable-status-codes`); `retryRemoteLocalities` prefers other priorities on retry."""
    out = default_retry_policy(consistent_hash=consistent_hash)
    if retries is None:
        return out
    if retries.attempts <= 0:
        return None
    out.num_retries.value = retries.attempts
    if retries.retry_on:
        conditions, codes = _parse_retry_on(retries.retry_on)
        out.retry_on = conditions
        del out.retriable_status_codes[:]
        out.retriable_status_codes.extend(codes)
        if codes and "retriable-status-codes" not in conditions:
            out.retry_on = f"{conditions},retriable-status-codes" if conditions else "retriable-status-codes"
    if retries.HasField("per_try_timeout"):
        out.per_try_timeout.CopyFrom(retries.per_try_timeout)
    if retries.HasField("retry_ignore_previous_hosts"):
        del out.retry_host_predicate[:]
        if retries.retry_ignore_previous_hosts.value:
            out.retry_host_predicate.append(_previous_hosts())
    if retries.HasField("retry_remote_localities") and retries.retry_remote_localities.value:
        out.retry_priority.name = PREVIOUS_PRIORITIES
        out.retry_priority.typed_config.CopyFrom(
            pack(previous_priorities_config_pb2.PreviousPrioritiesConfig(update_frequency=2))
        )
    if retries.HasField("backoff"):
        out.retry_back_off.base_interval.CopyFrom(retries.backoff)
    return out


def percent_of_million(value: float) -> percent_pb2.FractionalPercent:
    """An Istio `Percent` (0-100 with decimals) in millionths, truncated as Istio does."""
    return percent_pb2.FractionalPercent(
        numerator=int(value * 10000), denominator=percent_pb2.FractionalPercent.MILLION
    )


def percent_of_hundred(value: int) -> percent_pb2.FractionalPercent:
    return percent_pb2.FractionalPercent(numerator=value, denominator=percent_pb2.FractionalPercent.HUNDRED)


def fault_config(fault: vs_pb2.HTTPFaultInjection) -> fault_pb2.HTTPFault | None:
    """Istio's TranslateFault. Without a percentage a delay or abort applies to no request (as
    Istio documents); exponential delays and HTTP/2 errors, which Istio does not translate,
    are left out; None when nothing is left."""
    out = fault_pb2.HTTPFault()
    has_delay = has_abort = False
    if fault.HasField("delay") and fault.delay.WhichOneof("http_delay_type") == "fixed_delay":
        delay = common_fault_pb2.FaultDelay(fixed_delay=fault.delay.fixed_delay)
        if fault.delay.HasField("percentage"):
            delay.percentage.CopyFrom(percent_of_million(fault.delay.percentage.value))
        else:
            delay.percentage.CopyFrom(percent_of_hundred(fault.delay.percent))
        out.delay.CopyFrom(delay)
        has_delay = True
    if fault.HasField("abort"):
        abort = fault_pb2.FaultAbort()
        kind = fault.abort.WhichOneof("error_type")
        if kind == "http_status":
            abort.http_status = fault.abort.http_status
        elif kind == "grpc_status" and fault.abort.grpc_status in GRPC_STATUS:
            abort.grpc_status = GRPC_STATUS[fault.abort.grpc_status]
        else:
            kind = None
        if kind is not None:
            if fault.abort.HasField("percentage"):
                abort.percentage.CopyFrom(percent_of_million(fault.abort.percentage.value))
            out.abort.CopyFrom(abort)
            has_abort = True
    return out if has_delay or has_abort else None


def cors_policy(policy: vs_pb2.CorsPolicy) -> cors_pb2.CorsPolicy:
    """Istio's TranslateCORSPolicy, for the CORS filter's per-route config: origins as string
    matches (the deprecated `allowOrigin` as exact ones), lists comma-joined, `maxAge` in
    seconds, and preflights that match no origin forwarded unless `unmatchedPreflights: IGNORE`."""
    out = cors_pb2.CorsPolicy(
        allow_methods=",".join(policy.allow_methods),
        allow_headers=",".join(policy.allow_headers),
        expose_headers=",".join(policy.expose_headers),
    )
    if policy.allow_origins:
        out.allow_origin_string_match.extend(string_matchers(policy.allow_origins))
    else:
        for origin in policy.allow_origin:
            out.allow_origin_string_match.add(exact=origin)
    if policy.HasField("max_age"):
        out.max_age = str(policy.max_age.seconds)
    if policy.HasField("allow_credentials"):
        out.allow_credentials.value = policy.allow_credentials.value
    out.filter_enabled.default_value.CopyFrom(percent_of_hundred(100))
    ignore = policy.unmatched_preflights == vs_pb2.CorsPolicy.UnmatchedPreflights.IGNORE
    out.forward_not_matching_preflights.value = not ignore
    return out


def mirror_fraction(
    percentage: vs_pb2.Percent | None, legacy_percent: int | None = None
) -> base_pb2.RuntimeFractionalPercent | None:
    """How much to mirror: `percentage`, else the deprecated integer `mirrorPercent`, else all;
    None when zero is asked for explicitly (no mirroring)."""
    if percentage is not None:
        if percentage.value <= 0:
            return None
        fraction = percent_of_million(percentage.value)
    elif legacy_percent is not None:
        if legacy_percent <= 0:
            return None
        fraction = percent_of_hundred(legacy_percent)
    else:
        fraction = percent_of_hundred(100)
    return base_pb2.RuntimeFractionalPercent(default_value=fraction)


def hash_policy(lb: dr_pb2.LoadBalancerSettings.ConsistentHashLB | None) -> rc.RouteAction.HashPolicy | None:
    """A DestinationRule's consistent-hash key as the route hash policy Envoy's ring hash or
    Maglev reads (Istio's consistentHashToHashPolicy)."""
    if lb is None:
        return None
    kind = lb.WhichOneof("hash_key")
    out = rc.RouteAction.HashPolicy()
    if kind == "http_header_name":
        out.header.header_name = lb.http_header_name
    elif kind == "http_cookie":
        cookie = lb.http_cookie
        out.cookie.name = cookie.name
        out.cookie.path = cookie.path
        if cookie.HasField("ttl"):
            out.cookie.ttl.CopyFrom(cookie.ttl)
        for attr in cookie.attributes:
            out.cookie.attributes.add(name=attr.name, value=attr.value)
    elif kind == "use_source_ip":
        out.connection_properties.source_ip = lb.use_source_ip
    elif kind == "http_query_parameter_name":
        out.query_parameter.name = lb.http_query_parameter_name
    else:
        return None
    return out


@dataclass
class HeaderOperations:
    """A VirtualService `headers` block in Envoy's terms, plus the authority it asks for (Envoy
    cannot set `:authority`/`host` as a header; it becomes a host rewrite)."""

    request_add: list[base_pb2.HeaderValueOption] = field(default_factory=list)
    response_add: list[base_pb2.HeaderValueOption] = field(default_factory=list)
    request_remove: list[str] = field(default_factory=list)
    response_remove: list[str] = field(default_factory=list)
    authority: str = ""


def _is_internal(name: str) -> bool:
    return name.startswith(":") or name.lower() == "host"


def _is_authority(name: str) -> bool:
    return name.lower() in (":authority", "host")


def _header_values(values: Mapping[str, str], action: int) -> tuple[list[base_pb2.HeaderValueOption], str]:
    out = []
    authority = ""
    for name in sorted(values):
        if _is_authority(name):
            authority = values[name]
        if _is_internal(name):
            continue
        out.append(
            base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=name, value=values[name]), append_action=action)
        )
    return out, authority


def header_operations(headers: vs_pb2.Headers) -> HeaderOperations:
    """Istio's TranslateHeadersOperations: `set` overwrites, `add` appends, each sorted by name;
    pseudo-headers and `host` are dropped (an authority in `set` wins over one in `add`)."""
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    append = base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD
    req, resp = headers.request, headers.response
    req_set, set_authority = _header_values(req.set, overwrite)
    req_add, add_authority = _header_values(req.add, append)
    resp_set, _ = _header_values(resp.set, overwrite)
    resp_add, _ = _header_values(resp.add, append)
    return HeaderOperations(
        request_add=req_set + req_add,
        response_add=resp_set + resp_add,
        request_remove=[h for h in req.remove if not _is_internal(h)],
        response_remove=[h for h in resp.remove if not _is_internal(h)],
        authority=set_authority or add_authority,
    )
