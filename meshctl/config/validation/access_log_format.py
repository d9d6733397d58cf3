"""An access-log format string (MeshConfig `accessLogFormat`) checked as Envoy's substitution
formatter parses it: every proxy refuses a listener whose access log it cannot parse, so the
MeshConfig that asks for one is refused first.

Envoy's grammar: text, `%%` for a literal `%`, and commands `%NAME%`, `%NAME(ARGUMENTS)%`,
`%NAME(ARGUMENTS):LENGTH%` (NAME in capitals, digits and `_`, arguments without `)`). A lone `%`,
an unknown name, a command that needs arguments without them (`%REQ%`), arguments or a length
given to a command that takes none (`%BYTES_SENT:5%`), and a header argument that is not a
header name (`%REQ(a b)%`, `%REQ(a?b?c)%`) are refused. The tables below were measured against
Envoy (every name, bare, with an argument, with a length); arguments whose values Envoy checks
per command (`%START_TIME(...)%` formats, `%GRPC_STATUS(...)%` options) are left to it.
"""

from __future__ import annotations

import re
from typing import Final

#: Commands that take no argument and no length.
_PLAIN: Final = frozenset(
    [
        "ACCESS_LOG_TYPE",
        "BYTES_RECEIVED",
        "BYTES_RETRANSMITTED",
        "BYTES_SENT",
        "CONNECTION_ID",
        "CONNECTION_TERMINATION_DETAILS",
        "CUSTOM_FLAGS",
        "DOWNSTREAM_DETECTED_CLOSE_TYPE",
        "DOWNSTREAM_DIRECT_LOCAL_ADDRESS",
        "DOWNSTREAM_DIRECT_LOCAL_PORT",
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS",
        "DOWNSTREAM_DIRECT_REMOTE_PORT",
        "DOWNSTREAM_HANDSHAKE_DURATION",
        "DOWNSTREAM_HEADER_BYTES_RECEIVED",
        "DOWNSTREAM_HEADER_BYTES_SENT",
        "DOWNSTREAM_LOCAL_ADDRESS",
        "DOWNSTREAM_LOCAL_ADDRESS_ENDPOINT_ID",
        "DOWNSTREAM_LOCAL_CLOSE_REASON",
        "DOWNSTREAM_LOCAL_DNS_SAN",
        "DOWNSTREAM_LOCAL_EMAIL_SAN",
        "DOWNSTREAM_LOCAL_IP_SAN",
        "DOWNSTREAM_LOCAL_OTHERNAME_SAN",
        "DOWNSTREAM_LOCAL_PORT",
        "DOWNSTREAM_LOCAL_SUBJECT",
        "DOWNSTREAM_LOCAL_URI_SAN",
        "DOWNSTREAM_PEER_CERT",
        "DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_1",
        "DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_256",
        "DOWNSTREAM_PEER_CHAIN_SERIALS",
        "DOWNSTREAM_PEER_DNS_SAN",
        "DOWNSTREAM_PEER_EMAIL_SAN",
        "DOWNSTREAM_PEER_FINGERPRINT_1",
        "DOWNSTREAM_PEER_FINGERPRINT_256",
        "DOWNSTREAM_PEER_IP_SAN",
        "DOWNSTREAM_PEER_ISSUER",
        "DOWNSTREAM_PEER_OTHERNAME_SAN",
        "DOWNSTREAM_PEER_SERIAL",
        "DOWNSTREAM_PEER_SUBJECT",
        "DOWNSTREAM_PEER_URI_SAN",
        "DOWNSTREAM_REMOTE_ADDRESS",
        "DOWNSTREAM_REMOTE_PORT",
        "DOWNSTREAM_TLS_CIPHER",
        "DOWNSTREAM_TLS_SESSION_ID",
        "DOWNSTREAM_TLS_VERSION",
        "DOWNSTREAM_TRANSPORT_FAILURE_REASON",
        "DOWNSTREAM_WIRE_BYTES_RECEIVED",
        "DOWNSTREAM_WIRE_BYTES_SENT",
        "DURATION",
        "FILTER_CHAIN_NAME",
        "GRPC_STATUS_NUMBER",
        "HOSTNAME",
        "LOCAL_REPLY_BODY",
        "PACKETS_RETRANSMITTED",
        "PROTOCOL",
        "REQUEST_DURATION",
        "REQUEST_HEADERS_BYTES",
        "REQUEST_TX_DURATION",
        "RESPONSE_CODE",
        "RESPONSE_DURATION",
        "RESPONSE_FLAGS",
        "RESPONSE_FLAGS_LONG",
        "RESPONSE_HEADERS_BYTES",
        "RESPONSE_TRAILERS_BYTES",
        "RESPONSE_TX_DURATION",
        "ROUNDTRIP_DURATION",
        "ROUTE_NAME",
        "SPAN_ID",
        "STREAM_ID",
        "TRACE_ID",
        "UNIQUE_ID",
        "UPSTREAM_CLUSTER",
        "UPSTREAM_CLUSTER_RAW",
        "UPSTREAM_CONNECTION_ID",
        "UPSTREAM_CONNECTION_POOL_READY_DURATION",
        "UPSTREAM_DETECTED_CLOSE_TYPE",
        "UPSTREAM_HEADER_BYTES_RECEIVED",
        "UPSTREAM_HEADER_BYTES_SENT",
        "UPSTREAM_HOST",
        "UPSTREAM_HOST_NAME",
        "UPSTREAM_HOST_NAME_WITHOUT_PORT",
        "UPSTREAM_LOCAL_ADDRESS",
        "UPSTREAM_LOCAL_CLOSE_REASON",
        "UPSTREAM_LOCAL_DNS_SAN",
        "UPSTREAM_LOCAL_IP_SAN",
        "UPSTREAM_LOCAL_PORT",
        "UPSTREAM_LOCAL_URI_SAN",
        "UPSTREAM_PEER_CERT",
        "UPSTREAM_PEER_DNS_SAN",
        "UPSTREAM_PEER_IP_SAN",
        "UPSTREAM_PEER_ISSUER",
        "UPSTREAM_PEER_SUBJECT",
        "UPSTREAM_PEER_URI_SAN",
        "UPSTREAM_PROTOCOL",
        "UPSTREAM_REMOTE_ADDRESS",
        "UPSTREAM_REMOTE_PORT",
        "UPSTREAM_REQUEST_ATTEMPT_COUNT",
        "UPSTREAM_TLS_CIPHER",
        "UPSTREAM_TLS_SESSION_ID",
        "UPSTREAM_TLS_VERSION",
        "UPSTREAM_TRANSPORT_FAILURE_REASON",
        "UPSTREAM_WIRE_BYTES_RECEIVED",
        "UPSTREAM_WIRE_BYTES_SENT",
        "VIRTUAL_CLUSTER_NAME",
    ]
)
#: Commands that take an optional argument (a format, an option) but no length.
_OPTIONAL_ARGUMENT: Final = frozenset(
    [
        "DOWNSTREAM_DIRECT_LOCAL_ADDRESS_WITHOUT_PORT",
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT",
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT",
        "DOWNSTREAM_PEER_CERT_V_END",
        "DOWNSTREAM_PEER_CERT_V_START",
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT",
        "EMIT_TIME",
        "EMIT_TIME_LOCAL",
        "GRPC_STATUS",
        "PATH",
        "QUERY_PARAMS",
        "REQUESTED_SERVER_NAME",
        "RESPONSE_CODE_DETAILS",
        "START_TIME",
        "START_TIME_LOCAL",
        "UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT",
        "UPSTREAM_PEER_CERT_V_END",
        "UPSTREAM_PEER_CERT_V_START",
        "UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT",
    ]
)
#: Commands that need an argument.
_NEEDS_ARGUMENT: Final = frozenset(
    [
        "CEL",
        "CLUSTER_METADATA",
        "DYNAMIC_METADATA",
        "ENVIRONMENT",
        "FILTER_STATE",
        "QUERY_PARAM",
        "REQ",
        "RESP",
        "TRAILER",
        "UPSTREAM_FILTER_STATE",
        "UPSTREAM_METADATA",
        "METADATA",
        "COMMON_DURATION",
    ]
)
#: Commands that take a length (`:N`, to truncate).
_TAKES_LENGTH: Final = frozenset(
    [
        "CEL",
        "DYNAMIC_METADATA",
        "ENVIRONMENT",
        "FILTER_STATE",
        "PATH",
        "QUERY_PARAM",
        "QUERY_PARAMS",
        "REQ",
        "RESP",
        "TRAILER",
        "UPSTREAM_FILTER_STATE",
    ]
)
#: Commands whose argument is a header name, or two joined by `?` (the second a fallback).
_HEADER_COMMANDS: Final = frozenset(("REQ", "RESP", "TRAILER"))
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z:]+")
_COMMAND = re.compile(r"%([A-Z0-9_]+)(?:\(([^)]*)\))?(?::([0-9]+))?%")
_NAME = re.compile(r"%([A-Z0-9_]+)")


def access_log_format_problem(text: str) -> str | None:
    """Why Envoy would refuse `text` as a text access-log format, or None."""
    i = 0
    while True:
        i = text.find("%", i)
        if i < 0:
            return None
        if text.startswith("%%", i):
            i += 2
            continue
        match = _COMMAND.match(text, i)
        if match is None:
            named = _NAME.match(text, i)
            if named is not None and _known(named[1]):
                return (
                    f"%{named[1]}... at position {i} is not closed as Envoy reads it: "
                    "%NAME%, %NAME(ARGUMENT)% or %NAME(ARGUMENT):LENGTH%"
                )
            return f'a "%" at position {i} starts no command Envoy knows: write a literal % as "%%"'
        problem = _command_problem(match[1], match[2], match[3])
        if problem is not None:
            return f"{match[0]} at position {i}: {problem}"
        i = match.end()


def _known(name: str) -> bool:
    return name in _PLAIN or name in _OPTIONAL_ARGUMENT or name in _NEEDS_ARGUMENT


def _command_problem(name: str, argument: str | None, length: str | None) -> str | None:
    if not _known(name):
        return f"{name} is not one of Envoy's access log commands"
    if name in _PLAIN and (argument is not None or length is not None):
        return f"{name} takes no argument and no length"
    if name in _NEEDS_ARGUMENT and not argument:
        return f"{name} needs an argument, as %{name}(...)%"
    if length is not None and name not in _TAKES_LENGTH:
        return f"{name} takes no length"
    if name in _HEADER_COMMANDS and argument:
        names = argument.split("?")
        if len(names) > 2 or not all(_HEADER_NAME.fullmatch(n) for n in names):
            return f"{name} takes a header name, or two joined by ? (the second a fallback), without spaces"
    return None
