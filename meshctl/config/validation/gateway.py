"""Gateway rules: every server needs a port, hosts, and TLS settings that fit its protocol.

Server TLS settings are also what a Sidecar's ingress listener takes, so `check_server_tls` is
shared with the Sidecar rules.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    UNIX_PREFIX,
    Report,
    enum_name,
    ip_problem,
    is_http,
    is_tls,
    namespace_host_problems,
    parse_protocol,
    port_problem,
    unix_address_problem,
)
from meshctl.config.validation.envoy_limits import certificate_hash_problem, certificate_spki_problem

# The cipher suites Envoy (BoringSSL) accepts by name.
_CIPHER_SUITES: Final = frozenset(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-RSA-AES256-SHA",
        "AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA", "AES256-SHA", "DES-CBC3-SHA",
    )
)  # fmt: skip
_KNOWN_PROTOCOLS: Final = "HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, MYSQL, REDIS"


def validate(spec: Message) -> list[Issue]:
    gateway: Any = spec
    report = Report()
    if not gateway.servers:
        report.error(("spec",), "a Gateway needs at least one server")
    names: set[str] = set()
    for i, server in enumerate(gateway.servers):
        path: FieldPath = ("spec", "servers", i)
        _server(report, path, server)
        if not server.HasField("port"):
            continue
        port = server.port
        if port.name and port.name in names:
            report.error(
                (*path, "port", "name"), f'duplicate port name "{port.name}": server port names must be unique'
            )
        names.add(port.name)
        if server.tls.https_redirect and not is_http(port.protocol):
            report.warn((*path, "tls", "httpsRedirect"), "httpsRedirect only applies to HTTP servers")
    _shared_ports(report, list(gateway.servers))
    return report.issues


def _is_tls_server(server: Any) -> bool:
    return server.HasField("tls") and not is_http(server.port.protocol)


def _shared_ports(report: Report, servers: list[Any]) -> None:
    """Servers on one port and bind share a listener: plain-text ones only when all speak HTTP,
    TLS ones only when each has tls settings (to be told apart by SNI). Istio drops the others."""
    first: dict[tuple[int, str], int] = {}
    for i, server in enumerate(servers):
        if not server.HasField("port") or not server.port.number or parse_protocol(server.port.protocol) is None:
            continue
        j = first.setdefault((server.port.number, server.bind), i)
        if j == i:
            continue
        taken = servers[j]
        number, protocol = server.port.number, server.port.protocol
        if _is_tls_server(taken):
            if not server.HasField("tls"):
                report.warn(
                    ("spec", "servers", i),
                    f"server #{i} is ignored: port {number} is a TLS port (server #{j}) and this server has no tls",
                )
        elif not (is_http(taken.port.protocol) and is_http(protocol)):
            report.warn(
                ("spec", "servers", i, "port", "number"),
                f"server #{i} is ignored: port {number} is already served by server #{j} "
                f"({taken.port.protocol}), and only HTTP servers can share a plain-text port",
            )


def _server(report: Report, path: FieldPath, server: Any) -> None:
    if not server.hosts:
        report.error((*path, "hosts"), "a server needs at least one host")
    for j, host in enumerate(server.hosts):
        for problem in namespace_host_problems(host, gateway=True):
            report.error((*path, "hosts", j), problem)
    unix = server.bind.startswith(UNIX_PREFIX)
    if unix:
        report.error((*path, "bind"), unix_address_problem(server.bind.removeprefix(UNIX_PREFIX)))
        if server.port.number:
            report.error((*path, "port", "number"), "the port number must be 0 when bind is a unix domain socket")
    elif server.bind:
        report.error((*path, "bind"), ip_problem(server.bind))
    if server.HasField("tls"):
        check_server_tls(report, (*path, "tls"), server.tls)
    if not server.HasField("port"):
        report.error(path, "a server needs a port")
        return
    port, at = server.port, (*path, "port")
    protocol = parse_protocol(port.protocol)
    if protocol is None:
        report.error((*at, "protocol"), f'unsupported protocol "{port.protocol}": use one of {_KNOWN_PROTOCOLS}')
    if port.number or not unix:
        report.error((*at, "number"), port_problem(port.number))
    if port.target_port:
        report.error((*at, "targetPort"), "targetPort has no effect on a Gateway")
    if not port.name:
        report.error(at, "the server port needs a name")
    if protocol is None:
        return
    if is_tls(protocol) and not server.HasField("tls"):
        report.error(path, f"a server with protocol {protocol} needs tls settings")
    elif not is_tls(protocol) and server.HasField("tls"):
        tls = server.tls
        passthrough = enum_name(tls, "mode") in ("PASSTHROUGH", "AUTO_PASSTHROUGH")
        if not is_http(protocol):
            report.error(
                (*path, "tls"), f"a server with protocol {protocol} cannot have tls settings: use HTTPS or TLS"
            )
        elif not passthrough or tls.ca_certificates or tls.private_key or tls.server_certificate:
            report.error((*path, "tls"), "a plain-text HTTP server can only have tls.httpsRedirect")


def check_server_tls(report: Report, path: FieldPath, tls: Any) -> None:
    """TLS a server terminates: certificates from files or from a credential, by mode."""
    mode = enum_name(tls, "mode")
    version = enum_name(tls, "min_protocol_version")
    if version in ("TLSV1_0", "TLSV1_1") and not tls.cipher_suites:
        report.warn(
            (*path, "minProtocolVersion"),
            f"{version} needs cipherSuites set: the default ciphers no longer include ones it can use",
        )
    seen: set[str] = set()
    for i, suite in enumerate(tls.cipher_suites):
        # Names led by "-", "+" or "!" are OpenSSL-style expressions: left to Envoy.
        if suite and suite != "ALL" and suite[0].isalnum() and suite not in _CIPHER_SUITES:
            report.warn((*path, "cipherSuites", i), f'unknown cipher suite "{suite}" is ignored')
        elif suite in seen:
            report.warn((*path, "cipherSuites", i), f'duplicate cipher suite "{suite}" is ignored')
        seen.add(suite)
    for i, digest in enumerate(tls.verify_certificate_hash):
        report.error((*path, "verifyCertificateHash", i), certificate_hash_problem(digest))
    for i, digest in enumerate(tls.verify_certificate_spki):
        report.error((*path, "verifyCertificateSpki", i), certificate_spki_problem(digest))
    files = {
        "serverCertificate": tls.server_certificate,
        "privateKey": tls.private_key,
        "caCertificates": tls.ca_certificates,
        "tlsCertificates": bool(tls.tls_certificates),
        "credentialName": tls.credential_name,
        "credentialNames": bool(tls.credential_names),
    }
    if mode == "ISTIO_MUTUAL":
        for name, value in files.items():
            if value:
                report.error(
                    (*path, name), f"{name} cannot be set with mode ISTIO_MUTUAL: it uses the mesh's certificates"
                )
        return
    if mode in ("PASSTHROUGH", "AUTO_PASSTHROUGH") and (any(files.values()) or tls.ca_crl):
        report.warn(path, f"mode {mode} does not terminate TLS: its certificates are ignored")
    sources = sum(
        (
            bool(tls.server_certificate and tls.private_key),
            bool(tls.credential_name),
            bool(tls.credential_names),
            bool(tls.tls_certificates),
        )
    )
    if sources > 1:
        report.error(
            path, "set only one of credentialName, credentialNames, serverCertificate/privateKey or tlsCertificates"
        )
    terminating = mode in ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL")
    if terminating and (tls.credential_name or tls.credential_names):
        return  # certificates and CA come from the credential
    if terminating:
        label = "SIMPLE" if mode == "SIMPLE" else "MUTUAL"
        if label == "MUTUAL" and not (tls.ca_certificates or tls.ca_cert_credential_name):
            report.error(path, f"{mode} TLS needs caCertificates (or a credentialName) to verify clients")
        if len(tls.tls_certificates) > 2:
            report.warn((*path, "tlsCertificates"), f"{label} TLS serves at most 2 certificates (RSA and ECDSA)")
        pairs = (
            [((*path, "tlsCertificates", i), c) for i, c in enumerate(tls.tls_certificates)]
            if tls.tls_certificates
            else [(path, tls)]
        )
        for at, cert in pairs:
            if not cert.server_certificate:
                report.error(at, f"{mode} TLS needs a serverCertificate (or a credentialName)")
            if not cert.private_key:
                report.error(at, f"{mode} TLS needs a privateKey (or a credentialName)")
    if tls.ca_crl:
        if tls.credential_name:
            report.error((*path, "caCrl"), "caCrl cannot be used with credentialName: put the CRL in the credential")
        if mode == "SIMPLE":
            report.error((*path, "caCrl"), "caCrl is not supported with SIMPLE TLS")
