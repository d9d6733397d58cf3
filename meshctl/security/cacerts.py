"""A plug-in CA in Istio's `cacerts` layout, and the checks every signing certificate passes.

Istio lets an operator bring the mesh's CA from their own PKI as four files in one directory:

    ca-cert.pem     the certificate meshctl signs with (usually an intermediate)
    ca-key.pem      its private key
    root-cert.pem   the root(s): the trust bundle every workload gets
    cert-chain.pem  the chain from ca-cert.pem up to the root

Everything that would make the workload certificates useless is caught when the CA is loaded,
with the file named, rather than at the first handshake, where Envoy only says "certificate
verify failed": a missing or non-PEM file, a key that is not ca-cert.pem's, a ca-cert.pem that is
not a CA or may not sign certificates, one that does not chain to root-cert.pem, an expired (or
not yet valid) certificate on the way. A keyUsage extension that is absent allows every use
(RFC 5280 4.2.1.3); one that is present must include keyCertSign.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from meshctl.errors import CredentialError
from meshctl.security.pem import SigningKey, load_certificates, load_private_key, parse_certificates, read_file

CA_CERT = "ca-cert.pem"
CA_KEY = "ca-key.pem"
ROOT_CERT = "root-cert.pem"
CERT_CHAIN = "cert-chain.pem"

#: How far another host's clock may be ahead of ours when it made a certificate.
CLOCK_SKEW = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class SigningMaterial:
    """A CA ready to sign: its certificate and key, the chain from it up to a root, the roots."""

    certificate: x509.Certificate
    key: SigningKey = field(repr=False)
    #: The signing certificate first, then each issuer up to and including the root.
    chain: tuple[x509.Certificate, ...]
    #: The trust bundle, as its file has it (every root in it).
    root_pem: bytes = field(repr=False)


def load_ca_dir(directory: Path, now: datetime) -> SigningMaterial:
    """The plug-in CA of `directory`, checked (see the module's docstring); raises CredentialError."""
    ca_cert, ca_key, root_cert, cert_chain = (directory / n for n in (CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN))
    if not directory.is_dir():
        raise CredentialError(f"{directory}: no such directory (a plug-in CA is a directory in Istio's cacerts layout)")
    for path in (ca_cert, ca_key, root_cert, cert_chain):
        if not path.exists():
            raise CredentialError(
                f"{path}: no such file (a CA directory holds Istio's cacerts files: "
                f"{CA_CERT}, {CA_KEY}, {ROOT_CERT} and {CERT_CHAIN})"
            )
    signing, *bundled = load_certificates(ca_cert)
    key = load_private_key(ca_key)
    root_pem = read_file(root_cert)
    roots = parse_certificates(root_pem, root_cert)
    chain = load_certificates(cert_chain)
    check_signing_pair(signing, ca_cert, key, ca_key, now)
    intermediates = [(c, ca_cert) for c in bundled] + [(c, cert_chain) for c in chain]
    on_path = _path_to_root(signing, ca_cert, intermediates, roots, root_file=root_cert, chain_file=cert_chain)
    for certificate, source in on_path[1:]:
        check_validity(certificate, source, now)
    return SigningMaterial(signing, key, tuple(c for c, _ in on_path), root_pem)


def check_signing_pair(
    certificate: x509.Certificate, cert_file: Path, key: SigningKey, key_file: Path, now: datetime
) -> None:
    """Raise CredentialError unless `key` is the key of `certificate`, a CA certificate that may
    sign certificates and is valid at `now`."""
    if certificate.public_key() != key.public_key():
        raise CredentialError(f"{key_file} is not the private key of {cert_file}")
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    except ValueError:
        raise CredentialError(f"{cert_file}: its extensions cannot be read") from None
    if constraints is None or not constraints.ca:
        raise CredentialError(f"{cert_file}: not a CA certificate (it needs basicConstraints CA:TRUE)")
    try:
        usage: x509.KeyUsage | None = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and not usage.key_cert_sign:
        raise CredentialError(f"{cert_file}: its keyUsage does not allow signing certificates (keyCertSign)")
    check_validity(certificate, cert_file, now)


def check_validity(certificate: x509.Certificate, source: Path, now: datetime) -> None:
    """Raise CredentialError when `certificate` (read from `source`) is expired or not yet valid."""
    subject = certificate.subject.rfc4514_string() or "(no subject)"
    if now >= certificate.not_valid_after_utc:
        raise CredentialError(
            f"{source}: the certificate {subject} expired at {certificate.not_valid_after_utc.isoformat()}"
        )
    if now + CLOCK_SKEW < certificate.not_valid_before_utc:
        raise CredentialError(
            f"{source}: the certificate {subject} is not valid until {certificate.not_valid_before_utc.isoformat()}"
        )


def _path_to_root(
    signing: x509.Certificate,
    signing_file: Path,
    intermediates: list[tuple[x509.Certificate, Path]],
    roots: list[x509.Certificate],
    *,
    root_file: Path,
    chain_file: Path,
) -> list[tuple[x509.Certificate, Path]]:
    """The signing certificate and each issuer up to a root of `roots`, each with its file;
    signatures are checked at every step. Certificates of the chain file that are not on the
    way are ignored, so the workloads are sent the path that verifies and nothing else."""
    path = [(signing, signing_file)]
    current = signing
    for _ in range(len(intermediates) + 1):
        if current in roots:
            return path
        root = next((r for r in roots if _issued_by(current, r)), None)
        if root is not None:
            return [*path, (root, root_file)]
        on_path = [c for c, _ in path]
        step = next(((c, f) for c, f in intermediates if c not in on_path and _issued_by(current, c)), None)
        if step is None:
            break
        path.append(step)
        current = step[0]
    subject = current.subject.rfc4514_string() or "(no subject)"
    issuer = current.issuer.rfc4514_string() or "(no issuer)"
    raise CredentialError(
        f"{signing_file} does not chain to {root_file}: {subject} is issued by {issuer}, "
        f"and no certificate of {root_file} or {chain_file} signed it"
    )


def _issued_by(child: x509.Certificate, parent: x509.Certificate) -> bool:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
