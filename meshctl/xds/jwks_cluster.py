"""Where a proxy fetches a JWT issuer's key set from: the cluster behind a `jwksUri`.

istiod fetches every `jwksUri` itself by default and inlines the keys in the filter it sends
(`PILOT_JWT_ENABLE_REMOTE_JWKS` off); it can instead let Envoy fetch them (`remote_jwks`), through
the cluster it would build for the URI's host and port, `outbound|PORT||HOST`
(`security.ParseJwksURI`: port 443 for https, 80 for http, unless the URI names one). meshctl
does the latter, so that generation stays pure (no fetch in the control plane) and keys rotate
without a push: Envoy refetches them every five minutes.

Istio finds that cluster among the mesh's services (a ServiceEntry for the host); meshctl builds
it for the proxy that validates the tokens, under the same name, so that a ServiceEntry's
cluster of that name, merged first, wins: `merge_clusters` keeps the first of a name.

- LOGICAL_DNS to the host (a host given as an IP address: STATIC), on Envoy's DNS cluster
  extension like every DNS cluster meshctl makes (`cluster_dns`): a key server is an external web
  service, which Envoy advises reaching through one address per connection.
- https: TLS with SNI, the certificate checked against the system CA bundle as a file on the
  proxy's host (`cluster_tls.SYSTEM_CA_BUNDLE`) and against the host name (or IP address).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any, Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from meshctl.config.jwks_uri import JwksUri, parse_jwks_uri
from meshctl.xds import names
from meshctl.xds.cluster_dns import use_dns_extension
from meshctl.xds.cluster_policy import duration
from meshctl.xds.cluster_tls import SYSTEM_CA_BUNDLE, TLS_TRANSPORT_SOCKET

#: Istio's default connect timeout (MeshConfig `connectTimeout`).
DEFAULT_CONNECT_TIMEOUT: Final = 10.0

_Cluster = cluster_pb2.Cluster
_SAN = common_pb2.SubjectAltNameMatcher


def cluster_name(jwks: JwksUri) -> str:
    """`outbound|443||keys.example.com`: Istio's name for the cluster the keys come through."""
    return names.outbound_cluster(jwks.port, jwks.host)


def jwks_uris(rules: Iterable[Any]) -> tuple[JwksUri, ...]:
    """The key set URIs Envoy fetches for `rules` (JWTRule messages): those of rules that give a
    `jwksUri` and no inline `jwks`, which wins when both are set."""
    out: list[JwksUri] = []
    for rule in rules:
        parsed = parse_jwks_uri(rule.jwks_uri) if rule.jwks_uri and not rule.jwks else None
        if parsed is not None:
            out.append(parsed)
    return tuple(out)


def jwks_clusters(
    rules: Iterable[Any], *, family: str = "v4", connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> list[cluster_pb2.Cluster]:
    """The clusters the `remote_jwks` of `rules` name, one per host and port, sorted by name."""
    by_name = {cluster_name(jwks): jwks for jwks in jwks_uris(rules)}
    return [
        build_jwks_cluster(by_name[name], family=family, connect_timeout=connect_timeout) for name in sorted(by_name)
    ]


def build_jwks_cluster(
    jwks: JwksUri, *, family: str = "v4", connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> cluster_pb2.Cluster:
    """The cluster Envoy fetches `jwks` through. `family` (the proxy's address family) picks the DNS
    lookup family (IPv6 only for an IPv6 proxy, as Istio); `connect_timeout` is the mesh's."""
    literal = _is_ip(jwks.host)
    name = cluster_name(jwks)
    cluster = _Cluster(name=name, type=_Cluster.STATIC if literal else _Cluster.LOGICAL_DNS)
    cluster.connect_timeout.CopyFrom(duration(connect_timeout))
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    endpoint = endpoint_components_pb2.LbEndpoint()
    endpoint.endpoint.address.CopyFrom(
        address_pb2.Address(socket_address=address_pb2.SocketAddress(address=jwks.host, port_value=jwks.port))
    )
    assignment.endpoints.add().lb_endpoints.append(endpoint)
    cluster.load_assignment.CopyFrom(assignment)
    if jwks.tls:
        cluster.transport_socket.name = TLS_TRANSPORT_SOCKET
        cluster.transport_socket.typed_config.Pack(_upstream_tls(jwks.host, literal=literal))
    return use_dns_extension(cluster, family)


def _upstream_tls(host: str, *, literal: bool) -> tls_pb2.UpstreamTlsContext:
    context = tls_pb2.UpstreamTlsContext(sni="" if literal else host)
    common = context.common_tls_context
    common.tls_params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2
    common.tls_params.tls_maximum_protocol_version = common_pb2.TlsParameters.TLSv1_3
    validation = common.validation_context
    validation.trusted_ca.filename = SYSTEM_CA_BUNDLE
    san = validation.match_typed_subject_alt_names.add()
    san.san_type = _SAN.IP_ADDRESS if literal else _SAN.DNS
    san.matcher.exact = host
    return context


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
