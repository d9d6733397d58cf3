"""TLS origination from a DestinationRule's `tls` settings (Istio's `cluster_tls.go`).

Istio hands certificate files to Envoy through its node agent's SDS; a VM served by meshctl has
no such agent, so the files are given to Envoy directly (`filename` data sources, read when the
cluster is created; Envoy does not reload them, so rotating them means pushing the cluster again).

- DISABLE: plaintext.
- SIMPLE: TLS with the server verified against `caCertificates`, or the system's trust store
  when none is given (Istio's `system` default), unless `insecureSkipVerify`.
- MUTUAL: SIMPLE plus the client certificate and key; without both files Istio refuses to build
  the TLS context and the cluster stays plaintext, and so does meshctl (validation reports it).
- ISTIO_MUTUAL: the mesh's own certificates, which meshctl issues and serves over SDS
  (`mesh_tls`): the proxy presents its workload certificate and checks the server's SPIFFE
  identity. With no `tls` at all, auto mTLS (MeshConfig `enableAutoMtls`, on by default) does the
  same towards endpoints that run a proxy (`security.istio.io/tlsMode: istio`) and stays
  plaintext to the others, unless the service's namespace (or the mesh) DISABLEs mutual TLS.
- `credentialName` names a secret served over SDS (`serve --credentials-dir`), for gateways only
  as in Istio: the client certificate and key are `kubernetes://NAME` (MUTUAL) and the server is
  verified against `kubernetes://NAME-cacert` (its `ca.crt`), in place of the files. A sidecar,
  or a gateway not sent credentials (`ProxyNode.credentials`), uses the files.

With no `sni`, Envoy sets SNI from each request's host (`auto_sni`); with neither `sni` nor
`subjectAltNames`, it also checks the certificate against that host (`auto_san_validation`).
SANs are matched exactly, as URIs when they look like one (`spiffe://...`), as IP addresses when
they are one, else as DNS names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Final

from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.security.credentials import ca_resource, certificate_resource
from meshctl.xds import mesh_tls
from meshctl.xds.cluster_policy import ClusterDraft

TLS_TRANSPORT_SOCKET: Final = "envoy.transport_sockets.tls"
RAW_BUFFER_SOCKET: Final = "envoy.transport_sockets.raw_buffer"

_MODE = dr_pb2.ClientTLSSettings
_SAN = common_pb2.SubjectAltNameMatcher


#: The system CA bundle as one file, on the proxy's host. A fixed path (Debian and Ubuntu's; where
#: Envoy runs on another distribution, link it there) rather than one probed here: generation must
#: not depend on the control plane's own files.
SYSTEM_CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"


def originates_tls(tls: dr_pb2.ClientTLSSettings | None) -> bool:
    """True when the settings make the cluster speak TLS with user-supplied files."""
    return tls is not None and tls.mode in (_MODE.SIMPLE, _MODE.MUTUAL)


def apply_tls(draft: ClusterDraft, tls: dr_pb2.ClientTLSSettings | None, *, credentials: bool = False) -> None:
    """Set the cluster's TLS transport socket from `tls`; call after the HTTP/2 decision (ALPN
    depends on it). `credentials`: a gateway sent the secret `credentialName` names."""
    if tls is None or not originates_tls(tls):
        return
    mutual = tls.mode == _MODE.MUTUAL
    if credentials and tls.credential_name:
        _apply_credential(draft, tls, mutual)
        return
    if mutual and not (tls.client_certificate and tls.private_key):
        return
    context = tls_pb2.UpstreamTlsContext(sni=tls.sni)
    common = context.common_tls_context
    common.tls_params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2
    common.tls_params.tls_maximum_protocol_version = common_pb2.TlsParameters.TLSv1_3
    _auto_sni(draft, tls)
    if mutual:
        certificate = common.tls_certificates.add()
        certificate.certificate_chain.filename = tls.client_certificate
        certificate.private_key.filename = tls.private_key
    validation = common.validation_context
    validation.SetInParent()
    if not tls.insecure_skip_verify.value:
        if tls.ca_certificates:
            validation.trusted_ca.filename = tls.ca_certificates
        elif tls.subject_alt_names:
            # Envoy refuses SAN matching against system_root_certs; the system bundle as a file
            # is the same trust, spelled the way it accepts (Istio resolves "system" alike).
            validation.trusted_ca.filename = SYSTEM_CA_BUNDLE
        else:
            validation.system_root_certs.SetInParent()
        for san in tls.subject_alt_names:
            matcher = validation.match_typed_subject_alt_names.add()
            matcher.san_type = _san_type(san)
            matcher.matcher.exact = san
        if tls.ca_crl:
            validation.crl.filename = tls.ca_crl
    if draft.is_http2:
        common.alpn_protocols.append("h2")
    socket = draft.cluster.transport_socket
    socket.name = TLS_TRANSPORT_SOCKET
    socket.typed_config.Pack(context)


def _apply_credential(draft: ClusterDraft, tls: dr_pb2.ClientTLSSettings, mutual: bool) -> None:
    """Istio's egress gateway origination from a credential: the key pair and the trust bundle
    over SDS, the rule's SAN checks kept."""
    context = tls_pb2.UpstreamTlsContext(sni=tls.sni)
    common = context.common_tls_context
    common.tls_params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2
    common.tls_params.tls_maximum_protocol_version = common_pb2.TlsParameters.TLSv1_3
    _auto_sni(draft, tls)
    if mutual:
        common.tls_certificate_sds_secret_configs.append(mesh_tls.sds_secret(certificate_resource(tls.credential_name)))
    if not tls.insecure_skip_verify.value:
        combined = common.combined_validation_context
        combined.validation_context_sds_secret_config.CopyFrom(mesh_tls.sds_secret(ca_resource(tls.credential_name)))
        validation = combined.default_validation_context
        validation.SetInParent()
        for san in tls.subject_alt_names:
            matcher = validation.match_typed_subject_alt_names.add()
            matcher.san_type = _san_type(san)
            matcher.matcher.exact = san
    if draft.is_http2:
        common.alpn_protocols.append("h2")
    socket = draft.cluster.transport_socket
    socket.name = TLS_TRANSPORT_SOCKET
    socket.typed_config.Pack(context)


def _auto_sni(draft: ClusterDraft, tls: dr_pb2.ClientTLSSettings) -> None:
    auto_sni = not tls.sni
    auto_san = auto_sni and not tls.subject_alt_names and not tls.insecure_skip_verify.value
    if auto_sni or auto_san:
        upstream = draft.http_options().upstream_http_protocol_options
        upstream.SetInParent()
        if auto_sni:
            upstream.auto_sni = True
        if auto_san:
            upstream.auto_san_validation = True


def _san_type(san: str) -> int:
    if "://" in san:
        return int(_SAN.URI)
    try:
        ipaddress.ip_address(san)
    except ValueError:
        return int(_SAN.DNS)
    return int(_SAN.IP_ADDRESS)


def is_istio_mutual(tls: dr_pb2.ClientTLSSettings | None) -> bool:
    return tls is not None and tls.mode == _MODE.ISTIO_MUTUAL


def apply_istio_mutual(draft: ClusterDraft, tls: dr_pb2.ClientTLSSettings, sni: str, identities: Sequence[str]) -> None:
    """ISTIO_MUTUAL from a DestinationRule: the mesh's certificates over SDS; the rule's own `sni`
    and `subjectAltNames` win over Istio's SNI and the service's identities."""
    sans = list(tls.subject_alt_names) or list(identities)
    context = mesh_tls.upstream_context(tls.sni or sni, sans, draft.is_http2)
    socket = draft.cluster.transport_socket
    socket.name = TLS_TRANSPORT_SOCKET
    socket.typed_config.Pack(context)


def apply_auto_mtls(draft: ClusterDraft, sni: str, identities: Sequence[str]) -> None:
    """Istio's auto mTLS: mutual TLS to endpoints whose metadata says they run a proxy
    (`tlsMode: istio`), plaintext to the others, chosen per endpoint by transport socket match."""
    context = mesh_tls.upstream_context(sni, list(identities), draft.is_http2)
    cluster = draft.cluster
    mtls = cluster.transport_socket_matches.add(name=f"{mesh_tls.TLS_MODE_KEY}-{mesh_tls.TLS_MODE_ISTIO}")
    mtls.match.update({mesh_tls.TLS_MODE_KEY: mesh_tls.TLS_MODE_ISTIO})
    mtls.transport_socket.name = TLS_TRANSPORT_SOCKET
    mtls.transport_socket.typed_config.Pack(context)
    plain = cluster.transport_socket_matches.add(name=f"{mesh_tls.TLS_MODE_KEY}-disabled")
    plain.match.SetInParent()
    plain.transport_socket.name = RAW_BUFFER_SOCKET
    plain.transport_socket.typed_config.Pack(raw_buffer_pb2.RawBuffer())
