"""Which filter chains an inbound port gets, by its mTLS mode and protocol: Istio's filter chain
match tables (`pilot/pkg/networking/core/filterchain_options.go`, `getFilterChainMatchOptions`).

An inbound port is served by one chain per way a client may arrive, each told apart by what the
listener filters detect before a chain is picked: the transport (`tls` from the TLS inspector,
else `raw_buffer`) and the application protocols (the ALPN a TLS client offers, or `http/1.1` /
`h2c` when the HTTP inspector recognises plaintext HTTP). Mesh clients mark their traffic with
Istio's ALPN values, so a PERMISSIVE port can tell mutual TLS from a client's own TLS:

- STRICT: mutual TLS only. Plaintext matches no chain (Envoy closes the connection) and TLS
  that is not the mesh's fails the handshake, since a client certificate of the mesh is required.
- PERMISSIVE: mutual TLS for the mesh's ALPNs, plaintext, and (TCP and sniffed ports) TLS that
  is not the mesh's passed through untouched, for an app that terminates its own TLS.
- DISABLE: plaintext only (TLS is not inspected, so an app's own TLS passes as bytes).

A port without a declared protocol (`UNSUPPORTED`: Istio's "auto") is sniffed: plaintext HTTP
and mutual TLS carrying Istio's HTTP ALPNs get an HTTP connection manager, where HTTP-level
policy applies; anything else a TCP proxy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from meshctl.registry.model import Protocol
from meshctl.security.peer_authentication import MtlsMode
from meshctl.xds.listener_filters import PLAINTEXT_HTTP_ALPNS, RAW_BUFFER, TLS_TRANSPORT

#: What Istio's clients offer for HTTP sent over mutual TLS (its `istio.alpn` filter sets them).
MTLS_HTTP_ALPNS: Final = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
#: Every ALPN an Istio client offers over mutual TLS (`allIstioMtlsALPNs`).
ALL_ISTIO_MTLS_ALPNS: Final = ("istio", "istio-peer-exchange", *MTLS_HTTP_ALPNS)
#: What an Istio client offers for TCP over mutual TLS (`mtlsTCPWithMxcALPNs`).
MTLS_TCP_ALPNS: Final = ("istio-peer-exchange", "istio")


class ChainProtocol(enum.Enum):
    """Istio's ListenerProtocol: what a port's chains serve."""

    HTTP = "http"
    TCP = "tcp"
    AUTO = "auto"  # sniffed: both an HTTP and a TCP chain

    @classmethod
    def of(cls, protocol: Protocol) -> ChainProtocol:
        """Istio's `ModelProtocolToListenerProtocol`."""
        if protocol.is_http:
            return cls.HTTP
        if protocol.is_sniffed:
            return cls.AUTO
        return cls.TCP


@dataclass(frozen=True, slots=True)
class MatchOption:
    """One filter chain of a port (Istio's FilterChainMatchOptions): what it matches, whether it
    serves HTTP or TCP, and whether it terminates TLS (the mesh's, or the port's own)."""

    transport: str
    http: bool
    alpns: tuple[str, ...] = ()
    terminate: bool = False


_MTLS_HTTP = MatchOption(TLS_TRANSPORT, http=True, alpns=MTLS_HTTP_ALPNS, terminate=True)
_PLAIN_HTTP_SNIFFED = MatchOption(RAW_BUFFER, http=True, alpns=PLAINTEXT_HTTP_ALPNS)
_PLAIN_TCP = MatchOption(RAW_BUFFER, http=False)
_OTHER_TLS = MatchOption(TLS_TRANSPORT, http=False)

_TABLES: Final[dict[tuple[MtlsMode, ChainProtocol], tuple[MatchOption, ...]]] = {
    (MtlsMode.STRICT, ChainProtocol.AUTO): (_MTLS_HTTP, MatchOption(TLS_TRANSPORT, http=False, terminate=True)),
    (MtlsMode.STRICT, ChainProtocol.HTTP): (MatchOption(TLS_TRANSPORT, http=True, terminate=True),),
    (MtlsMode.STRICT, ChainProtocol.TCP): (MatchOption(TLS_TRANSPORT, http=False, terminate=True),),
    (MtlsMode.PERMISSIVE, ChainProtocol.AUTO): (
        _MTLS_HTTP,
        _PLAIN_HTTP_SNIFFED,
        MatchOption(TLS_TRANSPORT, http=False, alpns=MTLS_TCP_ALPNS, terminate=True),
        _PLAIN_TCP,
        _OTHER_TLS,
    ),
    (MtlsMode.PERMISSIVE, ChainProtocol.HTTP): (
        MatchOption(TLS_TRANSPORT, http=True, alpns=ALL_ISTIO_MTLS_ALPNS, terminate=True),
        MatchOption(RAW_BUFFER, http=True),
    ),
    (MtlsMode.PERMISSIVE, ChainProtocol.TCP): (
        MatchOption(TLS_TRANSPORT, http=False, alpns=ALL_ISTIO_MTLS_ALPNS, terminate=True),
        _PLAIN_TCP,
        _OTHER_TLS,
    ),
    (MtlsMode.DISABLE, ChainProtocol.AUTO): (_PLAIN_HTTP_SNIFFED, _PLAIN_TCP),
    (MtlsMode.DISABLE, ChainProtocol.HTTP): (MatchOption(RAW_BUFFER, http=True),),
    (MtlsMode.DISABLE, ChainProtocol.TCP): (_PLAIN_TCP,),
}


def match_options(
    mode: MtlsMode, protocol: ChainProtocol, *, mesh_certificates: bool = True
) -> tuple[MatchOption, ...]:
    """The chains of a port in `mode` serving `protocol` (`getFilterChainMatchOptions`). A proxy
    that is not sent the mesh's certificates cannot terminate mutual TLS: its chains are those
    that do not (none under STRICT)."""
    options = _TABLES[(mode, protocol)]
    if mesh_certificates:
        return options
    return tuple(o for o in options if not o.terminate)


def own_tls_options(protocol: ChainProtocol) -> tuple[MatchOption, ...]:
    """The one chain of a port that terminates its own TLS (a Sidecar ingress `tls`, only under
    DISABLE): `getTLSFilterChainMatchOptions`; a sniffed port is served as TCP."""
    return (MatchOption(TLS_TRANSPORT, http=protocol is ChainProtocol.HTTP, terminate=True),)
