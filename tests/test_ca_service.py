"""The CA service's rule: what a client certificate proves is what gets signed, and nothing else.

The servicer's `sign` runs with the mesh's real CA and a snapshot of real config; the caller is
described as gRPC describes a verified peer (its PEM leaf and the SANs gRPC core reads from it).
Over gRPC, with a real Envoy, the service is exercised by tests/test_ca_renewal_envoy.py.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from meshctl.api.security.v1alpha1 import ca_pb2
from meshctl.cli.app import app
from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.ca_service import CertificateService, Refusal
from meshctl.testing.builders import snapshot_from_yaml

MESH = """
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client, namespace: shop}
spec: {address: 10.0.0.9, serviceAccount: client}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: cart, namespace: shop}
spec: {address: 10.0.0.8, serviceAccount: cart}
"""
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.self_signed(tmp_path_factory.mktemp("state"))


@pytest.fixture
def service(ca: CertificateAuthority, tmp_path: Path) -> CertificateService:
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(ca.root_pem)
    snapshot = snapshot_from_yaml(MESH)
    return CertificateService(ca, lambda: snapshot, HOUR, client_ca)


def client_cert(ca: CertificateAuthority, dns: list[str], account: str | None = "client") -> IssuedCertificate:
    identity = WorkloadIdentity("cluster.local", "shop", account) if account else None
    return ca.issue_client(dns, identity, datetime.timedelta(minutes=20))


def auth_of(issued: IssuedCertificate) -> dict[str, list[bytes]]:
    """What gRPC's auth context holds for a peer that presented `issued`."""
    leaf = x509.load_pem_x509_certificates(issued.cert_chain_pem)[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {
        "x509_pem_cert": [leaf.public_bytes(serialization.Encoding.PEM)],
        "peer_dns": [n.encode() for n in sans.get_values_for_type(x509.DNSName)],
        "peer_uri": [u.encode() for u in sans.get_values_for_type(x509.UniformResourceIdentifier)],
    }


def csr(
    *names: x509.GeneralName, validity: int = 0
) -> tuple[ca_pb2.IstioCertificateRequest, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()
    return ca_pb2.IstioCertificateRequest(csr=pem, validity_duration=validity), key


def signed_leaf(response: ca_pb2.IstioCertificateResponse) -> x509.Certificate:
    return x509.load_pem_x509_certificate(response.cert_chain[0].encode())


def sans(cert: x509.Certificate) -> list[str]:
    return [str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]


def refusal(
    service: CertificateService, request: ca_pb2.IstioCertificateRequest, auth: object, **kw: object
) -> Refusal:
    with pytest.raises(Refusal) as caught:
        service.sign(request, auth, **kw)  # type: ignore[arg-type]
    return caught.value


def test_the_proven_names_are_signed_for_the_requests_key(
    service: CertificateService, ca: CertificateAuthority
) -> None:
    current = client_cert(ca, ["client.shop"])
    request, key = csr(x509.DNSName("client.shop"))
    response = service.sign(request, auth_of(current))
    leaf = signed_leaf(response)
    assert sans(leaf) == ["client.shop", "spiffe://cluster.local/ns/shop/sa/client"]
    assert leaf.public_key() == key.public_key()
    # The chain up to the root, one certificate an entry, as Istio answers.
    assert response.cert_chain[-1].encode() == ca.root_pem
    # The server's lifetime (an hour): a longer one asked for is cut, a shorter one granted.
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == HOUR + datetime.timedelta(minutes=1)
    longer = signed_leaf(service.sign(csr(validity=10 * 3600)[0], auth_of(current)))
    assert longer.not_valid_after_utc - longer.not_valid_before_utc == HOUR + datetime.timedelta(minutes=1)
    shorter = signed_leaf(service.sign(csr(validity=60)[0], auth_of(current)))
    assert shorter.not_valid_after_utc - shorter.not_valid_before_utc == datetime.timedelta(minutes=2)


def test_names_the_rule_does_not_accept_are_dropped(service: CertificateService, ca: CertificateAuthority) -> None:
    """A URI SAN of another account proves nothing about the workload: it is not carried over."""
    current = client_cert(ca, ["client.shop"], account="cart")
    assert sans(signed_leaf(service.sign(csr()[0], auth_of(current)))) == ["client.shop"]


def test_a_request_for_another_name_is_refused(service: CertificateService, ca: CertificateAuthority) -> None:
    current = client_cert(ca, ["client.shop"])
    for name in (x509.DNSName("cart.shop"), x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop/sa/cart")):
        refused = refusal(service, csr(x509.DNSName("client.shop"), name)[0], auth_of(current))
        assert refused.code is grpc.StatusCode.PERMISSION_DENIED
        assert str(name.value) in str(refused)


@pytest.mark.parametrize(
    ("dns", "account", "words"),
    [
        (["ghost.shop"], "client", "no WorkloadEntry ghost in namespace shop"),
        ([], "client", "names no workload"),
        (["client.shop", "cart.shop"], "client", "names 2"),
    ],
)
def test_a_certificate_must_prove_one_workload_of_the_mesh(
    service: CertificateService, ca: CertificateAuthority, dns: list[str], account: str, words: str
) -> None:
    refused = refusal(service, csr()[0], auth_of(client_cert(ca, dns, account)))
    assert refused.code is grpc.StatusCode.PERMISSION_DENIED
    assert words in str(refused)


def test_no_certificate_or_an_expired_one_renews_nothing(service: CertificateService, ca: CertificateAuthority) -> None:
    request = csr()[0]
    assert refusal(service, request, {}).code is grpc.StatusCode.UNAUTHENTICATED
    current = client_cert(ca, ["client.shop"])
    later = current.not_after + datetime.timedelta(seconds=1)
    refused = refusal(service, request, auth_of(current), now=later)
    assert refused.code is grpc.StatusCode.UNAUTHENTICATED and "not valid now" in str(refused)


def test_a_port_that_does_not_trust_the_mesh_ca_renews_nothing(
    ca: CertificateAuthority, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = CertificateAuthority.self_signed(tmp_path_factory.mktemp("other"))
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(other.root_pem)
    snapshot = snapshot_from_yaml(MESH)
    service = CertificateService(ca, lambda: snapshot, HOUR, client_ca)
    refused = refusal(service, csr()[0], auth_of(client_cert(ca, ["client.shop"])))
    assert refused.code is grpc.StatusCode.FAILED_PRECONDITION and "not trusted by --client-ca" in str(refused)


def test_a_request_that_is_not_a_signing_request_is_refused(
    service: CertificateService, ca: CertificateAuthority
) -> None:
    auth = auth_of(client_cert(ca, ["client.shop"]))
    for text in ("", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"):
        refused = refusal(service, ca_pb2.IstioCertificateRequest(csr=text), auth)
        assert refused.code is grpc.StatusCode.INVALID_ARGUMENT


# -- meshctl ca renew, where it cannot renew ----------------------------------------------------


def test_renew_says_in_one_line_why_it_cannot(tmp_path: Path, ca: CertificateAuthority) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["ca", "renew", "--server", "127.0.0.1:1", "--dir", str(tmp_path / "none")])
    assert missing.exit_code == 2
    assert missing.output.count("\n") == 1 and "cert-chain.pem" in missing.output
    issued = runner.invoke(
        app,
        ["ca", "issue", "--proxy", "client.shop", "--out", str(tmp_path / "vm"), "--state-dir", str(tmp_path / "s")],
    )
    assert issued.exit_code == 0, issued.output
    # Not due (a 30-day certificate just made): nothing is done, whatever the server.
    before = (tmp_path / "vm" / "cert-chain.pem").read_bytes()
    not_due = runner.invoke(app, ["ca", "renew", "--server", "127.0.0.1:1", "--dir", str(tmp_path / "vm")])
    assert not_due.exit_code == 0 and "is not due" in not_due.output
    # Forced, with no server there: one line, exit 2, the files untouched.
    forced = runner.invoke(app, ["ca", "renew", "--server", "127.0.0.1:1", "--dir", str(tmp_path / "vm"), "--force"])
    assert forced.exit_code == 2, forced.output
    assert forced.output.count("\n") == 1 and "127.0.0.1:1" in forced.output
    assert (tmp_path / "vm" / "cert-chain.pem").read_bytes() == before


# -- meshctl bootstrap --xds-cert-dir -------------------------------------------------------------


def test_bootstrap_reads_the_certificate_directory_through_sds(tmp_path: Path) -> None:
    import json

    runner = CliRunner()
    vm = tmp_path / "vm"
    base = ["bootstrap", "--proxy", "client.shop", "--ip", "10.0.0.9", "--xds-address", "10.0.0.1:15010", "-o", "json"]
    both = runner.invoke(app, [*base, "--xds-cert-dir", str(vm), "--xds-cert", "c.pem", "--xds-key", "k.pem"])
    assert both.exit_code == 2 and "--xds-cert-dir" in both.output
    vm.mkdir()
    made = runner.invoke(app, [*base, "--xds-cert-dir", str(vm)])
    assert made.exit_code == 0, made.output
    cluster = json.loads(made.stdout)["static_resources"]["clusters"][0]
    common = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    assert "tls_certificates" not in common
    [sds] = common["tls_certificate_sds_secret_configs"]
    source = sds["sds_config"]["path_config_source"]
    assert source == {
        "path": str(vm.absolute() / "sds" / "xds-client-cert.yaml"),
        "watched_directory": {"path": str(vm.absolute() / "sds")},
    }
    assert common["validation_context"]["trusted_ca"]["filename"] == str(vm.absolute() / "root-cert.pem")
    # The SDS file it names was written, naming the pair in the directory.
    secret = json.loads((vm / "sds" / "xds-client-cert.yaml").read_text())["resources"][0]
    assert secret["name"] == sds["name"]
    assert secret["tls_certificate"]["private_key"] == {"filename": str(vm.absolute() / "key.pem")}
