"""A RequestAuthentication `jwksUri` taken apart as Istio's `security.ParseJwksURI` does: the
scheme says whether the key server speaks TLS and gives the default port (443 for https, 80 for
http), the host and an explicit port say where it is.

One parser for the validation that refuses an unusable URI and for the generators that name the
cluster Envoy fetches the keys through, so the two cannot disagree about what a URI means.

A URI must also be one Envoy's jwt_authn filter parses (its URL parser, strict), or every proxy
with the rule refuses its listener: `scheme://[userinfo@]host[:port][/path][?query][#fragment]`
where the host is letters, digits, `.` and `-` (or an IPv6 address in brackets), the userinfo is
RFC 3986's unreserved, sub-delims, `%` and `:` (so one `@` only), a port is digits, a fragment
comes after a path or query, and the rest is printable ASCII without spaces. Measured against
Envoy itself (`tests/test_e2e_envoy_refusals.py` replays the cases).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Final

from meshctl.config.hosts import is_ip

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_PORT = re.compile(r"[0-9]+")
# What Envoy's URL parser takes, piece by piece (see the module docstring).
_ENVOY_URI = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://"
    r"(?:(?P<userinfo>[A-Za-z0-9\-._~!$&'()*+,;=%:]*)@)?"
    r"(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9]+)?\])"
    r"(?::(?P<port>[0-9]+))?"
    r"(?P<rest>[/?][\x21-\x7e]*)?"
)


@dataclass(frozen=True, slots=True)
class JwksUri:
    """Where a key set is fetched from."""

    uri: str
    host: str
    port: int
    tls: bool


def parse_jwks_uri(uri: str) -> JwksUri | None:
    """The host, port and scheme of an http or https `jwksUri`; None for anything else (another
    scheme, no host, a port that is not a number in 1..65535, anything Envoy cannot parse)."""
    match = _ENVOY_URI.fullmatch(uri)
    if match is None:
        return None
    scheme = match["scheme"].lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default is None:
        return None
    # The host as written (Go's `URL.Hostname` keeps its case, and so does the cluster name).
    host = match["host"]
    if host.startswith("["):
        host = host[1:-1]
        if not is_ip(host.partition("%")[0]):
            return None
    port = default
    if match["port"] is not None:
        if not 1 <= int(match["port"]) <= 65535:
            return None
        port = int(match["port"])
    try:
        urllib.parse.urlsplit(uri)  # what Istio's Go parser refuses beyond Envoy's rules
    except ValueError:
        return None
    return JwksUri(uri, host, port, scheme == "https")


def jwks_uri_problem_detail(uri: str) -> str:
    """What is wrong with a `jwksUri` that `parse_jwks_uri` refuses, in a user's words."""
    scheme = uri.partition("://")[0].lower() if "://" in uri else ""
    if scheme not in _DEFAULT_PORTS:
        return f'URI scheme "{scheme}" is not supported: use an http:// or https:// URL'
    if any(not 0x21 <= ord(c) <= 0x7E for c in uri):
        return "Envoy takes printable ASCII only: no spaces, control or non-ASCII characters (percent-encode them)"
    authority = re.split(r"[/?#]", uri.partition("://")[2], maxsplit=1)[0]
    if authority.count("@") > 1:
        return 'it has more than one "@" (percent-encode the userinfo\'s as %40)'
    host = authority.rpartition("@")[2]
    if host.startswith("[") and "]" in host:
        port_text = host.partition("]")[2].removeprefix(":")
    else:
        host, _, port_text = host.partition(":")
        if not host:
            return "it needs a host"
        if not re.fullmatch(r"[A-Za-z0-9.\-]+", host):
            return f'host "{host}" is not a DNS name or an IP address (letters, digits, "." and "-")'
    if port_text and not (_PORT.fullmatch(port_text) and 1 <= int(port_text) <= 65535):
        return f'its port "{port_text}" is not a number in 1..65535'
    if not port_text and authority.endswith(":"):
        return 'it has an empty port after ":"'
    return "Envoy cannot parse it (a host, an optional port, then a path or query; a fragment only after them)"
