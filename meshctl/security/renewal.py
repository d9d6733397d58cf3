"""Renewing a VM's xDS client certificate from the VM: `meshctl ca renew`.

The directory is the one `meshctl ca issue --proxy` writes (`cert-chain.pem`, `key.pem`,
`root-cert.pem`). A renewal makes a new key here, sends a signing request for the names of the
current certificate to meshctl's certificate service (Istio's `CreateCertificate`, on the xDS
port), over TLS that presents the current certificate and trusts `root-cert.pem`, and replaces
the files with what comes back: the key never leaves the VM, and the server signs only the names
the current certificate proves (`meshctl.server.ca_service`).

It is due at two thirds of the certificate's validity, as Istio's agents renew theirs; a timer
may run it as often as it likes, and before that point it does nothing. The new key is written
before the new certificate, each file whole under its name (`write_atomically`); a reader that
looks in between sees a certificate and a key that do not match, which TLS refuses to load, so
it keeps what it had. Envoy does not look then: it reads the pair through SDS when a file is
moved into `SDS_DIR`, and the SDS file is written there last, once both are in place
(`meshctl.bootstrap`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from meshctl.api.security.v1alpha1 import ca_pb2
from meshctl.errors import CredentialError
from meshctl.security.ca import RENEW_FRACTION
from meshctl.security.files import PRIVATE_MODE, PUBLIC_MODE, read_credential, write_atomically
from meshctl.security.pem import private_key_pem

CERT_FILE: Final = "cert-chain.pem"
KEY_FILE: Final = "key.pem"
ROOT_FILE: Final = "root-cert.pem"
#: The SDS file naming the pair, which Envoy reads it through (`meshctl.bootstrap`). It has a
#: directory of its own, the one Envoy watches: a move into it is the one signal to read the
#: pair again, given once both files are in place.
SDS_DIR: Final = "sds"
SDS_FILE: Final = f"{SDS_DIR}/xds-client-cert.yaml"
METHOD: Final = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
#: A key its group may read (`--group`): Envoy's, which runs as another user.
GROUP_MODE: Final = 0o640
#: How long a renewal waits for the server: a signature takes milliseconds, a connection seconds.
TIMEOUT: Final = 30.0


@dataclass(frozen=True, slots=True)
class CurrentCertificate:
    """The leaf of `cert-chain.pem`: its names and when it is due."""

    certificate: x509.Certificate

    @property
    def not_before(self) -> datetime.datetime:
        return self.certificate.not_valid_before_utc

    @property
    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc

    #: When the file was written (its mtime): close to when the certificate was issued.
    written: datetime.datetime | None = None

    @property
    def due_at(self) -> datetime.datetime:
        """Two thirds into the time it was issued for (`RENEW_FRACTION`), counted from when its
        file was written where that is later than its start: CAs set `notBefore` back for clocks
        behind theirs (meshctl's by a minute), which would make a short-lived certificate due at
        once. A file copied later (an mtime not kept) is due later, still before its end."""
        start = max(self.not_before, min(self.written or self.not_before, self.not_after))
        return start + (self.not_after - start) * RENEW_FRACTION

    def names(self) -> list[x509.GeneralName]:
        try:
            sans = self.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return []
        return [n for n in sans if isinstance(n, x509.DNSName | x509.UniformResourceIdentifier)]

    def describe(self) -> str:
        return ", ".join(str(n.value) for n in self.names()) or "no names"


def read_current(directory: Path) -> CurrentCertificate:
    """The certificate in `directory`; raises CredentialError naming the file."""
    path = directory / CERT_FILE
    try:
        certificate = x509.load_pem_x509_certificate(read_credential(path))
        written = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
        return CurrentCertificate(certificate, written)
    except OSError as exc:
        raise CredentialError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise CredentialError(f"{path}: not a PEM certificate") from None


@dataclass(frozen=True, slots=True)
class Renewed:
    not_after: datetime.datetime
    names: str


def renew(
    directory: Path,
    server: str,
    *,
    server_name: str | None = None,
    sds_file: Callable[[Path], bytes] | None = None,
    group: int | None = None,
    now: datetime.datetime | None = None,
) -> Renewed:
    """Renew the certificate in `directory` from `server` (HOST:PORT), whatever its age; raises
    CredentialError. `sds_file` gives the SDS file to write again once the pair is in place;
    with `group` (a gid) the key is readable by that group (Envoy's, under systemd)."""
    at = now or datetime.datetime.now(datetime.UTC)
    current = read_current(directory)
    if at >= current.not_after:
        raise CredentialError(
            f"{directory / CERT_FILE} expired at {current.not_after.isoformat()}: an expired certificate cannot "
            "renew itself; issue a new one (meshctl ca issue --proxy, or meshctl ca token)"
        )
    names = current.names()
    if not names:
        raise CredentialError(f"{directory / CERT_FILE} has no DNS or URI name to renew")
    try:
        chain, key_pem, root = (read_credential(directory / f) for f in (CERT_FILE, KEY_FILE, ROOT_FILE))
    except OSError as exc:
        raise CredentialError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key_pem, certificate_chain=chain)
    return _obtain(directory, server, credentials, names, server_name=server_name, sds_file=sds_file, group=group)


def join(
    directory: Path,
    server: str,
    token: str,
    root_pem: bytes,
    workload: str,
    *,
    server_name: str | None = None,
    sds_file: Callable[[Path], bytes] | None = None,
    group: int | None = None,
) -> Renewed:
    """The first certificate of `workload` (NAME.NAMESPACE) for a join token, from `server`'s join
    port, trusting `root_pem` for the server; the files are made in `directory` (the root too)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=root_pem)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise CredentialError(f"{directory}: cannot make the directory: {exc.strerror or exc}") from None
    names: list[x509.GeneralName] = [x509.DNSName(workload)]
    metadata = (("authorization", f"Bearer {token.strip()}"),)
    extra = [(ROOT_FILE, root_pem, PUBLIC_MODE)]
    return _obtain(
        directory, server, credentials, names, server_name=server_name, sds_file=sds_file, group=group,
        metadata=metadata, extra=extra,
    )  # fmt: skip


def token_workload(token: str) -> str:
    """The workload a join token names (its payload is not secret: the server checks the MAC)."""
    import base64
    import json

    parts = token.strip().split(".")
    try:
        if len(parts) != 3:
            raise ValueError
        workload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))["workload"]
    except (ValueError, KeyError, TypeError):
        raise CredentialError("not a meshctl join token (meshctl ca token makes them)") from None
    return str(workload)


def _obtain(
    directory: Path,
    server: str,
    credentials: grpc.ChannelCredentials,
    names: list[x509.GeneralName],
    *,
    server_name: str | None,
    sds_file: Callable[[Path], bytes] | None,
    group: int | None,
    metadata: tuple[tuple[str, str], ...] = (),
    extra: list[tuple[str, bytes, int]] | None = None,
) -> Renewed:
    """A new key, a signing request for `names`, the call, and the files written: the key first,
    then the certificate (then `extra`), then the SDS file (the module's docstring)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshctl")]))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    request = ca_pb2.IstioCertificateRequest(csr=csr.public_bytes(serialization.Encoding.PEM).decode("ascii"))
    response = call(server, credentials, request, server_name, metadata)
    issued = _check_response(response, key)
    writes = [(KEY_FILE, private_key_pem(key), PRIVATE_MODE if group is None else GROUP_MODE)]
    writes.append((CERT_FILE, "".join(response.cert_chain).encode("ascii"), PUBLIC_MODE))
    writes += extra or []
    if sds_file is not None:
        writes.append((SDS_FILE, sds_file(directory), PUBLIC_MODE))
    for name, data, mode in writes:
        try:
            (directory / name).parent.mkdir(mode=0o755, exist_ok=True)
            write_atomically(directory / name, data, mode=mode, group=group if name == KEY_FILE else None)
        except OSError as exc:
            raise CredentialError(f"cannot write {directory / name}: {exc.strerror or exc}") from None
    return Renewed(issued.not_valid_after_utc, CurrentCertificate(issued).describe())


def call(
    server: str,
    credentials: grpc.ChannelCredentials,
    request: ca_pb2.IstioCertificateRequest,
    server_name: str | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> ca_pb2.IstioCertificateResponse:
    """One `CreateCertificate` call to `server`; raises CredentialError with the server's reason."""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    with grpc.secure_channel(server, credentials, options=options) as channel:
        method = channel.unary_unary(
            METHOD,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        try:
            response: ca_pb2.IstioCertificateResponse = method(
                request, timeout=TIMEOUT, wait_for_ready=False, metadata=metadata or None
            )
        except grpc.RpcError as exc:
            # What a failed call raises is also a grpc.Call (grpc-stubs type it apart).
            text = str(exc)
            code, details = getattr(exc, "code", lambda: None)(), getattr(exc, "details", lambda: text)()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise CredentialError(f"cannot renew from {server}: {details}") from None
            name = code.name if isinstance(code, grpc.StatusCode) else "ERROR"
            raise CredentialError(f"{server} refused the renewal ({name}): {details}") from None
    return response


def _check_response(response: ca_pb2.IstioCertificateResponse, key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    """The leaf of the answer, which must certify `key`; raises CredentialError."""
    if not response.cert_chain:
        raise CredentialError("the server answered no certificate")
    try:
        leaf = x509.load_pem_x509_certificates("".join(response.cert_chain).encode("ascii"))[0]
    except ValueError:
        raise CredentialError("the server answered something that is not a PEM certificate chain") from None
    ours = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if ours != theirs:
        raise CredentialError("the server's certificate is not for the key made for it")
    return leaf
