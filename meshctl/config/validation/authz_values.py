"""The values of AuthorizationPolicy rules, checked as Istio checks them (`pkg/config/security`):
IP blocks, ports, path templates, and `when` conditions by key (`ValidateAttribute`).

Each check returns the problem as text, or None, for the caller to attach to its field.
"""

from __future__ import annotations

import re
from typing import Final

import re2

from meshctl.config.validation.common import ip_or_cidr_problem
from meshctl.config.validation.regex_program import RE2_MAX_PROGRAM_SIZE, program_size_problem, re2_escape

MATCH_ONE: Final = "{*}"
MATCH_ANY: Final = "{**}"
# A path segment beside a template: RFC 3986 pchar (Istio's `validLiteral`).
_LITERAL = re.compile(r"[a-zA-Z0-9\-._~%!$&'()+,;:@=]+")
_PORT = re.compile(r"[0-9]+")

# `when` keys (Istio's attributes). A key naming a map entry (`request.headers[x-user]`) is
# matched by prefix, as Istio does.
_MAP_PREFIXES: Final = (
    "request.headers",
    "request.experimental.inline.headers",
    "request.auth.claims",
    "experimental.envoy.filters.",
)
IP_KEYS: Final = frozenset({"source.ip", "remote.ip", "destination.ip"})
PORT_KEY: Final = "destination.port"
SERVICE_ACCOUNT_KEY: Final = "source.serviceAccount"
#: Istio's bound on the service accounts one list may name (`CheckServiceAccount`).
MAX_SERVICE_ACCOUNTS: Final = 16
_PLAIN_KEYS: Final = frozenset(
    {
        "source.namespace",
        "source.principal",
        "request.auth.principal",
        "request.auth.audiences",
        "request.auth.presenter",
        "connection.sni",
    }
)


#: How a principal's SPIFFE URI begins (`spiffe://TRUST_DOMAIN/ns/NS/sa/SA`).
SPIFFE_PREFIX: Final = "spiffe://"


def namespace_principal_regex(value: str) -> str:
    """The regex a source namespace (`*` a wildcard) matches principals with, as Istio's."""
    return ".*/ns/" + ".*".join(re2_escape(part) for part in value.split("*")) + "/.*"


def service_account_principal_regex(namespace: str, account: str) -> str:
    """The regex a `source.serviceAccount` condition matches principals with, as Istio's."""
    return f"spiffe://.+/ns/{re2_escape(namespace)}/(.+/|)sa/{re2_escape(account)}(/.+)?"


def principal_regex(value: str) -> str | None:
    """The regex a principal led by `*` is matched with (`*/sa/x`), None when it needs none."""
    if value == "*" or not value.startswith("*"):
        return None
    return re2_escape(SPIFFE_PREFIX) + ".*" + re2_escape(value[1:])


def regex_size_problem(regex: str | None) -> str | None:
    """A regex generated from a value that Envoy would refuse for its size (a value of tens of
    thousands of characters): it NACKs the listener of every workload the policy selects."""
    if regex is None or len(regex) * 2 + 64 < RE2_MAX_PROGRAM_SIZE:
        # These regexes are literals joined by `.*`: a program of at most about two instructions
        # per character. Only a value of thousands of characters needs compiling to be sure.
        return None
    try:
        compiled = re2.compile(regex)
    except re2.error:  # pragma: no cover - every part is escaped
        return "the value cannot be matched as a regex"
    problem = program_size_problem(compiled)
    return f"the value is too long to match: its {problem}" if problem else None


def ip_block_problem(value: str) -> str | None:
    """An IP address or a CIDR block (Istio's `ValidateIPs`)."""
    if ip_or_cidr_problem(value) is None:
        return None
    return f"bad CIDR range ({value})" if "/" in value else f"bad IP address ({value})"


def port_value_problem(value: str) -> str | None:
    """A port as a decimal string, at most 65535 (Istio's `ValidatePorts`, which takes 0 too)."""
    if _PORT.fullmatch(value) and int(value) <= 65535:
        return None
    return f'bad port ({value}): a port is a number in 0..65535, written as a string ("8080")'


def path_template_problem(path: str) -> str | None:
    """`{*}` (one segment) and `{**}` (any, last of the operators) between literal segments
    (Istio's `CheckValidPathTemplate`); a path without a template is any string."""
    templated = MATCH_ONE in path or MATCH_ANY in path
    seen_any = False
    for glob in path.strip("/").split("/"):
        if glob in (MATCH_ONE, MATCH_ANY):
            if seen_any:
                return f'invalid or unsupported path "{path}": {MATCH_ANY} is not the last operator'
            seen_any = glob == MATCH_ANY
            continue
        if "{" in glob or "}" in glob:
            return f"invalid or unsupported path \"{path}\": '{{' or '}}' beyond a supported path template"
        if templated and not _LITERAL.fullmatch(glob):
            return f'invalid or unsupported path "{path}": segment "{glob}" is not a valid literal beside a template'
    return None


def condition_key_problem(key: str) -> str | None:
    """A `when` key Istio knows (`ValidateAttribute`), a map key with its `[name]`."""
    if key.startswith(_MAP_PREFIXES):
        return _map_key_problem(key)
    if key in _PLAIN_KEYS or key in IP_KEYS or key in (PORT_KEY, SERVICE_ACCOUNT_KEY):
        return None
    if key == "destination.namespace":
        return f"attribute {key} is replaced by the metadata.namespace"
    if key.startswith("destination.labels"):
        return f"attribute {key} is replaced by the workload selector"
    if key in ("destination.name", "destination.user"):
        return f"deprecated attribute {key}: only supported in v1alpha1"
    return f"unknown attribute: {key}"


def condition_value_problem(key: str, value: str) -> str | None:
    """One of a condition's `values` or `notValues`, by its key."""
    if not value:
        return f"empty value not allowed, found in {key}"
    if key in IP_KEYS:
        return ip_block_problem(value)
    if key == PORT_KEY:
        return port_value_problem(value)
    if key == SERVICE_ACCOUNT_KEY:
        return service_account_problem(value)
    return None


def service_account_problem(value: str) -> str | None:
    """`serviceAccount` or `namespace/serviceAccount`, no wildcard (Istio's `CheckServiceAccount`)."""
    if "*" in value:
        return f"wildcard not allowed, found in {SERVICE_ACCOUNT_KEY}"
    namespace, slash, account = value.partition("/")
    if value.count("/") > 1 or (slash and not (namespace and account)):
        return f"expected format 'serviceAccount' or 'namespace/serviceAccount', found {value!r}"
    if len(value) > 320:
        return f"value cannot exceed 320 characters, found {value[:40]!r}..."
    return None


def trust_domain_problem(value: str) -> str | None:
    """A trust domain is matched as the host of the peer's SPIFFE URI, a `*` standing for any
    characters but `/` (istio/istio#59358): a value with a `/` could never match."""
    if "/" in value:
        return f"invalid trust domain {value!r}: a trust domain holds no '/'"
    return None


def trust_domain_regex(value: str) -> str | None:
    """The regex a trust domain with a `*` is matched with, None when it needs none."""
    if "*" not in value:
        return None
    return re2_escape(SPIFFE_PREFIX) + "[^/]*".join(re2_escape(part) for part in value.split("*")) + "/.*"


def condition_regex_problem(key: str, value: str) -> str | None:
    """A `when` value whose regex Envoy would refuse for its size."""
    if key == "source.namespace":
        return regex_size_problem(namespace_principal_regex(value))
    if key == "source.principal":
        return regex_size_problem(principal_regex(value))
    return None


def wildcard_problem(value: str) -> str | None:
    """A `*` that Istio's string matchers take literally: only the whole value, a leading or a
    trailing `*` is a wildcard (`*`, `*.example.com`, `/api/*`)."""
    if value == "*":
        return None
    inner = value[1:] if value.startswith("*") else value[:-1] if value.endswith("*") else value
    if "*" not in inner:
        return None
    return f'"{value}": "*" is a wildcard only as the whole value, its first or its last character; here it is literal'


def _map_key_problem(key: str) -> str | None:
    """Istio's `validateMapKey`: `name[key]` with a non-empty name and key."""
    open_at = key.find("[")
    if key.endswith("]") and 0 < open_at < len(key) - 2:
        return None
    return f"bad key ({key}): should have format a[b]"
