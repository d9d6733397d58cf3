"""A RequestAuthentication `jwksUri` taken apart as Istio's `security.ParseJwksURI` does: the
scheme says whether the key server speaks TLS and gives the default port (443 for https, 80 for
http), the host and an explicit port say where it is.

One parser for the validation that refuses an unusable URI and for the generators that name the
cluster Envoy fetches the keys through, so the two cannot disagree about what a URI means.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Final

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_PORT = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class JwksUri:
    """Where a key set is fetched from."""

    uri: str
    host: str
    port: int
    tls: bool


def parse_jwks_uri(uri: str) -> JwksUri | None:
    """The host, port and scheme of an http or https `jwksUri`; None for anything else (another
    scheme, no host, a port that is not a number in 1..65535)."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return None
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None:
        return None
    # The host as written (Go's `URL.Hostname` keeps its case, and so does the cluster name).
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = hostport.partition(":")
    if not host:
        return None
    port = default
    if port_text:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            return None
        port = int(port_text)
    return JwksUri(uri, host, port, parts.scheme == "https")
