"""Kubernetes-style TLS secrets kept in a directory (`serve --credentials-dir`), as Istio names them.

An Istio Gateway names its certificate by `credentialName`: a Kubernetes secret that istiod reads
and streams to the gateway over SDS. meshctl keeps such secrets as files, laid out as Kubernetes
mounts them: `DIR/NAMESPACE/NAME/` holding

- `tls.crt`, `tls.key` and optionally `ca.crt` (a `kubernetes.io/tls` secret), or
- `cert`, `key` and optionally `cacert` (Istio's generic secret form);
- a secret `NAME-cacert` holding only `ca.crt` (or `cacert`): the trust bundle of `NAME`, which
  then wins over `NAME`'s own `ca.crt` (Istio's rule).

Istio's SDS names, used by the config that refers to them and by the server that serves them:
`kubernetes://NAME` is the certificate and key, `kubernetes://NAME-cacert` the trust bundle that
verifies clients (MUTUAL) or servers (a DestinationRule's client `credentialName`); a Gateway API
listener's certificateRef is `kubernetes-gateway://NAMESPACE/NAME`. A proxy is served only the
secrets of its own namespace.

Everything here reads files under the config directory's rules (`meshctl.security.files`) and
checks what it read: a key that does not parse, or does not match its certificate, is an error
naming the file, and the secret keeps the contents last read well (see `server/credentials.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshctl.errors import CredentialError
from meshctl.security.files import read_credential

#: Istio's prefix for secrets read from Kubernetes (`credentials.KubernetesSecretTypeURI`).
KUBERNETES: Final = "kubernetes://"
#: Istio's prefix for the secrets of Gateway API listeners (`credentials.KubernetesGatewaySecretType`).
GATEWAY_SECRETS: Final = "kubernetes-gateway://"
#: The suffix of a trust bundle's secret name (`credentials.SdsCaSuffix`).
CA_SUFFIX: Final = "-cacert"
#: File names of a secret, by role, in the order looked for: Kubernetes' TLS secret, then Istio's generic one.
CERT_FILES: Final = ("tls.crt", "cert")
KEY_FILES: Final = ("tls.key", "key")
CA_FILES: Final = ("ca.crt", "cacert")
#: Secrets read per namespace at most: a directory is untrusted input like a config tree.
MAX_SECRETS: Final = 10_000


def certificate_resource(name: str) -> str:
    """The SDS name of the certificate and key of secret `name`; a name that is an SDS name
    already (`kubernetes-gateway://NAMESPACE/NAME`, a Gateway API listener's) is kept."""
    return name if "://" in name else KUBERNETES + name


def ca_resource(name: str) -> str:
    """The SDS name of the trust bundle that goes with secret `name` (itself named `name` or
    `name-cacert`)."""
    name = certificate_resource(name)
    return name if name.endswith(CA_SUFFIX) else name + CA_SUFFIX


def gateway_resource(namespace: str, name: str) -> str:
    """The SDS name Istio gives secret `name` of `namespace` when a Gateway API listener's
    certificateRefs name it."""
    return f"{GATEWAY_SECRETS}{namespace}/{name}"


def parse_gateway_resource(name: str) -> tuple[str, str] | None:
    """(namespace, secret) of a `kubernetes-gateway://NAMESPACE/NAME` name, None for another."""
    if not name.startswith(GATEWAY_SECRETS):
        return None
    namespace, slash, secret = name[len(GATEWAY_SECRETS) :].partition("/")
    return (namespace, secret) if slash and namespace and secret else None


@dataclass(frozen=True, slots=True)
class KubeSecret:
    """What one secret directory holds (any part may be missing)."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None


def _first(directory: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        path = directory / name
        if os.path.exists(path):
            return path
    return None


def read_secret(directory: Path) -> KubeSecret:
    """Read and check the secret in `directory`. Raises CredentialError naming the file for a
    certificate or key that cannot be used (unreadable, not PEM, a key without its certificate
    or not matching it)."""
    cert_path, key_path, ca_path = (_first(directory, n) for n in (CERT_FILES, KEY_FILES, CA_FILES))
    cert = _read(cert_path) if cert_path is not None else None
    key = _read(key_path) if key_path is not None else None
    ca = _read(ca_path) if ca_path is not None else None
    if (cert is None) != (key is None):
        missing = (directory / KEY_FILES[0]) if key is None else (directory / CERT_FILES[0])
        raise CredentialError(
            f"{missing}: missing (a secret with a certificate needs its key, and the other way round)"
        )
    if cert is not None and key is not None:
        assert cert_path is not None and key_path is not None
        check_pair(cert, cert_path, key, key_path)
    if ca is not None:
        assert ca_path is not None
        _certificates(ca, ca_path)
    if cert is None and ca is None:
        raise CredentialError(f"{directory}: holds none of {', '.join(CERT_FILES + CA_FILES)}")
    return KubeSecret(cert, key, ca)


def _read(path: Path) -> bytes:
    try:
        return read_credential(path)
    except OSError as exc:
        raise CredentialError(f"{path}: {exc.strerror or exc}") from None


def _certificates(data: bytes, path: Path) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CredentialError(f"{path}: not a PEM certificate") from None
    return certificates


def check_pair(cert: bytes, cert_path: Path, key: bytes, key_path: Path) -> None:
    """Raise CredentialError unless `key` is a private key of the first certificate in `cert`."""
    leaf = _certificates(cert, cert_path)[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise CredentialError(f"{key_path}: not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.DER, public) != leaf.public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise CredentialError(f"{key_path}: does not match the certificate in {cert_path}")


def secret_names(namespace_dir: Path) -> list[str]:
    """The secret directories of one namespace, sorted (hidden names, such as a Kubernetes
    volume's `..data`, are not secrets)."""
    try:
        entries = sorted(e.name for e in os.scandir(namespace_dir) if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []
    return entries[:MAX_SECRETS]


def namespaces(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []


def find_secret(root: Path, namespace: str, name: str) -> tuple[Path, KubeSecret | None, str | None]:
    """The directory of secret `namespace/name` under `root`, what it holds, and why it cannot be
    used (None when it can). A name that is not one path component (`a/b`, `..`) leads nowhere:
    config never names files outside the directory."""
    directory = root / namespace / name
    if any(part in ("", ".", "..") or "/" in part or "\0" in part for part in (namespace, name)):
        return directory, None, f"{name!r}: not a secret name (one path component, as Kubernetes names are)"
    if not directory.is_dir():
        return directory, None, f"{directory}: no such secret directory"
    try:
        return directory, read_secret(directory), None
    except CredentialError as exc:
        return directory, None, str(exc)
