"""Checks every kind shares: hosts, addresses, ports, durations, percentages, regexes, labels.

The rules are those `istioctl validate` applies (Istio's `pkg/config/validation`), so a file that
passes here is one Istio accepts. Most checks return the problem as text, or None, and leave it to
the caller to attach the text to the field it is about: the field path is what lets
`meshctl validate` point at the line, and only the caller knows it.

Protobuf messages are read through `Any`: the generated classes carry no static field types.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

import re2

from meshctl.config.findings import FieldPath, Severity
from meshctl.config.hosts import is_ip
from meshctl.config.validation import Issue
from meshctl.config.validation.envoy_limits import header_bytes_problem
from meshctl.config.validation.regex_program import program_size_problem

UNIX_PREFIX: Final = "unix://"
MESH_GATEWAY: Final = "mesh"

_DNS_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")
# A first label may be `*`, or a DNS label led by `*` or `*-` (`*-canary.example.com`).
_WILDCARD_LABEL = re.compile(r"\*|(\*-?)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")
# Kubernetes label keys (an optional DNS prefix and `/`, then a name) and values.
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_KEY = re.compile(rf"(?P<prefix>{_DNS_LABEL.pattern}(\.{_DNS_LABEL.pattern})*/)?(?P<name>{_QUALIFIED_NAME})")
_LABEL_VALUE = re.compile(rf"({_QUALIFIED_NAME})?")
# Header names are RFC 7230 tokens (Istio's `validHeaderNameRegex`); probe headers follow
# Kubernetes, letters, digits and "-" only (Istio's `ValidateProbeHeaderName`).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~A-Za-z0-9]+")
_PROBE_HEADER_NAME = re.compile(r"[-A-Za-z0-9]+")
# The HTTP/2 pseudo-headers a route may match on (Istio's `pseudoHeaders`).
_PSEUDO_HEADERS: Final = frozenset((":method", ":scheme", ":authority", ":path", ":status"))
_HEADER_VALUE_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_JWT_CLAIM_HEADER = re.compile(r"@request\.auth\.claims(\.[^.\[\]]+|\[[^\[\]]+\])+")
_MAX_REGEX_LENGTH: Final = 1024
#: A unix socket path holds at most 107 bytes (`sun_path`, with its NUL): Envoy refuses more.
_MAX_UNIX_PATH: Final = 108
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error comes back to us; RE2 would also print it to stderr

_PROTOCOLS: Final = {
    p.lower(): p
    for p in ("HTTP", "HTTP2", "HTTPS", "HTTP_PROXY", "GRPC", "GRPC-Web", "TCP", "TLS", "UDP", "Mongo", "Redis",
              "MySQL")
}  # fmt: skip
_HTTP_PROTOCOLS: Final = frozenset(("HTTP", "HTTP2", "HTTP_PROXY", "GRPC", "GRPC-Web"))
_TLS_PROTOCOLS: Final = frozenset(("HTTPS", "TLS"))
_TCP_PROTOCOLS: Final = frozenset(("TCP", "HTTPS", "TLS", "Mongo", "Redis", "MySQL"))


class Report:
    """The issues found in one resource, in the order the rules ran."""

    __slots__ = ("issues",)

    def __init__(self) -> None:
        self.issues: list[Issue] = []

    def error(self, path: FieldPath, message: str | None) -> None:
        """Record `message` as an error at `path`; None (a check that passed) records nothing."""
        if message:
            self.issues.append(Issue(path, message))

    def warn(self, path: FieldPath, message: str | None) -> None:
        if message:
            self.issues.append(Issue(path, message, Severity.WARNING))


def enum_name(message: Any, field: str) -> str:
    """The name of an enum field's value (`"MUTUAL"`), as users write it in YAML."""
    number = getattr(message, field)
    value = message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number.get(number)
    return value.name if value is not None else str(number)


# --- names and addresses -------------------------------------------------------------------


def is_dns_label(value: str) -> bool:
    """An RFC 1123 label: what Istio requires of namespaces, subset and port names."""
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def _domain_preconditions(name: str) -> str | None:
    if not name:
        return "must not be empty"
    if len(name) > 255:
        return f'"{name[:40]}..." is too long (at most 255 characters)'
    return None


def _dns_labels_problem(domain: str, whole: str) -> str | None:
    labels = domain.split(".")
    if labels[-1].isdigit():
        return f'invalid host "{whole}": the top-level domain "{labels[-1]}" cannot be all digits'
    for i, label in enumerate(labels):
        if i == len(labels) - 1 and not label:
            return None  # a trailing dot (`istio.io.`) is allowed
        if not is_dns_label(label):
            return f'invalid host "{whole}": "{label}" is not a DNS label (letters, digits and "-", at most 63)'
    return None


def fqdn_problem(name: str) -> str | None:
    """A DNS name with no wildcard (`reviews`, `api.example.com`)."""
    problem = _domain_preconditions(name)
    if problem:
        return f"host {problem}"
    return _dns_labels_problem(name, name)


def wildcard_domain_problem(name: str) -> str | None:
    """A DNS name whose first label may be a wildcard (`*`, `*.example.com`, `*-v2.example.com`)."""
    problem = _domain_preconditions(name)
    if problem:
        return f"host {problem}"
    first, *rest = name.split(".", 1)
    if len(first) > 63 or not _WILDCARD_LABEL.fullmatch(first):
        hint = ' (a wildcard is only allowed as a leading "*" or "*.")' if "*" in name else ""
        return f'invalid host "{name}": "{first}" is not a DNS label{hint}'
    return _dns_labels_problem(rest[0], name) if rest else None


def partial_wildcard_problem(name: str) -> str | None:
    if "*" in name and name != "*" and not name.startswith("*."):
        return f'partial wildcard "{name}" is not allowed: use "*" or "*.suffix"'
    return None


def ip_problem(address: str) -> str | None:
    return None if is_ip(address) else f'"{address}" is not a valid IP address'


def ip_or_cidr_problem(value: str) -> str | None:
    """An IP address or a CIDR block in prefix-length form (`10.0.0.0/8`, `2001:db8::/32`)."""
    if value.count("/") == 1:
        address, _, length = value.partition("/")
        try:
            if not length.isdigit():
                raise ValueError(length)
            ipaddress.ip_network(value, strict=False)
            ipaddress.ip_address(address)
        except ValueError:
            return f'"{value}" is not a valid CIDR block'
        return None
    return ip_problem(value)


def unix_address_problem(path: str) -> str | None:
    """The part after `unix://`: an absolute file path, or an abstract socket name led by `@`."""
    if not path:
        return "unix domain socket address must not be empty"
    if len(path.encode()) >= _MAX_UNIX_PATH:
        return f'unix domain socket path "{path[:40]}..." is longer than Envoy takes ({_MAX_UNIX_PATH - 1} bytes)'
    if path.startswith("@"):
        return None
    if not posixpath.isabs(path) or path.endswith("/"):
        return f'"{path}" is not an absolute path to a file'
    return None


def port_problem(number: int) -> str | None:
    return None if 1 <= number <= 65535 else f"port number {number} must be in the range 1..65535"


def namespace_host_problems(host: str, *, gateway: bool) -> list[str]:
    """A Gateway server host or a Sidecar egress host: `namespace/dnsName`, where the namespace may
    be `*` or `.` (and `~` for a Sidecar). A Gateway also takes the old form without a namespace,
    and an IP address."""
    ns, slash, name = host.partition("/")
    if not slash:
        if gateway:
            return _hostname_part_problems(host, gateway=True)
        return [f'host "{host}" must be of the form namespace/dnsName (e.g. "./*" or "istio-system/*")']
    problems: list[str] = []
    if not ns or not name:
        problems.append(f'host "{host}": namespace and dnsName must not be empty')
    specials = ("*", ".") if gateway else ("*", ".", "~")
    # A Sidecar's `~NS/host`: every namespace but NS.
    excluded = ns[1:] if not gateway and ns.startswith("~") and len(ns) > 1 else None
    if ns not in specials and not is_dns_label(excluded if excluded is not None else ns):
        problems.append(f'host "{host}": invalid namespace "{ns}"')
    return problems + _hostname_part_problems(name, gateway=gateway)


def _hostname_part_problems(name: str, *, gateway: bool) -> list[str]:
    problems: list[str] = []
    if name != "*" and "." not in name:
        problems.append(f'host "{name}": short names are not allowed here, use a fully qualified name')
    problem = wildcard_domain_problem(name)
    if problem and not (gateway and is_ip(name)):
        problems.append(problem)
    return problems + [p for p in (partial_wildcard_problem(name),) if p]


def _is_wildcard(host: str) -> bool:
    return host.startswith("*")


def hosts_overlap(a: str, b: str) -> bool:
    """True when one host (or wildcard) covers the other, as Istio's `host.Name.Matches`."""
    if _is_wildcard(a) and _is_wildcard(b):
        shorter, longer = sorted((a, b), key=len)
        return longer[1:].endswith(shorter[1:])
    if _is_wildcard(a):
        return b.endswith(a[1:])
    if _is_wildcard(b):
        return a.endswith(b[1:])
    return a == b


def host_within(host: str, of: str) -> bool:
    """True when every name `host` covers is covered by `of` (Istio's `host.Name.SubsetOf`)."""
    if _is_wildcard(of):
        return (host[1:] if _is_wildcard(host) else host).endswith(of[1:])
    return not _is_wildcard(host) and host == of


# --- numbers and durations -----------------------------------------------------------------


def duration_problem(duration: Any) -> str | None:
    """Istio's rule for every duration: at least 1ms, and whole milliseconds."""
    nanos = duration.seconds * 1_000_000_000 + duration.nanos
    if nanos < 1_000_000:
        return f"duration {duration.ToJsonString()} must be at least 1ms"
    if nanos % 1_000_000:
        return f"duration {duration.ToJsonString()} is finer than the supported 1ms precision"
    return None


def crd_duration_problem(duration: Any) -> str | None:
    """The rule Istio's CRD schema puts on a duration that its Go validation does not check
    (`duration(self) >= duration('1ms')`): at least 1ms, any precision."""
    nanos = duration.seconds * 1_000_000_000 + duration.nanos
    return None if nanos >= 1_000_000 else f"duration {duration.ToJsonString()} must be at least 1ms"


def percent_problem(value: int) -> str | None:
    return None if 0 <= value <= 100 else f"percentage {value} must be in the range 0..100"


def fractional_percent_problem(value: float) -> str | None:
    """A `Percent` message: 0, or 0.0001 up to 100 (Envoy's finest fraction is one per million)."""
    if value < 0 or value > 100 or 0 < value < 0.0001:
        return f"percentage {value:g} must be 0 or in the range 0.0001..100"
    return None


def regex_problem(pattern: str) -> str | None:
    """RE2 syntax, as Envoy compiles it: no lookaround, no backreferences."""
    if not pattern:
        return "regex must not be empty"
    if len(pattern) > _MAX_REGEX_LENGTH:
        return f"regex is too long ({len(pattern)} characters, at most {_MAX_REGEX_LENGTH})"
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return f"invalid regex {pattern!r}: {reason} (Istio uses RE2 syntax)"
    return program_size_problem(compiled)


# --- labels and selectors ------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _label_key_problem(key: str) -> str | None:
    """Remembered per key: a mesh uses a handful of label keys (`app`, `version`) everywhere."""
    match = _LABEL_KEY.fullmatch(key)
    if match is None:
        return f'invalid label key "{key}"'
    if match["prefix"] and len(match["prefix"]) - 1 > 253:
        return f'invalid label key "{key}": the prefix is longer than 253 characters'
    if len(match["name"]) > 63:
        return f'invalid label key "{key}": the name is longer than 63 characters'
    return None


def label_problems(labels: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    """(key, problem) for every key or value Kubernetes would not accept as a label."""
    for key, value in sorted(labels.items()):
        problem = _label_key_problem(key)
        if problem is not None:
            yield key, problem
        if not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            yield key, f'invalid label value "{value}" for "{key}"'


def check_labels(report: Report, path: FieldPath, labels: Mapping[str, str]) -> None:
    for key, problem in label_problems(labels):
        report.error((*path, key), problem)


def check_selector(report: Report, path: FieldPath, labels: Mapping[str, str], what: str) -> None:
    """A workload selector: no empty keys, no wildcards; a selector with no labels selects every
    workload in the namespace, which is rarely what was meant."""
    for key, value in sorted(labels.items()):
        if not key:
            report.error((*path, key), f'empty key is not allowed in a selector ("{key}={value}")')
        if "*" in key or "*" in value:
            report.error((*path, key), f'wildcards are not supported in selectors ("{key}={value}")')
    if not labels:
        report.warn(path, f"workload selector has no labels: {what} applies to every workload in the namespace")


# --- protocols, headers, references --------------------------------------------------------


def parse_protocol(name: str) -> str | None:
    """Istio's protocol name for `name` (case does not matter), None when Istio does not know it."""
    return _PROTOCOLS.get(name.lower())


def is_http(protocol: str) -> bool:
    return parse_protocol(protocol) in _HTTP_PROTOCOLS


def is_tls(protocol: str) -> bool:
    return parse_protocol(protocol) in _TLS_PROTOCOLS


def is_tcp(protocol: str) -> bool:
    return parse_protocol(protocol) in _TCP_PROTOCOLS


def protocol_problem(name: str) -> str | None:
    """Empty is allowed (the proxy sniffs the protocol)."""
    if name and parse_protocol(name) is None:
        known = ", ".join(sorted(p.upper() for p in _PROTOCOLS.values()))
        return f'unsupported protocol "{name}": use one of {known}'
    return None


def port_name_problem(name: str) -> str | None:
    if not name:
        return "port name is required"
    return None if is_dns_label(name) else f'invalid port name "{name}": must be a DNS label (e.g. "http-web")'


def header_name_problem(name: str, *, jwt_claims: bool = False, pseudo: bool = False) -> str | None:
    """An RFC 7230 token (Istio's `ValidateCORSHTTPHeaderName`); a route match also takes a JWT
    claim and a pseudo-header such as `:path` (`ValidateHTTPHeaderNameOrJwtClaimRoute`)."""
    if not name:
        return "header name must not be empty"
    if (jwt_claims and is_jwt_claim_header(name)) or (pseudo and name in _PSEUDO_HEADERS):
        return None
    if not _HEADER_NAME.fullmatch(name):
        return f'invalid header name "{name}": use letters, digits and !#$%&\'*+-.^_`|~ (an RFC 7230 token)'
    return header_bytes_problem(name, f"header name {name[:40]!r}...")


def probe_header_name_problem(name: str) -> str | None:
    """A probe's header name, as Kubernetes takes it (Istio's `ValidateProbeHeaderName`)."""
    if not name:
        return "header name must not be empty"
    if not _PROBE_HEADER_NAME.fullmatch(name):
        return f'invalid header name "{name}": a probe header takes letters, digits and "-" only'
    return None


def is_jwt_claim_header(name: str) -> bool:
    """`@request.auth.claims.group` or `@request.auth.claims[a.b]`: routing on a JWT claim."""
    return _JWT_CLAIM_HEADER.fullmatch(name) is not None


#: Envoy's substitution commands usable in a header value (its access-log operators). Envoy
#: refuses a route config naming any other, so meshctl does too, before a proxy has to NACK it.
_COMMAND_WORDS: Final = """
    START_TIME START_TIME_LOCAL EMIT_TIME EMIT_TIME_LOCAL REQUEST_HEADERS_BYTES BYTES_RECEIVED
    BYTES_RETRANSMITTED PACKETS_RETRANSMITTED UPSTREAM_WIRE_BYTES_RECEIVED UPSTREAM_HEADER_BYTES_RECEIVED
    DOWNSTREAM_WIRE_BYTES_RECEIVED DOWNSTREAM_HEADER_BYTES_RECEIVED PROTOCOL UPSTREAM_PROTOCOL
    RESPONSE_CODE RESPONSE_CODE_DETAILS CONNECTION_TERMINATION_DETAILS RESPONSE_HEADERS_BYTES
    RESPONSE_TRAILERS_BYTES BYTES_SENT UPSTREAM_WIRE_BYTES_SENT UPSTREAM_HEADER_BYTES_SENT
    DOWNSTREAM_WIRE_BYTES_SENT DOWNSTREAM_HEADER_BYTES_SENT DURATION COMMON_DURATION REQUEST_DURATION
    REQUEST_TX_DURATION RESPONSE_DURATION RESPONSE_TX_DURATION DOWNSTREAM_HANDSHAKE_DURATION
    ROUNDTRIP_DURATION UPSTREAM_CONNECTION_POOL_READY_DURATION RESPONSE_FLAGS RESPONSE_FLAGS_LONG
    UPSTREAM_HOST UPSTREAM_HOST_NAME UPSTREAM_HOST_NAME_WITHOUT_PORT UPSTREAM_CLUSTER UPSTREAM_CLUSTER_RAW
    UPSTREAM_LOCAL_ADDRESS UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT UPSTREAM_LOCAL_PORT UPSTREAM_REMOTE_ADDRESS
    UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT UPSTREAM_REMOTE_PORT UPSTREAM_REQUEST_ATTEMPT_COUNT
    UPSTREAM_TLS_CIPHER UPSTREAM_TLS_VERSION UPSTREAM_TLS_SESSION_ID UPSTREAM_PEER_ISSUER UPSTREAM_PEER_CERT
    UPSTREAM_PEER_SUBJECT UPSTREAM_PEER_URI_SAN UPSTREAM_PEER_DNS_SAN UPSTREAM_PEER_IP_SAN
    UPSTREAM_LOCAL_URI_SAN UPSTREAM_LOCAL_DNS_SAN UPSTREAM_LOCAL_IP_SAN UPSTREAM_LOCAL_SUBJECT
    UPSTREAM_PEER_CERT_V_START UPSTREAM_PEER_CERT_V_END UPSTREAM_TRANSPORT_FAILURE_REASON
    UPSTREAM_CONNECTION_ID UPSTREAM_FILTER_STATE UPSTREAM_METADATA HOSTNAME DOWNSTREAM_LOCAL_ADDRESS
    DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT DOWNSTREAM_LOCAL_PORT DOWNSTREAM_REMOTE_ADDRESS
    DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT DOWNSTREAM_REMOTE_PORT DOWNSTREAM_DIRECT_REMOTE_ADDRESS
    DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT DOWNSTREAM_DIRECT_REMOTE_PORT DOWNSTREAM_LOCAL_URI_SAN
    DOWNSTREAM_LOCAL_DNS_SAN DOWNSTREAM_LOCAL_IP_SAN DOWNSTREAM_LOCAL_SUBJECT DOWNSTREAM_PEER_URI_SAN
    DOWNSTREAM_PEER_DNS_SAN DOWNSTREAM_PEER_IP_SAN DOWNSTREAM_PEER_SUBJECT DOWNSTREAM_PEER_ISSUER
    DOWNSTREAM_TLS_SESSION_ID DOWNSTREAM_TLS_CIPHER DOWNSTREAM_TLS_VERSION DOWNSTREAM_PEER_FINGERPRINT_256
    DOWNSTREAM_PEER_FINGERPRINT_1 DOWNSTREAM_PEER_SERIAL DOWNSTREAM_PEER_CERT DOWNSTREAM_PEER_CERT_V_START
    DOWNSTREAM_PEER_CERT_V_END DOWNSTREAM_TRANSPORT_FAILURE_REASON DOWNSTREAM_LOCAL_CERT
    CONNECTION_ID REQUESTED_SERVER_NAME ROUTE_NAME VIRTUAL_CLUSTER_NAME DYNAMIC_METADATA CLUSTER_METADATA
    FILTER_STATE METADATA REQ RESP TRAILER REQ_WITHOUT_QUERY LOCAL_REPLY_BODY ACCESS_LOG_TYPE UNIQUE_ID
    STREAM_ID ENVIRONMENT TRACE_ID CEL PER_REQUEST_STATE
"""
_ENVOY_COMMANDS: Final = frozenset(_COMMAND_WORDS.split())
#: Commands whose argument is a header name (`%REQ(x-user)%`, `%REQ(:authority?host)%`).
_HEADER_COMMANDS: Final = frozenset(("REQ", "RESP", "TRAILER", "REQ_WITHOUT_QUERY"))
_HEADER_ARGUMENT = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z:]+(\?[!#$%&'*+\-.^_`|~0-9A-Za-z:]+)?")


def header_value_problem(value: str) -> str | None:
    """A header value Envoy accepts: no control characters, and `%` only as `%%` or around one of
    Envoy's commands (`%HOSTNAME%`, `%REQ(x-id)%`, `%REQ(x-id):10%` to truncate)."""
    if _HEADER_VALUE_FORBIDDEN.search(value):
        return f"header value {value!r} contains control characters"
    too_long = header_bytes_problem(value, f"header value {value[:40]!r}...")
    if too_long is not None:
        return too_long
    unterminated = f'header value "{value}" has an unterminated "%" variable: write a literal % as "%%"'
    i, n = 0, len(value)
    while i < n:
        if value[i] != "%":
            i += 1
            continue
        if value[i + 1 : i + 2] == "%":
            i += 2
            continue
        j = i + 1  # a variable: NAME% or NAME(arguments)% or NAME(arguments):LENGTH%
        while j < n and value[j] not in "%(":
            j += 1
        name = value[i + 1 : j]
        argument = None
        if j < n and value[j] == "(":
            end = _arguments_end(value, j + 1)
            if end < 0:
                return unterminated
            argument = value[j + 1 : end]
            j = end + 1
            if j < n and value[j] == ":":
                k = j + 1
                while k < n and value[k].isdigit():
                    k += 1
                if k == j + 1:
                    return unterminated
                j = k
        if j >= n or value[j] != "%":
            return unterminated
        if name not in _ENVOY_COMMANDS:
            return f'header value "{value}" uses %{name}%, which is not one of Envoy\'s commands'
        if name in _HEADER_COMMANDS and (argument is None or not _HEADER_ARGUMENT.fullmatch(argument)):
            return f'header value "{value}": %{name}(...)% takes a header name, without spaces'
        i = j + 1
    return None


def _arguments_end(value: str, start: int) -> int:
    """Index of the `)` closing a variable's arguments (a backslash escapes the next character)."""
    i = start
    while i < len(value):
        if value[i] == "\\":
            i += 2
            continue
        if value[i] == ")":
            return i
        i += 1
    return -1


def gateway_name_issues(report: Report, path: FieldPath, names: Iterable[str]) -> None:
    """Gateway references: `mesh`, `name`, or `namespace/name`."""
    for i, name in enumerate(names):
        at = (*path, i)
        ns, slash, gw = name.partition("/")
        if not slash:
            if "." in name:
                parts = name.split(".")
                report.warn(at, f'legacy gateway name "{name}": prefer "{parts[1]}/{parts[0]}"')
            if fqdn_problem(name):
                report.error(at, f'invalid gateway name "{name}": use "name" or "namespace/name"')
            continue
        if not ns or not gw:
            report.error(at, f'gateway "{name}": namespace and name must not be empty')
            continue
        if not is_dns_label(ns):
            report.error(at, f'gateway "{name}": invalid namespace "{ns}"')
        if not is_dns_label(gw):
            report.error(at, f'gateway "{name}": invalid gateway name "{gw}"')


def check_destination(report: Report, path: FieldPath, destination: Any) -> None:
    """Where traffic goes: a host (no bare `*`), an optional subset and port."""
    host = destination.host
    if host == "*":
        report.error((*path, "host"), 'destination host "*" is not allowed')
    else:
        problem = wildcard_domain_problem(host)
        report.error((*path, "host"), "destination host is required" if not host else problem)
    if destination.subset and not is_dns_label(destination.subset):
        report.error((*path, "subset"), f'invalid subset name "{destination.subset}": must be a DNS label')
    if destination.HasField("port"):
        report.error((*path, "port", "number"), port_problem(destination.port.number))


def check_export_to(report: Report, path: FieldPath, export_to: Iterable[str], *, service_entry: bool) -> None:
    """`exportTo`: `.`, `*`, namespaces, and `~` (nobody) for ServiceEntry; no duplicates, and
    `*` or `~` only on their own."""
    entries = list(export_to)
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if entry in seen:
            report.error((*path, i), f'duplicate exportTo entry "{entry}"')
            continue
        seen.add(entry)
        if entry == "~" and not service_entry:
            report.error((*path, i), 'exportTo "~" (no one) is only allowed on a ServiceEntry')
        elif entry not in (".", "*", "~") and not is_dns_label(entry):
            report.error((*path, i), f'invalid exportTo entry "{entry}": use ".", "*" or a namespace')
    if len(entries) > 1 and "*" in seen:
        report.error(path, 'exportTo "*" (everyone) cannot be combined with other entries')
    if len(entries) > 1 and "~" in seen and service_entry:
        report.error(path, 'exportTo "~" (no one) cannot be combined with other entries')
