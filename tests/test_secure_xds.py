"""xDS over TLS: server credentials, the proxy identity rule, Envoy's side of the bootstrap.

Certificates are made per test module with the `openssl` CLI (a CA, the server with a DNS and an
IP SAN, proxies with SPIFFE URI or DNS SANs, and a second CA nobody trusts). The rule itself is
tested as a pure function; the real server then runs in-process on loopback with in-process ADS
clients over secure channels, and finally a real Envoy started from `meshctl bootstrap` connects
to a `meshctl serve` process with every TLS flag set.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import PRODUCTPAGE, REVIEWS_V1, envoy_log_left_open, examples_copy, needs_envoy, ratings_mesh
from typer.testing import CliRunner

from meshctl.bootstrap import BootstrapOptions, XdsClientTls, build_bootstrap
from meshctl.cli.app import app
from meshctl.errors import CredentialError
from meshctl.server.app import Server
from meshctl.server.auth import (
    PeerIdentity,
    SpiffeId,
    XdsTls,
    authorize_node,
    check_identity,
    parse_spiffe_id,
    workload_service_account,
)
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port, validate_config
from meshctl.testing.serve_process import ServeProcess
from meshctl.testing.server import run, serving
from meshctl.xds import types

#: A VM in bookinfo that the mesh does not know: no WorkloadEntry, no endpoint at its IP.
ADHOC = "sidecar~10.10.9.9~adhoc.bookinfo~bookinfo.svc.cluster.local"
#: A workload that does not exist, claiming reviews' IP.
GHOST = "sidecar~10.10.0.41~ghost.bookinfo~bookinfo.svc.cluster.local"

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates")


# -- certificates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> KeyPair:
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", pair.key, "-out", pair.cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def issue(ca: KeyPair, directory: Path, name: str, sans: str) -> KeyPair:
    """A leaf certificate for both TLS server and client use, with `sans` as openssl writes them
    (`URI:spiffe://...,DNS:name,IP:127.0.0.1`)."""
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(
        f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", pair.key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-out", pair.cert, "-days", "2",
        "-set_serial", str(secrets.randbits(63)), "-extfile", ext,
    )  # fmt: skip
    return pair


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: KeyPair
    server: KeyPair
    #: spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews: reviews' identity (its WorkloadEntry's SA).
    reviews_spiffe: KeyPair
    #: DNS:reviews-v1-vm.bookinfo, the node id's NAME.NAMESPACE.
    reviews_dns: KeyPair
    #: spiffe://cluster.local/ns/other/sa/bookinfo-reviews: right service account, wrong namespace.
    other_namespace: KeyPair
    #: A client certificate from a CA the server does not trust.
    foreign: KeyPair
    foreign_ca: KeyPair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make certificates")
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "mesh-ca")
    foreign_ca = make_ca(d, "foreign-ca")
    return Pki(
        dir=d,
        ca=ca,
        server=issue(ca, d, "server", "DNS:meshctl.test,IP:127.0.0.1"),
        reviews_spiffe=issue(ca, d, "reviews-spiffe", "URI:spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"),
        reviews_dns=issue(ca, d, "reviews-dns", "DNS:reviews-v1-vm.bookinfo"),
        other_namespace=issue(ca, d, "other-ns", "URI:spiffe://cluster.local/ns/other/sa/bookinfo-reviews"),
        foreign=issue(foreign_ca, d, "foreign", "DNS:reviews-v1-vm.bookinfo"),
        foreign_ca=foreign_ca,
    )


# -- the identity rule, as a pure function ------------------------------------------------------


def test_spiffe_ids_parse_only_in_istios_shape() -> None:
    assert parse_spiffe_id("spiffe://cluster.local/ns/bookinfo/sa/reviews") == SpiffeId(
        "cluster.local", "bookinfo", "reviews"
    )
    for uri in (
        "spiffe://cluster.local/ns/bookinfo",
        "spiffe://cluster.local/ns/bookinfo/sa/reviews/extra",
        "spiffe://cluster.local/sa/reviews/ns/bookinfo",
        "spiffe://cluster.local/ns//sa/reviews",
        "https://cluster.local/ns/bookinfo/sa/reviews",
    ):
        assert parse_spiffe_id(uri) is None, uri


def peer(*sans: str) -> PeerIdentity:
    uris = tuple(s.removeprefix("URI:") for s in sans if s.startswith("URI:"))
    dns = tuple(s.removeprefix("DNS:") for s in sans if s.startswith("DNS:"))
    return PeerIdentity(uris, dns, has_certificate=True)


@pytest.mark.parametrize(
    ("sans", "account", "allowed"),
    [
        (["URI:spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"], "bookinfo-reviews", True),
        # The trust domain is the CA's business, as in istiod.
        (["URI:spiffe://example.org/ns/bookinfo/sa/bookinfo-reviews"], "bookinfo-reviews", True),
        # A workload without a service account runs as `default`: the certificate must say so.
        (["URI:spiffe://cluster.local/ns/bookinfo/sa/default"], "default", True),
        (["URI:spiffe://cluster.local/ns/bookinfo/sa/anything"], "default", False),
        # No one account (endpoints that disagree): no URI SAN proves it.
        (["URI:spiffe://cluster.local/ns/bookinfo/sa/anything"], "", False),
        (["URI:spiffe://cluster.local/ns/bookinfo/sa/bookinfo-ratings"], "bookinfo-reviews", False),
        (["URI:spiffe://cluster.local/ns/other/sa/bookinfo-reviews"], "bookinfo-reviews", False),
        (["URI:spiffe://cluster.local/ns/other/sa/x"], "x", False),
        (["DNS:reviews-v1-vm.bookinfo"], "bookinfo-reviews", True),
        (["DNS:Reviews-V1-VM.Bookinfo"], "default", True),
        (["DNS:reviews-v2-vm.bookinfo"], "default", False),
        (["DNS:*.bookinfo"], "default", False),
        (["DNS:reviews-v1-vm.other"], "default", False),
        # A DNS SAN spelling the SPIFFE id is still a DNS SAN, and a URI SAN is no DNS name.
        (["DNS:spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"], "bookinfo-reviews", False),
        (["URI:reviews-v1-vm.bookinfo"], "default", False),
        # Any one matching SAN is enough.
        (["URI:spiffe://cluster.local/ns/other/sa/x", "DNS:reviews-v1-vm.bookinfo"], "x", True),
        ([], "default", False),
    ],
)
def test_the_certificate_must_name_the_nodes_workload(sans: list[str], account: str, allowed: bool) -> None:
    refusal = check_identity(parse_node_id(REVIEWS_V1), peer(*sans), account)
    assert (refusal is None) is allowed, refusal
    if not allowed:
        assert refusal is not None
        assert "reviews-v1-vm.bookinfo" in refusal


def test_the_namespace_checked_is_the_one_config_is_served_for() -> None:
    """NAMESPACE in node metadata wins over the id for config, so it is what must be certified."""
    node = parse_node_id(REVIEWS_V1, {"NAMESPACE": "payments"})
    sa = "bookinfo-reviews"
    assert check_identity(node, peer("URI:spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"), sa) is not None
    assert check_identity(node, peer("DNS:reviews-v1-vm.bookinfo"), sa) is not None
    assert check_identity(node, peer("URI:spiffe://cluster.local/ns/payments/sa/bookinfo-reviews"), sa) is None


def test_no_certificate_is_refused_whatever_the_sans() -> None:
    refusal = check_identity(parse_node_id(REVIEWS_V1), PeerIdentity(dns=("reviews-v1-vm.bookinfo",)), "default")
    assert refusal is not None and "no client certificate" in refusal


def test_the_peer_is_read_from_grpcs_typed_san_properties() -> None:
    auth = {
        "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----"],
        "x509_subject_alternative_name": [b"spiffe://td/ns/a/sa/b", b"a.b"],
        "peer_uri": [b"spiffe://td/ns/a/sa/b"],
        "peer_dns": [b"a.b"],
    }
    assert PeerIdentity.from_auth_context(auth) == PeerIdentity(("spiffe://td/ns/a/sa/b",), ("a.b",), True)
    assert PeerIdentity.from_auth_context({"transport_security_type": [b"ssl"]}) == PeerIdentity()


WORKLOADS = """
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: ratings, namespace: shop}
spec:
  metadata: {labels: {app: ratings}}
  template: {serviceAccount: ratings-sa}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: ratings}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ratings-1, namespace: shop, annotations: {istio.io/autoRegistrationGroup: ratings}}
spec: {address: 10.0.0.7, labels: {app: ratings}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: cart-1, namespace: shop}
spec: {address: 10.0.0.8, serviceAccount: cart-sa}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: loner, namespace: shop}
spec: {address: 10.0.0.10}
"""


@pytest.mark.parametrize(
    ("node_id", "account"),
    [
        ("sidecar~10.0.0.8~cart-1.shop~shop.svc.cluster.local", "cart-sa"),  # by name, in no service
        ("sidecar~10.0.0.8~vm-hostname.shop~shop.svc.cluster.local", "cart-sa"),  # bound by IP
        ("sidecar~10.0.0.7~ratings-1.shop~shop.svc.cluster.local", "ratings-sa"),  # the group's default
        ("sidecar~10.0.0.7~other-name.shop~shop.svc.cluster.local", "ratings-sa"),  # the group's, by IP
        ("sidecar~10.0.0.10~loner.shop~shop.svc.cluster.local", "default"),  # an entry naming none
        ("sidecar~10.0.0.9~nobody.shop~shop.svc.cluster.local", ""),
        ("sidecar~10.0.0.8~cart-1.elsewhere~elsewhere.svc.cluster.local", ""),
    ],
)
def test_a_workload_runs_as_exactly_one_service_account(node_id: str, account: str) -> None:
    snapshot = snapshot_from_yaml(WORKLOADS)
    assert workload_service_account(parse_node_id(node_id), snapshot) == account


# -- credentials --------------------------------------------------------------------------------


def test_unusable_tls_files_are_refused_with_the_file_named(pki: Pki) -> None:
    with pytest.raises(CredentialError, match="is not the private key of"):
        XdsTls(pki.server.cert, pki.reviews_dns.key).load()
    with pytest.raises(CredentialError, match=r"cannot read .*missing\.pem"):
        XdsTls(pki.dir / "missing.pem", pki.server.key).load()
    with pytest.raises(CredentialError, match="no PEM CA certificate"):
        XdsTls(pki.server.cert, pki.server.key, pki.server.key).load()
    XdsTls(pki.server.cert, pki.server.key, pki.ca.cert).load()


def test_serve_refuses_half_a_tls_configuration(tmp_path: Path, pki: Pki) -> None:
    runner = CliRunner()
    base = ["serve", "-c", str(tmp_path), "--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]
    result = runner.invoke(app, [*base, "--tls-cert", str(pki.server.cert)])
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key go together" in result.output
    result = runner.invoke(app, [*base, "--client-ca", str(pki.ca.cert)])
    assert result.exit_code == 2
    assert "--client-ca needs --tls-cert" in result.output
    result = runner.invoke(app, [*base, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.reviews_dns.key)])
    assert result.exit_code == 2
    assert "is not the private key of" in result.output


# -- the real server on loopback ------------------------------------------------------------------


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    return examples_copy(tmp_path)


def secure_channel(server: Server, ca: Path, client: KeyPair | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        ca.read_bytes(),
        client.key.read_bytes() if client else None,
        client.cert.read_bytes() if client else None,
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{server.xds_port}", credentials)


async def gets_config(server: Server, node_id: str, channel: grpc.aio.Channel) -> AdsClient:
    """Subscribe as Envoy does and wait for a complete config."""
    try:
        async with AdsClient(f"127.0.0.1:{server.xds_port}", node_id, channel=channel) as client:
            await client.wait_for(lambda c: c.complete(), timeout=20)
            return client
    finally:
        await channel.close(None)


async def refused(server: Server, node_id: str, channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    """Subscribe and return the error the stream ended with; fails if any config arrives."""
    try:
        async with AdsClient(f"127.0.0.1:{server.xds_port}", node_id, channel=channel) as client:
            with pytest.raises(ConnectionError):
                await client.wait_for(lambda c: c.complete(), timeout=20)
            assert client.log == [], "config was sent before the stream was refused"
            assert isinstance(client.closed, grpc.aio.AioRpcError)
            return client.closed
    finally:
        await channel.close(None)


def mutual(pki: Pki) -> XdsTls:
    return XdsTls(pki.server.cert, pki.server.key, pki.ca.cert)


@pytest.mark.slow
def test_a_proxy_with_a_certificate_naming_its_workload_gets_its_config(mesh: Path, pki: Pki) -> None:
    async def test() -> None:
        async with serving(mesh, tls=mutual(pki)) as server:
            for cert in (pki.reviews_spiffe, pki.reviews_dns):
                client = await gets_config(server, REVIEWS_V1, secure_channel(server, pki.ca.cert, cert))
                assert "outbound|9080|v1|reviews.bookinfo.mesh" in client.names(types.CLUSTER)
            # Delta ADS goes through the same check.
            channel = secure_channel(server, pki.ca.cert, pki.reviews_dns)
            async with AdsClient(f"127.0.0.1:{server.xds_port}", REVIEWS_V1, channel=channel, delta=True) as client:
                await client.wait_for(lambda c: c.complete(), timeout=20)
            await channel.close(None)

    run(test)


@pytest.mark.slow
def test_a_plaintext_client_cannot_reach_the_tls_port(mesh: Path, pki: Pki) -> None:
    async def test() -> None:
        async with serving(mesh, tls=mutual(pki)) as server:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.xds_port}")
            error = await refused(server, REVIEWS_V1, channel)
            assert error.code() == grpc.StatusCode.UNAVAILABLE

    run(test)


@pytest.mark.slow
def test_a_client_without_a_trusted_certificate_fails_the_handshake(mesh: Path, pki: Pki) -> None:
    async def test() -> None:
        async with serving(mesh, tls=mutual(pki)) as server:
            for cert in (None, pki.foreign):
                error = await refused(server, REVIEWS_V1, secure_channel(server, pki.ca.cert, cert))
                assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert server.ads.streams == {}

    run(test)


@pytest.mark.slow
def test_a_certificate_naming_another_workload_is_refused_and_logged(
    mesh: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    cases = [
        (REVIEWS_V1, pki.other_namespace),  # the wrong namespace
        (PRODUCTPAGE, pki.reviews_spiffe),  # productpage's WorkloadEntry runs as bookinfo-productpage
        (PRODUCTPAGE, pki.reviews_dns),  # names reviews-v1-vm, not productpage-v1-vm
    ]

    async def test() -> None:
        async with serving(mesh, tls=mutual(pki)) as server:
            for node_id, cert in cases:
                error = await refused(server, node_id, secure_channel(server, pki.ca.cert, cert))
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
                assert "does not name workload" in (error.details() or "")

    with caplog.at_level(logging.WARNING, logger="meshctl.server.ads"):
        run(test)
    refusals = [r.getMessage() for r in caplog.records if r.name == "meshctl.server.ads"]
    assert len(refusals) == 3, refusals
    assert all(m.startswith("refused node") for m in refusals)
    assert "sa/bookinfo-productpage" in refusals[1]
    assert "URI:spiffe://cluster.local/ns/other/sa/bookinfo-reviews" in refusals[0]


@pytest.mark.slow
def test_tls_without_a_client_ca_serves_any_proxy(mesh: Path, pki: Pki) -> None:
    async def test() -> None:
        async with serving(mesh, tls=XdsTls(pki.server.cert, pki.server.key)) as server:
            await gets_config(server, PRODUCTPAGE, secure_channel(server, pki.ca.cert, None))

    run(test)


@pytest.mark.slow
def test_rotated_certificate_files_are_used_by_new_connections(mesh: Path, pki: Pki, tmp_path: Path) -> None:
    """An agent rotates the server's certificate (here, to one from another CA) by renaming new
    files over the old; the next connection is served with it, without a restart."""
    live = KeyPair(tmp_path / "tls.pem", tmp_path / "tls.key")
    shutil.copy(pki.server.cert, live.cert)
    shutil.copy(pki.server.key, live.key)
    rotated = issue(pki.foreign_ca, tmp_path, "rotated", "IP:127.0.0.1")

    async def test() -> None:
        async with serving(mesh, tls=XdsTls(live.cert, live.key, pki.ca.cert)) as server:
            error = await refused(server, REVIEWS_V1, secure_channel(server, pki.foreign_ca.cert, pki.reviews_dns))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            # A half-done rotation (new certificate, old key) is not applied.
            shutil.copy(rotated.cert, tmp_path / "next.pem")
            os.replace(tmp_path / "next.pem", live.cert)
            await gets_config(server, REVIEWS_V1, secure_channel(server, pki.ca.cert, pki.reviews_dns))
            shutil.copy(rotated.key, tmp_path / "next.key")
            os.replace(tmp_path / "next.key", live.key)
            await gets_config(server, REVIEWS_V1, secure_channel(server, pki.foreign_ca.cert, pki.reviews_dns))

    run(test)


# -- Envoy's side ---------------------------------------------------------------------------------


def xds_socket(options: BootstrapOptions) -> dict[str, Any] | None:
    """The `xds-grpc` cluster's transport socket config in the bootstrap for `options`."""
    cluster = build_bootstrap(parse_node_id(REVIEWS_V1), options)["static_resources"]["clusters"][0]
    socket: dict[str, Any] | None = cluster.get("transport_socket", {}).get("typed_config")
    return socket


def test_the_bootstrap_checks_the_servers_san_and_presents_the_client_certificate() -> None:
    by_ip = xds_socket(
        BootstrapOptions("10.0.0.1", 15012, tls=XdsClientTls(Path("ca.pem"), Path("p.pem"), Path("p.key")))
    )
    assert by_ip is not None
    common = by_ip["common_tls_context"]
    assert common["alpn_protocols"] == ["h2"]
    assert common["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "10.0.0.1"}}
    ]
    assert Path(common["validation_context"]["trusted_ca"]["filename"]).is_absolute()
    assert common["tls_certificates"][0]["certificate_chain"]["filename"] == str(Path("p.pem").absolute())
    assert "sni" not in by_ip  # SNI carries names, never addresses

    by_name = xds_socket(BootstrapOptions("meshctl.internal", 15012, tls=XdsClientTls(Path("ca.pem"))))
    assert by_name is not None
    assert by_name["sni"] == "meshctl.internal"
    assert "tls_certificates" not in by_name["common_tls_context"]

    sni = xds_socket(BootstrapOptions("10.0.0.1", 15012, tls=XdsClientTls(Path("ca.pem"), sni="istiod.example")))
    assert sni is not None
    assert sni["sni"] == "istiod.example"
    assert sni["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "istiod.example"}}
    ]
    assert xds_socket(BootstrapOptions("10.0.0.1", 15012)) is None


def test_bootstrap_refuses_tls_flags_that_would_not_check_the_server(pki: Pki) -> None:
    runner = CliRunner()
    base = ["bootstrap", "--proxy", REVIEWS_V1]
    result = runner.invoke(app, [*base, "--xds-cert", str(pki.reviews_dns.cert), "--xds-key", str(pki.reviews_dns.key)])
    assert result.exit_code == 2
    assert "need --xds-ca" in result.output
    result = runner.invoke(app, [*base, "--xds-ca", str(pki.ca.cert), "--xds-cert", str(pki.reviews_dns.cert)])
    assert result.exit_code == 2
    assert "--xds-cert and --xds-key go together" in result.output


SHOP = "e2e-tls"


def wait_until(what: str, check: Callable[[], bool], *, log: Callable[[], str] | None = None) -> None:
    """Poll `check` with a generous deadline: a slow machine makes the test slower, never flaky."""
    deadline = 30.0
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not seen after {deadline}s:\n{log()[-3000:] if log else ''}")
        time.sleep(0.1)


def impatient(config: dict[str, Any]) -> dict[str, Any]:
    """A bootstrap whose Envoy stops waiting for its first config after a second: one that never
    gets any would otherwise wait 15 s per type before its admin API reports LIVE."""
    for source in ("cds_config", "lds_config"):
        config["dynamic_resources"][source]["initial_fetch_timeout"] = "1s"
    return config


@pytest.fixture
def tls_serve(tmp_path: Path, pki: Pki) -> Iterator[tuple[ServeProcess, int]]:
    port = free_port()
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "shop.yaml").write_text(ratings_mesh(SHOP, port))
    token = tmp_path / "admin-token"
    token.write_text("s3cret\n")
    flags = [
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
        "--client-ca", str(pki.ca.cert), "--admin-token-file", str(token),
    ]  # fmt: skip
    with ServeProcess([mesh], extra_args=flags) as serve:
        yield serve, port


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
@envoy_log_left_open
def test_envoy_from_meshctl_bootstrap_gets_its_config_over_mutual_tls(
    tls_serve: tuple[ServeProcess, int], pki: Pki, tmp_path: Path
) -> None:
    serve, port = tls_serve
    client_id = f"sidecar~127.0.0.9~client.{SHOP}~{SHOP}.svc.cluster.local"
    client_cert = issue(pki.ca, tmp_path, "client", f"URI:spiffe://cluster.local/ns/{SHOP}/sa/client")
    # The certificate names ratings' service account, not client's: refused by the identity rule.
    impostor_cert = issue(pki.ca, tmp_path, "impostor", f"URI:spiffe://cluster.local/ns/{SHOP}/sa/ratings")

    def tls_flags(cert: KeyPair, sni: str = "meshctl.test") -> list[str]:
        return ["--xds-ca", str(pki.ca.cert), "--xds-cert", str(cert.cert), "--xds-key", str(cert.key)] + (
            ["--xds-sni", sni] if sni else []
        )

    good = serve.bootstrap(client_id, extra_args=tls_flags(client_cert))
    validate_config(good)
    impostor = impatient(serve.bootstrap(client_id, extra_args=tls_flags(impostor_cert)))
    # meshctl's certificate has no DNS SAN wrong.test: Envoy must not trust it.
    wrong_server = impatient(serve.bootstrap(client_id, extra_args=tls_flags(client_cert, sni="wrong.test")))
    # No --xds-sni: the server is checked by its IP SAN, 127.0.0.1.
    by_ip = serve.bootstrap(client_id, delta=False, extra_args=tls_flags(client_cert, sni=""))

    cluster = f"outbound|{port}||ratings.{SHOP}.mesh"
    with (
        EnvoyProcess(good) as envoy,
        EnvoyProcess(by_ip) as envoy_by_ip,
        EnvoyProcess(impostor) as envoy_impostor,
        EnvoyProcess(wrong_server) as envoy_wrong,
    ):
        for e in (envoy, envoy_by_ip):
            wait_until(f"{cluster} in Envoy's /clusters", lambda e=e: cluster in e.admin("clusters"), log=e.log)
            assert "127.0.0.21:" in e.admin("clusters")
        wait_until(
            "the impostor's refusal in meshctl's log",
            lambda: f"refused node {client_id}" in serve.log() and "sa/ratings" in serve.log(),
            log=serve.log,
        )

        def san_failures() -> int:
            stats = envoy_wrong.admin("stats?filter=^cluster.xds-grpc.ssl.fail_verify_san$")
            return int(stats.split(":")[-1].strip() or 0)

        wait_until("Envoy refusing a server certificate without its SAN", lambda: san_failures() > 0)
        for e in (envoy_impostor, envoy_wrong):
            assert "outbound|" not in e.admin("clusters")
            assert "control_plane.connected_state: 0" in e.admin("stats?filter=connected_state")
        # The two Envoys let in are the only streams; the debug page saying so needs the token.
        with pytest.raises(urllib.error.HTTPError, match="401"):
            serve.admin("debug/syncz")
        request = urllib.request.Request(
            f"http://{serve.admin_address}/debug/syncz", headers={"Authorization": "Bearer s3cret"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            syncz = json.loads(response.read())
        assert sorted((p["proxy"], p["delta"]) for p in syncz) == [(client_id, False), (client_id, True)]


# -- what a certificate proves bounds what the node gets ----------------------------------------

SHOP_WORKLOADS = (
    WORKLOADS
    + """
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: edge, namespace: shop}
spec: {address: 10.0.0.20, labels: {istio: ingressgateway}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: billing-1, namespace: billing}
spec: {address: 10.0.0.30, serviceAccount: billing-sa, labels: {app: billing}}
"""
)


@pytest.mark.parametrize(
    ("node_id", "sans", "refused_because"),
    [
        # The certificate is for a workload the mesh does not have: binding it by IP would hand
        # it the config of whatever workload has that address.
        ("sidecar~10.0.0.8~ghost.shop~shop.svc.cluster.local", ["DNS:ghost.shop"], "has no workload"),
        ("sidecar~10.0.0.99~ghost.shop~shop.svc.cluster.local", ["DNS:ghost.shop"], "names no workload"),
        # Another namespace's workload at that IP is not the node's.
        ("sidecar~10.0.0.30~ghost.shop~shop.svc.cluster.local", ["URI:spiffe://td/ns/shop/sa/x"], "names no workload"),
        ("sidecar~10.0.0.30~billing-1.shop~shop.svc.cluster.local", ["DNS:billing-1.shop"], "names no workload"),
        # A service account from the right namespace, but not the one the workload runs as.
        ("sidecar~10.0.0.8~cart-1.shop~shop.svc.cluster.local", ["URI:spiffe://td/ns/shop/sa/ratings-sa"], "does not"),
        ("sidecar~10.0.0.8~cart-1.shop~shop.svc.cluster.local", ["DNS:cart-1.shop"], None),
        ("sidecar~10.0.0.8~vm-host.shop~shop.svc.cluster.local", ["URI:spiffe://td/ns/shop/sa/cart-sa"], None),
        ("sidecar~10.0.0.30~billing-1.billing~billing.svc.cluster.local", ["DNS:billing-1.billing"], None),
    ],
)
def test_a_certificate_must_name_a_workload_the_mesh_has(
    node_id: str, sans: list[str], refused_because: str | None
) -> None:
    outcome = authorize_node(parse_node_id(node_id), peer(*sans), snapshot_from_yaml(SHOP_WORKLOADS))
    if refused_because is None:
        assert not isinstance(outcome, str), outcome
        assert outcome.attested and outcome.workload and outcome.service_account
    else:
        assert isinstance(outcome, str) and refused_because in outcome, outcome


def test_an_attested_nodes_labels_are_its_workloads_whatever_its_metadata_says() -> None:
    snapshot = snapshot_from_yaml(SHOP_WORKLOADS)
    claim = {"LABELS": {"istio": "ingressgateway", "app": "billing"}, "NAMESPACE": "shop"}
    node = parse_node_id("router~10.0.0.8~cart-1.shop~shop.svc.cluster.local", claim)
    assert bind_proxy(node, snapshot).labels["istio"] == "ingressgateway"  # without a certificate
    attested = bind_proxy(replace(node, attested=True), snapshot)
    assert attested.workload == "shop/cart-1"
    assert "istio" not in attested.labels and "app" not in attested.labels


@pytest.fixture(scope="module")
def more_certs(pki: Pki) -> dict[str, KeyPair]:
    return {
        "ghost": issue(pki.ca, pki.dir, "ghost-dns", "DNS:ghost.bookinfo"),
        "adhoc": issue(pki.ca, pki.dir, "adhoc-dns", "DNS:adhoc.bookinfo"),
    }


@pytest.mark.slow
def test_two_certificates_a_missing_workload_is_refused_and_labels_cannot_borrow_a_gateway(
    mesh: Path, pki: Pki, more_certs: dict[str, KeyPair]
) -> None:
    """Against the real server over mutual TLS: certificates for workloads the mesh lacks are
    refused, and reviews' own certificate with a gateway's labels in its metadata still gets
    reviews' config, not the gateway's listener on 8080."""
    gateway_claim = {"LABELS": {"istio": "ingressgateway"}}
    as_router = REVIEWS_V1.replace("sidecar~", "router~")

    async def test() -> None:
        async with serving(mesh, tls=mutual(pki)) as server:
            for node_id, cert in ((GHOST, more_certs["ghost"]), (ADHOC, more_certs["adhoc"])):
                error = await refused(server, node_id, secure_channel(server, pki.ca.cert, cert))
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            channel = secure_channel(server, pki.ca.cert, pki.reviews_spiffe)
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, as_router, metadata=gateway_claim, channel=channel) as client:
                await client.wait_for(lambda c: c.complete(), timeout=20)
                assert "0.0.0.0_8080" not in client.names(types.LISTENER)
                assert "http.8080" not in client.names(types.ROUTE)
            await channel.close(None)
        # The same node without client certificates is taken at its word, as Istio does.
        async with serving(mesh, tls=XdsTls(pki.server.cert, pki.server.key)) as server:
            channel = secure_channel(server, pki.ca.cert, None)
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, as_router, metadata=gateway_claim, channel=channel) as client:
                await client.wait_for(lambda c: "0.0.0.0_8080" in c.names(types.LISTENER), timeout=20)
            await channel.close(None)

    run(test)
