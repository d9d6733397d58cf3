"""PEM files in and out: certificates and private keys, with errors that name the file.

cryptography's own errors say what failed to parse but not which of an operator's files it was,
and a key's could echo what it was given; every error here names the file and says what it
should hold, and none ever quotes a file's contents.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from meshctl.errors import CredentialError
from meshctl.security.files import group_or_world_readable, read_credential

logger = logging.getLogger("meshctl.security")

#: The keys a CA can sign with: ECDSA (what meshctl makes) and RSA (what many plug-in CAs have).
SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def read_file(path: Path) -> bytes:
    """The bytes of `path` (`files.read_credential`: a regular file, bounded); CredentialError
    when it is missing, unreadable or not such a file."""
    try:
        return read_credential(path)
    except FileNotFoundError:
        raise CredentialError(f"{path}: no such file") from None
    except OSError as exc:
        raise CredentialError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def load_certificates(path: Path) -> list[x509.Certificate]:
    """Every certificate of the PEM file `path`, in order; CredentialError when it holds none."""
    return parse_certificates(read_file(path), path)


def parse_certificates(data: bytes, path: Path) -> list[x509.Certificate]:
    """Every certificate of `data`, the contents of `path`; CredentialError when it holds none."""
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CredentialError(f"{path}: not a PEM certificate file (no readable CERTIFICATE block)") from None
    return certificates


def load_private_key(path: Path) -> SigningKey:
    """The unencrypted PEM private key of `path`. The underlying error is dropped on purpose:
    nothing parsed out of a key file may reach a message."""
    data = read_file(path)
    mode = group_or_world_readable(path)
    if mode is not None:
        logger.warning(
            "%s is readable by %s (mode %04o): it is a CA's private key; chmod 600 it",
            path,
            "everyone" if mode & 0o004 else "its group",
            mode,
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CredentialError(f"{path}: the private key is encrypted; meshctl needs it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise CredentialError(f"{path}: not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CredentialError(f"{path}: a {type(key).__name__}; a CA signs with an ECDSA or RSA key")
    return key


def certificates_pem(certificates: Iterable[x509.Certificate]) -> bytes:
    """The certificates as one PEM bundle, in the order given."""
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def private_key_pem(key: SigningKey) -> bytes:
    """`key` as unencrypted PKCS#8 PEM (`BEGIN PRIVATE KEY`), what Envoy and gRPC read."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
