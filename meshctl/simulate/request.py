"""The simulated request: what Envoy sees of it when it picks a listener and a route.

A request is given as a URL, a method and headers, as `curl` takes them, so a person can paste
the call their application makes. Envoy routes on the `:authority` (the Host header, which a
`-H Host:` given overrides, as curl does), the path with its query, and the headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import parse_qsl, urlsplit

from meshctl.errors import UsageError

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Request:
    """An HTTP request as the proxy receives it. Header names are lower case, as HTTP/2 and
    Envoy's matchers see them; a header given twice keeps both values, comma-joined."""

    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: For a TCP or TLS connection (`scheme` `tcp` or `tls`): the SNI a TLS client sends.
    server_name: str = ""

    @property
    def is_http(self) -> bool:
        return self.scheme in _DEFAULT_PORTS

    @property
    def authority(self) -> str:
        """The Host header: the one given, else the URL's host with any non-default port."""
        given = self.headers.get("host")
        if given:
            return given
        default = _DEFAULT_PORTS.get(self.scheme)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def path_and_query(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    def query_params(self) -> list[tuple[str, str]]:
        return parse_qsl(self.query, keep_blank_values=True)

    def url(self) -> str:
        if not self.is_http:
            sni = f" (SNI {self.server_name})" if self.server_name else ""
            return f"{self.scheme}://{self.host}:{self.port}{sni}"
        return f"{self.scheme}://{self.authority}{self.path_and_query}"


def parse_request(url: str, method: str = "GET", headers: Sequence[str] = ()) -> Request:
    """A Request from curl-like input: `http://HOST[:PORT]/PATH?QUERY`, `-X METHOD`, and
    `-H NAME:VALUE` each. Raises UsageError for what cannot be a request."""
    try:
        # urlsplit, .hostname and .port each raise ValueError on a malformed authority
        # (`http://[::1:9080/`, a port out of range, a bracketed host that is no IP address).
        parts = urlsplit(url)
        hostname, given_port = parts.hostname, parts.port
    except ValueError as exc:
        raise UsageError(f"{url!r}: not a valid URL ({exc})") from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise UsageError(f"{url!r}: give a URL with http:// or https:// (e.g. http://reviews.bookinfo.mesh:9080/)")
    if not hostname:
        raise UsageError(f"{url!r}: the URL names no host")
    port = given_port or _DEFAULT_PORTS[parts.scheme]
    if not method or not method.isalpha():
        raise UsageError(f"-X {method!r}: not an HTTP method")
    return Request(
        method=method.upper(),
        scheme=parts.scheme,
        host=hostname,
        port=port,
        path=parts.path or "/",
        query=parts.query,
        headers=MappingProxyType(parse_headers(headers)),
    )


def parse_connection(address: str, server_name: str = "") -> Request:
    """A TCP connection to `HOST:PORT` (`--tcp`), TLS when `server_name` is given (`--sni`):
    what a database client or a TLS client that Envoy does not terminate sends."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--tcp {address!r}: give HOST:PORT (e.g. mysql.shop.mesh:3306)")
    return Request(
        method="",
        scheme="tls" if server_name else "tcp",
        host=host,
        port=int(port_text),
        path="",
        server_name=server_name,
    )


def parse_headers(given: Sequence[str]) -> dict[str, str]:
    """`NAME:VALUE` strings as a dict of lower-case names; UsageError for one without a name."""
    out: dict[str, str] = {}
    for item in given:
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or not name or any(c.isspace() for c in name):
            raise UsageError(f"-H {item!r}: give a header as NAME:VALUE")
        value = value.strip()
        out[name] = f"{out[name]},{value}" if name in out else value
    return out
