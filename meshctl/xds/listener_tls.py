"""Downstream TLS for gateway servers and Sidecar ingress listeners, from Istio's ServerTLSSettings.

Certificates come either from files on the proxy's host (`serverCertificate`/`privateKey`, or
`tlsCertificates`, and `caCertificates`, read by Envoy itself), or from secrets named by
`credentialName`/`credentialNames` (and MUTUAL's `caCertCredentialName`), which the server
streams over SDS under Istio's names (`meshctl.security.credentials`: `kubernetes://NAME` and
`kubernetes://NAME-cacert`) from `serve --credentials-dir`. Settings that need something this
proxy is not sent are refused with a reason the caller logs, and the server they belong to is
left out rather than half-configured:

- credentials go only to a proxy whose xDS connection proves its workload
  (`ProxyNode.credentials`): config naming a secret the proxy never gets would never start;
- ISTIO_MUTUAL needs the mesh's workload certificate, which the server sends over SDS only to
  a proxy whose xDS connection proves its identity (`ProxyNode.mesh_certificates`); with it, the
  context presents `default` and requires a client certificate of the mesh (`mesh_tls`);
- AUTO_PASSTHROUGH routes by SNI-encoded cluster names to mTLS endpoints (multi-network).

The context itself follows Istio's `BuildListenerTLSContext`: ALPN `h2`/`http/1.1`, a client
certificate required for MUTUAL (validated, but optional, for OPTIONAL_MUTUAL), and the server's
protocol versions and cipher suites as TLS parameters.
"""

from __future__ import annotations

from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from meshctl.api.networking.v1alpha3 import gateway_pb2
from meshctl.security.credentials import ca_resource, certificate_resource
from meshctl.xds import mesh_tls
from meshctl.xds.listener_filters import ALPN_HTTP

_TLS = gateway_pb2.ServerTLSSettings
#: Istio's TLSProtocol and Envoy's TlsParameters.TlsProtocol number the versions alike.
_VERSIONS: Final = {
    _TLS.TLSV1_0: common_pb2.TlsParameters.TLSv1_0,
    _TLS.TLSV1_1: common_pb2.TlsParameters.TLSv1_1,
    _TLS.TLSV1_2: common_pb2.TlsParameters.TLSv1_2,
    _TLS.TLSV1_3: common_pb2.TlsParameters.TLSv1_3,
}
_VALIDATING_MODES: Final = frozenset({_TLS.MUTUAL, _TLS.OPTIONAL_MUTUAL})


def is_passthrough(tls: Any) -> bool:
    return tls is not None and tls.mode in (_TLS.PASSTHROUGH, _TLS.AUTO_PASSTHROUGH)


def uses_credentials(tls: Any) -> bool:
    """Whether the settings name secrets served over SDS (`credentialName` and friends)."""
    return bool(tls.credential_name or list(tls.credential_names) or tls.ca_cert_credential_name)


def unsupported_reason(tls: Any, *, mesh_certificates: bool = False, credentials: bool = False) -> str | None:
    """Why meshctl cannot terminate TLS with these settings, or None when it can
    (`mesh_certificates`: the proxy is sent the mesh's workload certificate; `credentials`: it
    may be sent the secrets `credentialName` names)."""
    if uses_credentials(tls) and tls.mode not in (_TLS.PASSTHROUGH, _TLS.AUTO_PASSTHROUGH):
        if not credentials:
            return (
                "credentialName names a secret served over SDS, which this proxy is not sent (serve with "
                "--credentials-dir, and --client-ca so that its xDS connection proves its workload)"
            )
        if not (tls.credential_name or list(tls.credential_names)) and not (
            tls.tls_certificates or (tls.server_certificate and tls.private_key)
        ):
            return f"TLS mode {_TLS.TLSmode.Name(tls.mode)} needs a credentialName or serverCertificate and privateKey"
        return None
    if tls.mode == _TLS.ISTIO_MUTUAL:
        if mesh_certificates:
            return None
        return (
            "ISTIO_MUTUAL needs the mesh's workload certificate, which this proxy is not sent "
            "(its xDS connection does not prove its identity: serve with --client-ca)"
        )
    if tls.mode == _TLS.AUTO_PASSTHROUGH:
        return "AUTO_PASSTHROUGH (multi-network SNI routing to mesh mTLS) is not supported by meshctl"
    if tls.mode == _TLS.PASSTHROUGH:
        return None
    if not tls.tls_certificates and not (tls.server_certificate and tls.private_key):
        return f"TLS mode {_TLS.TLSmode.Name(tls.mode)} needs serverCertificate and privateKey files"
    if tls.mode in _VALIDATING_MODES and not tls.ca_certificates:
        return f"TLS mode {_TLS.TLSmode.Name(tls.mode)} needs caCertificates to verify client certificates"
    return None


def _file(path: str) -> base_pb2.DataSource:
    return base_pb2.DataSource(filename=path)


def _san_matchers(names: list[str]) -> list[common_pb2.SubjectAltNameMatcher]:
    """Istio's subjectAltNames are exact names; a URI SAN (SPIFFE ids) has a scheme, anything
    else is matched as a DNS name."""
    out = []
    for name in names:
        san_type = common_pb2.SubjectAltNameMatcher.URI if "://" in name else common_pb2.SubjectAltNameMatcher.DNS
        out.append(common_pb2.SubjectAltNameMatcher(san_type=san_type, matcher=string_pb2.StringMatcher(exact=name)))
    return out


def downstream_tls_context(
    tls: Any, alpn: tuple[str, ...] = ALPN_HTTP, *, trust_domain: str = "cluster.local"
) -> tls_pb2.DownstreamTlsContext:
    """A DownstreamTlsContext for SIMPLE, MUTUAL, OPTIONAL_MUTUAL or ISTIO_MUTUAL settings that
    passed `unsupported_reason`."""
    if tls.mode == _TLS.ISTIO_MUTUAL:
        context = mesh_tls.downstream_context(trust_domain, http=bool(alpn))
        del context.common_tls_context.alpn_protocols[:]
        context.common_tls_context.alpn_protocols.extend(alpn)
        if tls.subject_alt_names:
            validation = context.common_tls_context.combined_validation_context.default_validation_context
            del validation.match_typed_subject_alt_names[:]
            validation.match_typed_subject_alt_names.extend(_san_matchers(list(tls.subject_alt_names)))
        return context
    common = tls_pb2.CommonTlsContext(alpn_protocols=list(alpn))
    names = [tls.credential_name] if tls.credential_name else list(tls.credential_names)
    if names:
        common.tls_certificate_sds_secret_configs.extend(mesh_tls.sds_secret(certificate_resource(n)) for n in names)
    elif tls.tls_certificates:
        for cert in tls.tls_certificates:
            common.tls_certificates.add(
                certificate_chain=_file(cert.server_certificate), private_key=_file(cert.private_key)
            )
    else:
        common.tls_certificates.add(certificate_chain=_file(tls.server_certificate), private_key=_file(tls.private_key))
    if tls.mode in _VALIDATING_MODES:
        ca_name = tls.ca_cert_credential_name or (names[0] if names else "")
        if ca_name:
            # Istio's rule: the bundle comes from `NAME-cacert`, whose checks stay in the config.
            combined = common.combined_validation_context
            combined.validation_context_sds_secret_config.CopyFrom(mesh_tls.sds_secret(ca_resource(ca_name)))
            vc = combined.default_validation_context
        else:
            vc = common.validation_context
            vc.trusted_ca.CopyFrom(_file(tls.ca_certificates))
        if tls.ca_crl:
            vc.crl.CopyFrom(_file(tls.ca_crl))
        vc.match_typed_subject_alt_names.extend(_san_matchers(list(tls.subject_alt_names)))
        vc.verify_certificate_spki.extend(tls.verify_certificate_spki)
        vc.verify_certificate_hash.extend(tls.verify_certificate_hash)
    if tls.min_protocol_version in _VERSIONS:
        common.tls_params.tls_minimum_protocol_version = _VERSIONS[tls.min_protocol_version]
    if tls.max_protocol_version in _VERSIONS:
        common.tls_params.tls_maximum_protocol_version = _VERSIONS[tls.max_protocol_version]
    if tls.cipher_suites:
        common.tls_params.cipher_suites.extend(tls.cipher_suites)
    return tls_pb2.DownstreamTlsContext(
        common_tls_context=common,
        require_client_certificate=wrappers_pb2.BoolValue(value=tls.mode == _TLS.MUTUAL),
    )
