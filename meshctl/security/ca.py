"""The mesh's certificate authority: it signs workload, VM client and xDS server certificates.

It comes from one of two places, as istiod's does:

- a plug-in CA, Istio's `cacerts` directory from the operator's own PKI (`from_ca_dir`,
  checked by `meshctl.security.cacerts`), which wins whenever it is given; or
- meshctl's own self-signed root, made on first start under the state directory and loaded on
  every later one (`self_signed`, kept by `meshctl.security.selfsigned`).

Every certificate it issues has a new ECDSA P-256 key, a random 128-bit serial, an empty subject
with its names in a critical subjectAltName (RFC 5280 4.2.1.6; Istio does the same), the
authorityKeyIdentifier of the CA, and a validity that starts a minute early for clock skew and
never outlasts the CA's own chain. A chain handed out is the leaf, then the signing certificate and
every issuer up to and including the root, as Istio's workload `cert-chain` (for the self-signed
root: the leaf and the root); verifiers ignore the root they already trust.

Issuing costs one key generation and one signature, both in OpenSSL, with everything that
depends only on the CA (issuer name, key identifier, chain PEM) computed once when it is loaded,
so a cold start that needs certificates for a thousand proxies is not held up by them.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshctl.errors import CredentialError
from meshctl.security.cacerts import CLOCK_SKEW, SigningMaterial, load_ca_dir
from meshctl.security.identity import WorkloadIdentity
from meshctl.security.pem import certificates_pem, private_key_pem
from meshctl.security.selfsigned import load_or_create_root

logger = logging.getLogger("meshctl.security")

#: Istio's default workload certificate lifetime.
DEFAULT_LIFETIME = timedelta(hours=24)
#: The share of a certificate's lifetime after which it is renewed (Istio's SECRET_GRACE_PERIOD_RATIO).
RENEW_FRACTION = 2 / 3
#: The shortest workload certificate lifetime `meshctl serve` takes. Certificates are issued on
#: whole seconds (up to one back), renewed at two thirds, by rounds that look once a second: at
#: 3 s one is due a second or more after it was sent and valid for two; below, it can be due (at
#: 1 s, expired) before the round that issued it has sent it, and renewal stops.
MIN_WORKLOAD_LIFETIME = timedelta(seconds=3)
#: A CA this close to its end is warned about (at start, then daily): renewing a plug-in CA is a
#: person's job, a month is the time it takes; past its end it is an error every minute.
EXPIRY_WARNING = timedelta(days=30)

_LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=True,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)
_WORKLOAD_USAGE = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
_CLIENT_USAGE = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
_SERVER_USAGE = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
_NOT_A_CA = x509.BasicConstraints(ca=False, path_length=None)
_EMPTY_NAME = x509.Name([])

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: The keys a signing request may carry that meshctl certifies (what TLS peers accept).
CertificatePublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A certificate the CA issued, with its new key. Neither PEM shows in `repr`, the key
    because it is secret, the chain because it is long."""

    #: The leaf, then the CA's chain up to and including the root (see the module's docstring).
    cert_chain_pem: bytes = field(repr=False)
    #: The leaf's key, unencrypted PKCS#8 PEM.
    private_key_pem: bytes = field(repr=False)
    not_before: datetime
    not_after: datetime
    serial: int
    #: When it was issued: `not_before` is set back a little for clocks behind ours.
    issued_at: datetime

    @property
    def renew_at(self) -> datetime:
        """When to replace it: two thirds into the time it was issued for, as Istio's agent does
        (counted from issuance, not from the back-dated `not_before`, which would make a
        short-lived certificate due at once)."""
        return self.issued_at + (self.not_after - self.issued_at) * RENEW_FRACTION


class CertificateAuthority:
    """Signs certificates with one CA key; build it with `from_ca_dir` or `self_signed`.

    Issuing keeps no state, so one authority can be shared by every thread and task.
    """

    __slots__ = ("_aki", "_chain_pem", "_expires", "_issuer", "_key", "_material", "created", "source")

    def __init__(self, material: SigningMaterial, *, source: str, created: bool = False) -> None:
        #: Where the CA came from, for messages: the plug-in directory or the state directory.
        self.source = source
        #: True when this call made a new self-signed root (a first start).
        self.created = created
        self._material = material
        self._key = material.key
        signing = material.certificate
        self._issuer = signing.subject
        try:
            ski = signing.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            self._aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        except x509.ExtensionNotFound:
            self._aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(material.key.public_key())
        self._chain_pem = certificates_pem(material.chain)
        self._expires = min(c.not_valid_after_utc for c in material.chain)

    @classmethod
    def from_ca_dir(cls, directory: str | os.PathLike[str], *, now: datetime | None = None) -> CertificateAuthority:
        """The plug-in CA of Istio's `cacerts` layout in `directory`; raises CredentialError,
        naming the file, when it cannot be used (`meshctl.security.cacerts`)."""
        path = Path(directory)
        return cls(load_ca_dir(path, _utc(now)), source=f"plug-in CA {path}")

    @classmethod
    def self_signed(
        cls, state_dir: str | os.PathLike[str], trust_domain: str = "cluster.local", *, now: datetime | None = None
    ) -> CertificateAuthority:
        """meshctl's own root under `state_dir/ca/`, made on the first call and loaded on every
        later one (`meshctl.security.selfsigned`); raises CredentialError when the directory
        cannot be written or holds a root that cannot be used."""
        stored = load_or_create_root(Path(state_dir), trust_domain, _utc(now))
        return cls(stored.material, source=f"self-signed root CA {stored.directory}", created=stored.created)

    @property
    def root_pem(self) -> bytes:
        """The trust bundle: every root certificate, PEM, as `root-cert.pem` holds them."""
        return self._material.root_pem

    @property
    def root_fingerprints(self) -> tuple[str, ...]:
        """`sha256:HEX` of each root in the trust bundle, sorted: replicas that sign for one mesh
        must show the same ones (a replica with a root of its own splits the mesh silently)."""
        roots = x509.load_pem_x509_certificates(self.root_pem)
        return tuple(sorted(f"sha256:{r.fingerprint(hashes.SHA256()).hex()}" for r in roots))

    @property
    def chain(self) -> tuple[x509.Certificate, ...]:
        """The signing certificate, then each issuer up to and including its root."""
        return self._material.chain

    @property
    def signing_root_fingerprint(self) -> str:
        """`sha256:HEX` of the root the CA's own chain ends at: the one its certificates need."""
        return f"sha256:{self._material.chain[-1].fingerprint(hashes.SHA256()).hex()}"

    @property
    def certificate(self) -> x509.Certificate:
        """The certificate the CA signs with (the root itself, when self-signed)."""
        return self._material.certificate

    @property
    def not_after(self) -> datetime:
        """When the first certificate of the CA's chain expires: nothing it issues lasts longer."""
        return self._expires

    @property
    def root_not_after(self) -> datetime:
        """When the root of the CA's chain expires (the trust bundle's, as workloads have it)."""
        return self._material.chain[-1].not_valid_after_utc

    def derive_key(self, purpose: bytes) -> bytes:
        """A 32-byte secret for `purpose`, derived from the CA's private key (HKDF-SHA256): every
        server holding this CA derives the same one, and no other secret needs keeping."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        secret = self._key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(secret)

    def describe(self) -> str:
        """Which CA this is, for the start-up log: where, new or found, whose, until when."""
        subject = self._material.certificate.subject.rfc4514_string() or "(no subject)"
        how = "made now" if self.created else "found"
        return f"{self.source} ({how}): {subject}, valid until {self._expires.isoformat()}"

    def expiry_notice(self, now: datetime | None = None) -> tuple[int, str] | None:
        """(log level, message) when the CA is within `EXPIRY_WARNING` of its end or past it, else
        None. The message names the certificate that ends first and what its end means."""
        at = _utc(now)
        ending = min(self._material.chain, key=lambda c: c.not_valid_after_utc)
        what = "root" if ending is self._material.chain[-1] else "CA certificate"
        subject = ending.subject.rfc4514_string() or "(no subject)"
        left = self._expires - at
        if left <= timedelta(0):
            return logging.ERROR, (
                f"{self.source}: the {what} {subject} expired at {self._expires.isoformat()}: no workload "
                "certificate can be issued or renewed, and proxies lose mutual TLS as theirs expire; "
                "replace the CA and restart"
            )
        if left <= EXPIRY_WARNING:
            return logging.WARNING, (
                f"{self.source}: the {what} {subject} expires at {self._expires.isoformat()}, in "
                f"{left.total_seconds() / 86400:.1f} days; workload certificates end with it: "
                "replace the CA before then"
            )
        return None

    def issue_workload(
        self, identity: WorkloadIdentity, lifetime: timedelta = DEFAULT_LIFETIME, now: datetime | None = None
    ) -> IssuedCertificate:
        """A workload's mTLS certificate: its SPIFFE URI, for serving and for calling."""
        return self._issue(
            [x509.UniformResourceIdentifier(identity.uri)], _WORKLOAD_USAGE, lifetime, now, str(identity)
        )

    def issue_client(
        self,
        names: Sequence[str],
        identity: WorkloadIdentity | None = None,
        lifetime: timedelta = DEFAULT_LIFETIME,
        now: datetime | None = None,
    ) -> IssuedCertificate:
        """A VM proxy's xDS client certificate: DNS SANs `NAME.NAMESPACE` (`names`) and, when
        given, the SPIFFE URI of `identity`, the names meshctl serve's identity rule accepts.
        With an identity it is the workload's certificate too (a proxyless gRPC server serves
        the mesh's mutual TLS with it), so it is good for serving as well as calling, as Istio's
        workload certificates are."""
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        if identity is not None:
            sans.append(x509.UniformResourceIdentifier(identity.uri))
        usage = _WORKLOAD_USAGE if identity is not None else _CLIENT_USAGE
        return self._issue(sans, usage, lifetime, now, ", ".join([*names, *([str(identity)] if identity else [])]))

    def sign_client(
        self,
        public_key: CertificatePublicKey,
        dns_names: Sequence[str],
        uris: Sequence[str] = (),
        lifetime: timedelta = DEFAULT_LIFETIME,
        now: datetime | None = None,
    ) -> IssuedCertificate:
        """An xDS client certificate, like `issue_client`, for a key made elsewhere (the public key
        of a signing request): the key never comes here, so `private_key_pem` is empty. With a
        SPIFFE URI it serves too, as `issue_client`'s with an identity."""
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        usage = _WORKLOAD_USAGE if uris else _CLIENT_USAGE
        return self._issue(sans, usage, lifetime, now, ", ".join([*dns_names, *uris]), public_key=public_key)

    def issue_server(
        self,
        dns_names: Iterable[str] = (),
        ip_addresses: Iterable[str | IpAddress] = (),
        lifetime: timedelta = DEFAULT_LIFETIME,
        now: datetime | None = None,
    ) -> IssuedCertificate:
        """The xDS server's serving certificate, for the names and addresses proxies dial.
        An address that is not an IP raises ValueError."""
        dns = list(dns_names)
        ips = [ipaddress.ip_address(a) for a in ip_addresses]
        sans: list[x509.GeneralName] = [*map(x509.DNSName, dns), *map(x509.IPAddress, ips)]
        return self._issue(sans, _SERVER_USAGE, lifetime, now, ", ".join([*dns, *map(str, ips)]))

    def _issue(
        self,
        sans: Sequence[x509.GeneralName],
        usage: x509.ExtendedKeyUsage,
        lifetime: timedelta,
        now: datetime | None,
        what: str,
        *,
        public_key: CertificatePublicKey | None = None,
    ) -> IssuedCertificate:
        """Sign a leaf for `sans`, with a new key unless `public_key` is given. No names or a
        lifetime that is not positive is the caller's mistake (ValueError); a CA that has expired
        is CredentialError."""
        if not sans:
            raise ValueError("a certificate needs at least one name")
        if lifetime <= timedelta(0):
            raise ValueError(f"a certificate lifetime must be positive, not {lifetime}")
        start = _utc(now).replace(microsecond=0)
        if start >= self._expires:
            raise CredentialError(f"{self.source}: expired at {self._expires.isoformat()}, so it cannot issue")
        not_before = start - CLOCK_SKEW
        not_after = min(start + lifetime, self._expires)
        key = ec.generate_private_key(ec.SECP256R1()) if public_key is None else None
        certified = key.public_key() if key is not None else public_key
        assert certified is not None
        serial = secrets.randbits(128) or 1
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_EMPTY_NAME)
            .issuer_name(self._issuer)
            .public_key(certified)
            .serial_number(serial)
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=True)
            .add_extension(_NOT_A_CA, critical=True)
            .add_extension(_LEAF_KEY_USAGE, critical=True)
            .add_extension(usage, critical=False)
            .add_extension(self._aki, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        logger.debug("issued a certificate for %s, serial %x, until %s", what, serial, not_after.isoformat())
        return IssuedCertificate(
            cert_chain_pem=certificates_pem([certificate]) + self._chain_pem,
            private_key_pem=private_key_pem(key) if key is not None else b"",
            not_before=not_before,
            not_after=not_after,
            serial=serial,
            issued_at=start,
        )

    def __repr__(self) -> str:
        subject = self._material.certificate.subject.rfc4514_string()
        return f"CertificateAuthority({self.source!r}, subject={subject!r}, not_after={self._expires.isoformat()})"


def _utc(now: datetime | None) -> datetime:
    """`now`, or the current time; an aware time is required, since certificates are in UTC."""
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime (with a timezone)")
    return now.astimezone(UTC)
