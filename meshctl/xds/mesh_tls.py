"""The mesh's own mutual TLS (Istio's ISTIO_MUTUAL): TLS contexts whose certificates come over SDS.

Every proxy is sent two secrets on its ADS stream, under Istio's names: `default`, its workload
certificate chain and key, and `ROOTCA`, the mesh's trust bundle. Clusters and inbound listeners
name them (`sds_config: {ads: {}}`) and never hold key material themselves, so a certificate is
rotated by pushing the secret alone: no cluster or listener changes, no connection drops.

- Client side (`upstream_context`): the proxy presents `default`, verifies the server against
  `ROOTCA` and, when the service's identities are known, checks the server's SPIFFE URI against
  them (Istio's subjectAltNames from service accounts). ALPN `istio-peer-exchange, istio` (and
  `h2` for HTTP/2 clusters) tells the server this is mesh traffic, as Istio's clients do. SNI is
  Istio's `outbound_.PORT_.SUBSET_.HOST`.
- Server side (`downstream_context`): the proxy presents `default` and requires a client
  certificate that chains to `ROOTCA` and names an identity of the mesh's trust domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from envoy.config.core.v3 import config_source_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from google.protobuf import duration_pb2, wrappers_pb2
from google.protobuf.message import Message

#: Istio's secret names (`pilot/pkg/model/credentials`, `security.WorkloadKeyCertResourceName`).
WORKLOAD_SECRET: Final = "default"
ROOT_SECRET: Final = "ROOTCA"
#: What an in-mesh client offers (Istio's ALPNInMeshWithMxc / ALPNInMeshH2WithMxc).
CLIENT_ALPN: Final = ("istio-peer-exchange", "istio")
CLIENT_ALPN_H2: Final = ("istio-peer-exchange", "istio", "h2")
#: What a PERMISSIVE inbound port takes as mesh traffic: TLS with one of Istio's in-mesh ALPNs
#: (mtlsHTTPALPNs and mtlsTCPWithMxcALPNs of Istio's listener builder).
MESH_ALPNS: Final = ("istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2")
#: What an inbound HTTP port offers once TLS is terminated (Istio's ALPNDownstream).
SERVER_ALPN_HTTP: Final = ("h2", "http/1.1")
#: The transport socket match an endpoint's metadata selects (`envoy.transport_socket_match`).
TLS_MODE_KEY: Final = "tlsMode"
TLS_MODE_ISTIO: Final = "istio"


def sds_secret(name: str) -> secret_pb2.SdsSecretConfig:
    """A secret asked for on the ADS stream. No initial fetch timeout: a listener or cluster
    that names a secret waits for it rather than starting without a certificate."""
    source = config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
        initial_fetch_timeout=duration_pb2.Duration(seconds=0),
    )
    return secret_pb2.SdsSecretConfig(name=name, sds_config=source)


def istio_sni(port: int, subset: str, host: str) -> str:
    """Istio's SNI for mesh traffic to a cluster (`BuildDNSSrvSubsetKey`)."""
    return f"outbound_.{port}_.{subset}_.{host}"


def spiffe_uri(trust_domain: str, namespace: str, service_account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account or 'default'}"


def _common(alpn: Sequence[str]) -> tls_pb2.CommonTlsContext:
    common = tls_pb2.CommonTlsContext(alpn_protocols=list(alpn))
    params = common.tls_params
    params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2
    params.tls_maximum_protocol_version = common_pb2.TlsParameters.TLSv1_3
    common.tls_certificate_sds_secret_configs.append(sds_secret(WORKLOAD_SECRET))
    combined = common.combined_validation_context
    combined.default_validation_context.SetInParent()  # required, even when it checks nothing more
    combined.validation_context_sds_secret_config.CopyFrom(sds_secret(ROOT_SECRET))
    return common


def upstream_context(sni: str, identities: Sequence[str], http2: bool) -> tls_pb2.UpstreamTlsContext:
    """A client's ISTIO_MUTUAL context towards a service whose workloads have `identities`
    (SPIFFE URIs; none known: any certificate of the mesh's root is accepted)."""
    common = _common(CLIENT_ALPN_H2 if http2 else CLIENT_ALPN)
    validation = common.combined_validation_context.default_validation_context
    for uri in identities:
        matcher = validation.match_typed_subject_alt_names.add()
        matcher.san_type = common_pb2.SubjectAltNameMatcher.URI
        matcher.matcher.exact = uri
    return tls_pb2.UpstreamTlsContext(common_tls_context=common, sni=sni)


def downstream_context(trust_domain: str, http: bool) -> tls_pb2.DownstreamTlsContext:
    """A server's mutual TLS context for mesh traffic: a client certificate is required and must
    carry a SPIFFE identity of `trust_domain`."""
    common = _common(SERVER_ALPN_HTTP if http else ())
    validation = common.combined_validation_context.default_validation_context
    matcher = validation.match_typed_subject_alt_names.add()
    matcher.san_type = common_pb2.SubjectAltNameMatcher.URI
    matcher.matcher.prefix = f"spiffe://{trust_domain}/"
    return tls_pb2.DownstreamTlsContext(
        common_tls_context=common, require_client_certificate=wrappers_pb2.BoolValue(value=True)
    )


def tls_certificate_secret(name: str, chain_pem: bytes, key_pem: bytes) -> secret_pb2.Secret:
    """A certificate secret (`default`) with its chain and key inline."""
    secret = secret_pb2.Secret(name=name)
    secret.tls_certificate.certificate_chain.inline_bytes = chain_pem
    secret.tls_certificate.private_key.inline_bytes = key_pem
    return secret


def validation_secret(name: str, roots_pem: bytes) -> secret_pb2.Secret:
    """A trust bundle secret (`ROOTCA`)."""
    secret = secret_pb2.Secret(name=name)
    secret.validation_context.trusted_ca.inline_bytes = roots_pem
    return secret


def secret_names(clusters: Iterable[Message], listeners: Iterable[Message]) -> set[str]:
    """The secrets `clusters` and `listeners` ask for over SDS: what Envoy subscribes to once it
    holds them (the names in their TLS transport sockets)."""
    sockets: list[Any] = []
    for cluster in clusters:
        c: Any = cluster
        sockets.append(c.transport_socket)
        sockets.extend(m.transport_socket for m in c.transport_socket_matches)
    for listener in listeners:
        lis: Any = listener
        sockets.extend(chain.transport_socket for chain in lis.filter_chains)
        sockets.append(lis.default_filter_chain.transport_socket)
    found: set[str] = set()
    for socket in sockets:
        typed = socket.typed_config
        if typed.type_url.endswith("UpstreamTlsContext"):
            context: Any = tls_pb2.UpstreamTlsContext()
        elif typed.type_url.endswith("DownstreamTlsContext"):
            context = tls_pb2.DownstreamTlsContext()
        else:
            continue
        typed.Unpack(context)
        common = context.common_tls_context
        found.update(c.name for c in common.tls_certificate_sds_secret_configs)
        for config in (
            common.validation_context_sds_secret_config,
            common.combined_validation_context.validation_context_sds_secret_config,
        ):
            if config.name:
                found.add(config.name)
    return found
