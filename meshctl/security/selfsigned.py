"""The mesh's own root CA, made on first start and kept in the state directory, as istiod's
self-signed `istio-ca-secret`.

    STATE_DIR/ca/            0700
        root-cert.pem        the root certificate (the trust bundle)
        ca-key.pem           its key, 0600
        .lock                taken while a root is made

Every identity in the mesh hangs off this root, so a restart must find the same one: the first
start makes it, every later one loads it. Making it is guarded by an exclusive lock on `.lock`, so
two processes (or threads) starting at once on an empty directory end with one root: the second
waits, then finds and loads the first one's. The key is written before the certificate, each
whole (`meshctl.security.files`), so `root-cert.pem` existing means the root is complete.

A root that is found but unusable (key missing or not its key, expired) is an error and is never
replaced quietly: every workload trusts it, and a new one would cut them all off at once. Nor is a
key found without its certificate: far more often `root-cert.pem` was deleted or lost in a restore
than a first start crashed between the two writes, and making a new root would overwrite the key
of the one every workload trusts. The operator restores the certificate, or moves the key away to
have a new root made.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from meshctl.errors import CredentialError
from meshctl.security.cacerts import CA_KEY, CLOCK_SKEW, ROOT_CERT, SigningMaterial, check_signing_pair
from meshctl.security.files import PRIVATE_MODE, PUBLIC_MODE, write_atomically
from meshctl.security.pem import certificates_pem, load_private_key, parse_certificates, private_key_pem, read_file

logger = logging.getLogger("meshctl.security")

ROOT_LIFETIME = timedelta(days=3650)
ROOT_COMMON_NAME = "meshctl root CA"
_LOCK = ".lock"


@dataclass(frozen=True, slots=True)
class StoredRoot:
    """The root of a state directory; `created` when this call made it."""

    material: SigningMaterial = field(repr=False)
    directory: Path
    created: bool


def ca_directory(state_dir: Path) -> Path:
    """Where the root of `state_dir` lives."""
    return state_dir / "ca"


def load_or_create_root(state_dir: Path, trust_domain: str, now: datetime) -> StoredRoot:
    """The root of `state_dir`, made first if there is none (see the module's docstring)."""
    directory = ca_directory(state_dir)
    cert_file = directory / ROOT_CERT
    if _exists(cert_file):
        return StoredRoot(_load(directory, now), directory, created=False)
    _make_directory(directory)
    with _locked(directory / _LOCK):
        if _exists(cert_file):  # another process made it while we waited
            return StoredRoot(_load(directory, now), directory, created=False)
        # Under the lock only: outside it, a key may be one another process is making a root for.
        _refuse_lone_key(directory)
        certificate, key = make_root(trust_domain, now)
        try:
            # Never over a key (`replace=False`): the check above and this write are one step.
            write_atomically(directory / CA_KEY, private_key_pem(key), mode=PRIVATE_MODE, replace=False)
            write_atomically(cert_file, certificates_pem([certificate]), mode=PUBLIC_MODE)
        except FileExistsError:
            _refuse_lone_key(directory)
            raise
        except OSError as exc:
            raise CredentialError(f"{directory}: cannot write the new root CA: {exc.strerror or exc}") from None
    logger.info("created a new self-signed root CA in %s (trust domain %s)", directory, trust_domain)
    material = SigningMaterial(certificate, key, (certificate,), certificates_pem([certificate]))
    return StoredRoot(material, directory, created=True)


def make_root(trust_domain: str, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new ECDSA P-256 root valid for ten years, named for the trust domain it was made for."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain),
            x509.NameAttribute(NameOID.COMMON_NAME, ROOT_COMMON_NAME),
        ]
    )
    start = now.replace(microsecond=0) - CLOCK_SKEW
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + ROOT_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def _load(directory: Path, now: datetime) -> SigningMaterial:
    cert_file, key_file = directory / ROOT_CERT, directory / CA_KEY
    if not _exists(key_file):
        raise CredentialError(
            f"{key_file}: no such file, so the root in {cert_file} cannot sign; restore the key, or remove "
            f"{cert_file} to make a new root (which every workload must then be given)"
        )
    root_pem = read_file(cert_file)
    roots = parse_certificates(root_pem, cert_file)
    key = load_private_key(key_file)
    check_signing_pair(roots[0], cert_file, key, key_file, now)
    return SigningMaterial(roots[0], key, (roots[0],), root_pem)


def _refuse_lone_key(directory: Path) -> None:
    """CredentialError when `directory` holds a CA key but no root certificate (see the module's docstring)."""
    key_file, cert_file = directory / CA_KEY, directory / ROOT_CERT
    if os.path.lexists(key_file):
        raise CredentialError(
            f"{key_file} exists but {cert_file} does not: restore {ROOT_CERT} (the root every workload trusts), "
            f"or move {CA_KEY} away to have a new root made (which every workload must then be given)"
        )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:
        raise CredentialError(f"{path}: cannot look for it: {exc.strerror or exc}") from None


def _make_directory(directory: Path) -> None:
    """`directory` with mode 0700: it holds the key everything trusts."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if directory.stat().st_mode & 0o077:
            directory.chmod(0o700)
    except OSError as exc:
        raise CredentialError(
            f"{directory}: cannot make the CA's state directory there: {exc.strerror or exc}"
        ) from None


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError as exc:
        raise CredentialError(f"{lock_file.parent}: not writable: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def throwaway_certificate(
    common_name: str, *, ca: bool = False, lifetime: timedelta = timedelta(days=1)
) -> tuple[str, str]:
    """A self-signed certificate for `common_name` and its key, as PEM text, kept nowhere: for
    what needs some certificate and trusts none (`validate --envoy` standing in for secrets that
    live on the VMs, test apps terminating their own TLS). `ca` makes it a CA certificate, so it
    can also stand as a trust bundle."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
    )
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    cert = builder.sign(key, hashes.SHA256())
    return certificates_pem([cert]).decode(), private_key_pem(key).decode()
