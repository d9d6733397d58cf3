"""The built-in CA: meshctl's own root kept across restarts, a plug-in CA in Istio's cacerts layout,
and the certificates both issue, checked with cryptography's own path verifier.

Plug-in CAs are built here with cryptography (a root and an intermediate, or a broken variant of
one), written in the cacerts layout and loaded the way `meshctl serve --ca-dir` loads them.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from meshctl.errors import CredentialError
from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
REVIEWS = WorkloadIdentity("cluster.local", "bookinfo", "reviews")

Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


# -- building CAs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issuer:
    cert: x509.Certificate
    key: Key


def make_ca_cert(
    name: str,
    parent: Issuer | None = None,
    *,
    ca: bool = True,
    key_cert_sign: bool = True,
    not_before: datetime = NOW - timedelta(days=1),
    not_after: datetime = NOW + timedelta(days=365),
    key: Key | None = None,
) -> Issuer:
    """A CA certificate named `name`, self-signed without `parent`, as an operator's PKI makes them."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = x509.KeyUsage(False, False, False, False, False, key_cert_sign, True, False, False)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(parent.cert.subject if parent else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if parent:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(parent.key.public_key()), critical=False
        )
    return Issuer(builder.sign(parent.key if parent else key, hashes.SHA256()), key)


def pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def key_pem(key: Key, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def write_cacerts(directory: Path, signing: Issuer, root: Issuer, *, roots: bytes | None = None) -> Path:
    """Istio's cacerts layout for `signing` under `root`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca-cert.pem").write_bytes(pem(signing.cert))
    (directory / "ca-key.pem").write_bytes(key_pem(signing.key))
    (directory / "root-cert.pem").write_bytes(roots or pem(root.cert))
    chain = pem(signing.cert) if signing.cert == root.cert else pem(signing.cert, root.cert)
    (directory / "cert-chain.pem").write_bytes(chain)
    return directory


@pytest.fixture(scope="module")
def root() -> Issuer:
    return make_ca_cert("Example Corp root")


@pytest.fixture(scope="module")
def intermediate(root: Issuer) -> Issuer:
    return make_ca_cert("Example Corp mesh intermediate", root)


@pytest.fixture
def cacerts(tmp_path: Path, root: Issuer, intermediate: Issuer) -> Path:
    return write_cacerts(tmp_path / "cacerts", intermediate, root)


# -- checking what is issued --------------------------------------------------------------------


def chain_of(issued: IssuedCertificate) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(issued.cert_chain_pem)


def verify_client(issued: IssuedCertificate, root_pem: bytes, at: datetime = NOW) -> list[x509.GeneralName]:
    """The leaf's SANs once it verifies as a TLS client certificate up to `root_pem`."""
    leaf, *intermediates = chain_of(issued)
    verifier = PolicyBuilder().store(Store(x509.load_pem_x509_certificates(root_pem))).time(at)
    return list(verifier.build_client_verifier().verify(leaf, intermediates).subjects or [])


T = TypeVar("T", bound=x509.ExtensionType)


def extension(cert: x509.Certificate, kind: type[T]) -> x509.Extension[T]:
    return cert.extensions.get_extension_for_class(kind)


# -- identity -----------------------------------------------------------------------------------


def test_identity_is_istios_spiffe_uri() -> None:
    assert REVIEWS.uri == "spiffe://cluster.local/ns/bookinfo/sa/reviews"
    assert WorkloadIdentity.parse(REVIEWS.uri) == REVIEWS


@pytest.mark.parametrize(
    "uri",
    [
        "https://cluster.local/ns/bookinfo/sa/reviews",
        "spiffe://cluster.local/ns/bookinfo",
        "spiffe://cluster.local/ns/bookinfo/sa/reviews/extra",
        "spiffe://cluster.local/namespace/bookinfo/sa/reviews",
        "spiffe://cluster.local/ns//sa/reviews",
        "spiffe:///ns/bookinfo/sa/reviews",
        "spiffe://Cluster.Local/ns/bookinfo/sa/reviews",
        "spiffe://cluster.local/ns/../sa/reviews",
    ],
)
def test_anything_else_is_not_an_identity(uri: str) -> None:
    assert WorkloadIdentity.parse(uri) is None


@pytest.mark.parametrize(("namespace", "account"), [("book/info", "reviews"), ("bookinfo", ""), ("bookinfo", "a b")])
def test_an_identity_cannot_be_made_of_parts_that_change_its_uri(namespace: str, account: str) -> None:
    with pytest.raises(CredentialError, match="SPIFFE"):
        WorkloadIdentity("cluster.local", namespace, account)


# -- the self-signed root -----------------------------------------------------------------------


def test_the_root_survives_a_restart(tmp_path: Path) -> None:
    first = CertificateAuthority.self_signed(tmp_path, "cluster.local", now=NOW)
    assert first.created
    again = CertificateAuthority.self_signed(tmp_path, "cluster.local", now=NOW + timedelta(days=30))
    assert not again.created
    assert again.root_pem == first.root_pem
    later = NOW + timedelta(days=30)
    issued = again.issue_workload(REVIEWS, now=later)
    assert verify_client(issued, first.root_pem, at=later) == [x509.UniformResourceIdentifier(REVIEWS.uri)]


def test_the_root_is_a_ten_year_p256_ca_named_for_the_trust_domain(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, "example.org", now=NOW)
    (root_cert,) = x509.load_pem_x509_certificates(authority.root_pem)
    assert root_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "example.org"
    assert "root CA" in str(root_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
    public_key = root_cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey) and public_key.curve.name == "secp256r1"
    assert extension(root_cert, x509.BasicConstraints).value.ca
    usage = extension(root_cert, x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert extension(root_cert, x509.SubjectKeyIdentifier)
    lifetime = root_cert.not_valid_after_utc - root_cert.not_valid_before_utc
    assert timedelta(days=3649) < lifetime < timedelta(days=3651)


def test_the_key_is_its_owners_alone(tmp_path: Path) -> None:
    CertificateAuthority.self_signed(tmp_path / "state", now=NOW)
    directory = tmp_path / "state" / "ca"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "ca-key.pem").stat().st_mode) == 0o600
    assert (directory / "ca-key.pem").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_threads_starting_at_once_share_one_root(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    roots: list[bytes] = []

    def start() -> None:
        barrier.wait()
        roots.append(CertificateAuthority.self_signed(tmp_path, now=NOW).root_pem)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(roots) == 8 and len(set(roots)) == 1


def test_processes_starting_at_once_share_one_root(tmp_path: Path) -> None:
    script = (
        "import sys; from meshctl.security.ca import CertificateAuthority;"
        "sys.stdout.buffer.write(CertificateAuthority.self_signed(sys.argv[1]).root_pem)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE) for _ in range(4)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(set(outputs)) == 1 and outputs[0].startswith(b"-----BEGIN CERTIFICATE-----")


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("a file")
    with pytest.raises(CredentialError, match=str(not_a_dir)):
        CertificateAuthority.self_signed(not_a_dir)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_a_read_only_state_dir_is_named(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(CredentialError, match=str(tmp_path)):
            CertificateAuthority.self_signed(tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_a_key_without_its_root_is_never_overwritten(tmp_path: Path) -> None:
    """Deleting root-cert.pem and restarting must not make a new root over the key every workload
    trusts: the error says what to restore, and the key is left as it was."""
    CertificateAuthority.self_signed(tmp_path, now=NOW)
    key = (tmp_path / "ca" / "ca-key.pem").read_bytes()
    (tmp_path / "ca" / "root-cert.pem").unlink()
    with pytest.raises(CredentialError, match=r"ca-key\.pem exists but .*root-cert\.pem does not: restore"):
        CertificateAuthority.self_signed(tmp_path, now=NOW)
    assert (tmp_path / "ca" / "ca-key.pem").read_bytes() == key
    assert not (tmp_path / "ca" / "root-cert.pem").exists()


def test_a_root_without_its_key_is_never_replaced_quietly(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    (tmp_path / "ca" / "ca-key.pem").unlink()
    with pytest.raises(CredentialError, match=r"ca-key\.pem: no such file"):
        CertificateAuthority.self_signed(tmp_path, now=NOW)
    assert (tmp_path / "ca" / "root-cert.pem").read_bytes() == authority.root_pem


def test_an_expired_root_is_reported(tmp_path: Path) -> None:
    CertificateAuthority.self_signed(tmp_path, now=NOW)
    with pytest.raises(CredentialError, match=r"root-cert\.pem: the certificate .* expired"):
        CertificateAuthority.self_signed(tmp_path, now=NOW + timedelta(days=3651))


# -- what is issued -----------------------------------------------------------------------------


def test_a_workload_certificate_is_istios(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    issued = authority.issue_workload(REVIEWS, timedelta(hours=24), now=NOW)
    leaf, root_cert = chain_of(issued)
    assert root_cert == authority.certificate
    assert leaf.subject == x509.Name([])
    san = extension(leaf, x509.SubjectAlternativeName)
    assert san.critical and san.value.get_values_for_type(x509.UniformResourceIdentifier) == [REVIEWS.uri]
    usage = extension(leaf, x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    assert list(extension(leaf, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ]
    assert not extension(leaf, x509.BasicConstraints).value.ca
    ski = extension(root_cert, x509.SubjectKeyIdentifier).value.digest
    assert extension(leaf, x509.AuthorityKeyIdentifier).value.key_identifier == ski
    assert isinstance(leaf.signature_hash_algorithm, hashes.SHA256)
    assert 0 < leaf.serial_number < 2**128 and leaf.serial_number == issued.serial
    assert (issued.not_before, issued.not_after) == (NOW - timedelta(minutes=1), NOW + timedelta(hours=24))
    assert (leaf.not_valid_before_utc, leaf.not_valid_after_utc) == (issued.not_before, issued.not_after)
    assert issued.renew_at == NOW + timedelta(hours=16)  # two thirds of the 24 h it was issued for
    key = serialization.load_pem_private_key(issued.private_key_pem, password=None)
    assert issued.private_key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert key.public_key() == leaf.public_key()


def test_every_certificate_has_its_own_key_and_serial(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    issued = [authority.issue_workload(REVIEWS, now=NOW) for _ in range(20)]
    assert len({i.serial for i in issued}) == len({i.private_key_pem for i in issued}) == 20


def test_no_key_in_a_repr(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    issued = authority.issue_workload(REVIEWS, now=NOW)
    for text in (repr(issued), repr(authority)):
        assert "PRIVATE" not in text and "BEGIN" not in text
    assert str(issued.serial) in repr(issued)


def test_a_vm_client_certificate_names_the_proxy_and_its_identity_and_serves_too(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    issued = authority.issue_client(["web.bookinfo"], WorkloadIdentity("cluster.local", "bookinfo", "default"), now=NOW)
    assert verify_client(issued, authority.root_pem) == [
        x509.DNSName("web.bookinfo"),
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/bookinfo/sa/default"),
    ]
    leaf = chain_of(issued)[0]
    # It is the workload's certificate too (a proxyless gRPC server serves with it): serving
    # and calling, as Istio's workload certificates.
    assert list(extension(leaf, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ]


def test_a_client_certificate_without_an_identity_only_calls(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    leaf = chain_of(authority.issue_client(["web.bookinfo"], now=NOW))[0]
    assert list(extension(leaf, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_the_xds_server_certificate_serves_its_names_and_addresses(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    issued = authority.issue_server(["meshctl.example.com"], ["10.10.0.1", "fd00::1"], now=NOW)
    leaf, *rest = chain_of(issued)
    store = Store(x509.load_pem_x509_certificates(authority.root_pem))
    for name in (x509.DNSName("meshctl.example.com"), x509.IPAddress(ipaddress.ip_address("fd00::1"))):
        PolicyBuilder().store(store).time(NOW).build_server_verifier(name).verify(leaf, rest)
    assert list(extension(leaf, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_bad_arguments_are_the_callers_mistake(tmp_path: Path) -> None:
    authority = CertificateAuthority.self_signed(tmp_path, now=NOW)
    with pytest.raises(ValueError, match="positive"):
        authority.issue_workload(REVIEWS, timedelta(0), now=NOW)
    with pytest.raises(ValueError, match="name"):
        authority.issue_server([], [], now=NOW)
    with pytest.raises(ValueError, match="aware"):
        authority.issue_workload(REVIEWS, now=datetime(2026, 3, 1))  # naive


# -- a plug-in CA -------------------------------------------------------------------------------


def test_a_plug_in_ca_issues_certificates_that_chain_to_its_root(
    cacerts: Path, root: Issuer, intermediate: Issuer
) -> None:
    authority = CertificateAuthority.from_ca_dir(cacerts, now=NOW)
    assert authority.root_pem == pem(root.cert)
    issued = authority.issue_workload(REVIEWS, now=NOW)
    assert chain_of(issued)[1:] == [intermediate.cert, root.cert]
    assert verify_client(issued, pem(root.cert)) == [x509.UniformResourceIdentifier(REVIEWS.uri)]
    # By hand too: each signature by the next certificate up.
    leaf = chain_of(issued)[0]
    leaf.verify_directly_issued_by(intermediate.cert)
    intermediate.cert.verify_directly_issued_by(root.cert)


def test_the_trust_bundle_keeps_every_root(tmp_path: Path, root: Issuer, intermediate: Issuer) -> None:
    """During a root rotation root-cert.pem holds the old root and the new one: both are sent."""
    bundle = pem(make_ca_cert("Example Corp old root").cert, root.cert)
    authority = CertificateAuthority.from_ca_dir(write_cacerts(tmp_path, intermediate, root, roots=bundle), now=NOW)
    assert authority.root_pem == bundle
    assert verify_client(authority.issue_workload(REVIEWS, now=NOW), bundle)


def test_an_rsa_root_can_be_the_signing_certificate_itself(tmp_path: Path) -> None:
    rsa_root = make_ca_cert("RSA root", key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
    authority = CertificateAuthority.from_ca_dir(write_cacerts(tmp_path, rsa_root, rsa_root), now=NOW)
    issued = authority.issue_workload(REVIEWS, now=NOW)
    assert chain_of(issued)[1:] == [rsa_root.cert]
    assert verify_client(issued, pem(rsa_root.cert))


def test_no_certificate_outlives_the_ca(tmp_path: Path, root: Issuer) -> None:
    ending = make_ca_cert("short-lived intermediate", root, not_after=NOW + timedelta(hours=2))
    authority = CertificateAuthority.from_ca_dir(write_cacerts(tmp_path, ending, root), now=NOW)
    issued = authority.issue_workload(REVIEWS, timedelta(hours=24), now=NOW)
    assert issued.not_after == ending.cert.not_valid_after_utc == authority.not_after
    assert issued.renew_at == NOW + timedelta(hours=2) * 2 / 3
    with pytest.raises(CredentialError, match="expired"):
        authority.issue_workload(REVIEWS, now=NOW + timedelta(hours=3))


Breakage = Callable[[Path, Issuer, Issuer], None]


def _write(name: str, data: bytes) -> Breakage:
    return lambda directory, root, intermediate: (directory / name).write_bytes(data)


def _replace_signing(
    *,
    ca: bool = True,
    key_cert_sign: bool = True,
    not_before: datetime = NOW - timedelta(days=1),
    not_after: datetime = NOW + timedelta(days=365),
) -> Breakage:
    def breaks(directory: Path, root: Issuer, intermediate: Issuer) -> None:
        broken = make_ca_cert(
            "broken intermediate", root, ca=ca, key_cert_sign=key_cert_sign, not_before=not_before, not_after=not_after
        )
        write_cacerts(directory, broken, root)

    return breaks


def _unchained(directory: Path, root: Issuer, intermediate: Issuer) -> None:
    stranger = make_ca_cert("someone else's root")
    write_cacerts(directory, make_ca_cert("their intermediate", stranger), root)


def _other_key(directory: Path, root: Issuer, intermediate: Issuer) -> None:
    (directory / "ca-key.pem").write_bytes(key_pem(ec.generate_private_key(ec.SECP256R1())))


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda d, r, i: (d / "ca-cert.pem").unlink(), ("ca-cert.pem", "no such file")),
        (lambda d, r, i: (d / "ca-key.pem").unlink(), ("ca-key.pem", "no such file")),
        (lambda d, r, i: (d / "root-cert.pem").unlink(), ("root-cert.pem", "no such file")),
        (lambda d, r, i: (d / "cert-chain.pem").unlink(), ("cert-chain.pem", "no such file")),
        (_write("ca-cert.pem", b"not a certificate\n"), ("ca-cert.pem", "not a PEM certificate")),
        (_write("root-cert.pem", b""), ("root-cert.pem", "not a PEM certificate")),
        (_write("cert-chain.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n"), ("cert-chain.pem", "not a PEM")),
        (
            _write("ca-key.pem", b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"),
            ("ca-key.pem", "not a PEM"),
        ),
        (_other_key, ("ca-key.pem", "is not the private key of")),
        (_replace_signing(ca=False), ("ca-cert.pem", "not a CA")),
        (_replace_signing(key_cert_sign=False), ("ca-cert.pem", "keyCertSign")),
        (_unchained, ("ca-cert.pem", "does not chain to")),
        (_replace_signing(not_after=NOW - timedelta(seconds=1)), ("ca-cert.pem", "expired")),
        (_replace_signing(not_before=NOW + timedelta(days=1)), ("ca-cert.pem", "not valid until")),
    ],
)
def test_a_plug_in_ca_that_cannot_be_used_names_the_file(
    cacerts: Path, root: Issuer, intermediate: Issuer, breakage: Breakage, expected: tuple[str, str]
) -> None:
    file, words = expected
    secret = (cacerts / "ca-key.pem").read_bytes()
    breakage(cacerts, root, intermediate)
    with pytest.raises(CredentialError) as caught:
        CertificateAuthority.from_ca_dir(cacerts, now=NOW)
    message = str(caught.value)
    assert str(cacerts / file) in message and words in message
    assert "PRIVATE KEY" not in message and "c2VjcmV0" not in message
    assert secret.splitlines()[1].decode() not in message


def test_an_encrypted_key_is_named(cacerts: Path, intermediate: Issuer) -> None:
    (cacerts / "ca-key.pem").write_bytes(key_pem(intermediate.key, password=b"hunter2"))
    with pytest.raises(CredentialError, match=r"ca-key\.pem: the private key is encrypted"):
        CertificateAuthority.from_ca_dir(cacerts, now=NOW)


def test_an_expired_root_of_a_plug_in_ca_is_named(tmp_path: Path) -> None:
    old_root = make_ca_cert("old root", not_after=NOW - timedelta(days=1), not_before=NOW - timedelta(days=400))
    intermediate = make_ca_cert("intermediate", old_root)
    with pytest.raises(CredentialError, match=r"root-cert\.pem: the certificate CN=old root expired"):
        CertificateAuthority.from_ca_dir(write_cacerts(tmp_path, intermediate, old_root), now=NOW)
