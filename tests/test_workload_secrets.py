"""Workload certificates over SDS through the real server: who gets which key.

The xDS port's own certificates come from meshctl's CA (`CertificateAuthority.issue_server` and
`issue_client`, what `meshctl ca issue` writes), and the server signs workload certificates with
the same root kept in its state directory. In-process ADS clients subscribe as Envoy does,
secrets included once a cluster names them.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from conftest import PRODUCTPAGE, REVIEWS_V1, examples_copy
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.app import Server
from meshctl.server.auth import XdsTls
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.serve_process import meshctl_command
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow


def write(directory: Path, name: str, issued: IssuedCertificate) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(issued.cert_chain_pem)
    key.write_bytes(issued.private_key_pem)
    return cert, key


def channel(server: Server, root: bytes, client: tuple[Path, Path] | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root, client[1].read_bytes() if client else None, client[0].read_bytes() if client else None
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{server.xds_port}", credentials)


async def secrets_of(server: Server, node_id: str, chan: grpc.aio.Channel) -> dict[str, object]:
    try:
        async with AdsClient(f"127.0.0.1:{server.xds_port}", node_id, channel=chan) as client:
            await client.wait_for(lambda c: c.complete() and len(c.resources[types.SECRET]) == 2, timeout=20)
            return dict(client.resources[types.SECRET])
    finally:
        await chan.close(None)


def debug_dump(server: Server, node_id: str) -> str:
    url = f"http://127.0.0.1:{server.admin_port}/debug/config_dump?proxyID={urllib.parse.quote(node_id, safe='')}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def identity_of(secret: object) -> tuple[str, bytes]:
    """The SPIFFE URI of a `default` secret's leaf, and the public key its private key makes."""
    chain = secret.tls_certificate.certificate_chain.inline_bytes  # type: ignore[attr-defined]
    leaf = x509.load_pem_x509_certificates(chain)[0]
    (uri,) = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    key = serialization.load_pem_private_key(secret.tls_certificate.private_key.inline_bytes, None)  # type: ignore[attr-defined]
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert public == leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return uri, public


def test_a_proxy_gets_the_key_of_the_workload_its_certificate_proves_and_no_other(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ca = CertificateAuthority.self_signed(state)
    server_cert = write(tmp_path, "server", ca.issue_server(ip_addresses=["127.0.0.1"]))
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    reviews = write(
        tmp_path,
        "reviews",
        ca.issue_client(["reviews-v1-vm.bookinfo"], WorkloadIdentity("cluster.local", "bookinfo", "bookinfo-reviews")),
    )
    productpage = write(tmp_path, "productpage", ca.issue_client(["productpage-v1-vm.bookinfo"]))
    mesh = examples_copy(tmp_path)

    async def test() -> None:
        tls = XdsTls(server_cert[0], server_cert[1], root)
        async with serving(mesh, tls=tls, state_dir=state) as server:
            a = await secrets_of(server, REVIEWS_V1, channel(server, ca.root_pem, reviews))
            b = await secrets_of(server, PRODUCTPAGE, channel(server, ca.root_pem, productpage))
            a_uri, a_key = identity_of(a["default"])
            b_uri, b_key = identity_of(b["default"])
            assert a_uri == "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"
            assert b_uri == "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage"
            assert a_key != b_key
            # The trust bundle is the server's root, the same for both.
            assert a["ROOTCA"] == b["ROOTCA"]
            assert a["ROOTCA"].validation_context.trusted_ca.inline_bytes == ca.root_pem  # type: ignore[attr-defined]
            # The debug dump shows what the proxy holds, the key redacted as Envoy redacts it.
            async with AdsClient(
                f"127.0.0.1:{server.xds_port}", REVIEWS_V1, channel=channel(server, ca.root_pem, reviews)
            ) as c:
                await c.wait_for(lambda c: len(c.resources[types.SECRET]) == 2, timeout=20)
                dump = await asyncio.to_thread(debug_dump, server, REVIEWS_V1)
            assert "PRIVATE KEY" not in dump and "[redacted]" in dump
            secrets = next(s for s in json.loads(dump)["configs"] if s["@type"].endswith("SecretsConfigDump"))
            assert [s["name"] for s in secrets["dynamic_active_secrets"]] == ["ROOTCA", "default"]
            # reviews' certificate cannot ask for productpage's node: refused before anything is sent.
            chan = channel(server, ca.root_pem, reviews)
            async with AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE, channel=chan) as client:
                with pytest.raises(ConnectionError):
                    await client.wait_for(lambda c: c.complete(), timeout=10)
                assert client.resources[types.SECRET] == {}
            await chan.close(None)

    run(test)


def test_without_proof_of_identity_no_key_is_sent_and_config_uses_no_mutual_tls(tmp_path: Path) -> None:
    mesh = examples_copy(tmp_path)

    async def test() -> None:
        async with (
            serving(mesh, state_dir=tmp_path / "state") as server,
            AdsClient(f"127.0.0.1:{server.xds_port}", REVIEWS_V1) as client,
        ):
            await client.wait_for(lambda c: c.complete(), timeout=20)
            assert client.resources[types.SECRET] == {}
            clusters = client.resources[types.CLUSTER].values()
            assert not any(c.transport_socket_matches for c in clusters)  # type: ignore[attr-defined]
            assert all(b"ROOTCA" not in c.SerializeToString() for c in clusters)
            listeners = client.resources[types.LISTENER].values()
            assert all(b"ROOTCA" not in listener.SerializeToString() for listener in listeners)

    run(test)


def test_a_fleet_without_proof_of_identity_is_named_a_few_times_then_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plaintext fleet: the log names the first proxies refused a certificate, then says how
    many so far at 10, 100, ..., not a line per proxy at every start; a proxy that reconnects is
    not said again."""
    mesh = examples_copy(tmp_path)
    nodes = [f"sidecar~10.77.0.{i}~client-{i}.bookinfo~bookinfo.svc.cluster.local" for i in range(1, 13)]

    async def test() -> None:
        async with serving(mesh, state_dir=tmp_path / "state") as server:
            for node in [*nodes, nodes[0]]:
                async with AdsClient(f"127.0.0.1:{server.xds_port}", node) as client:
                    await client.wait_for(lambda c: c.complete(), timeout=20)

    with caplog.at_level("WARNING", logger="meshctl.server.secrets"):
        run(test)
    said = [r.getMessage() for r in caplog.records if "no workload certificate" in r.getMessage()]
    assert said[:5] == [
        f"proxy {n} gets no workload certificate: its xDS connection did not prove its identity "
        "(serve with --client-ca); its config uses no mutual TLS"
        for n in nodes[:5]
    ]
    assert said[5:] == [
        "10 proxies so far get no workload certificate: their xDS connections did not prove their identity "
        "(serve with --client-ca); their config uses no mutual TLS"
    ]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: ["--ca-dir", str(d)], "ca-cert.pem"),
        (lambda d: ["--state-dir", str(d / "a-file")], "a-file"),
    ],
)
def test_a_ca_that_cannot_be_used_stops_serve_with_the_file_named(
    tmp_path: Path, make: Callable[[Path], list[str]], said: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    mesh = examples_copy(tmp_path)
    proc = subprocess.run(
        [*meshctl_command(), "serve", "--config-dir", str(mesh), "--xds-address", "127.0.0.1:0", *make(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "PRIVATE KEY" not in proc.stderr


def test_a_connected_proxy_is_renewed_and_one_that_left_is_forgotten(tmp_path: Path) -> None:
    """Renewal rounds re-resolve connected proxies only: the certificate of a proxy that left is
    dropped at its renewal time instead of making every later round due at once."""
    mesh = examples_copy(tmp_path)
    lifetime = datetime.timedelta(seconds=3)

    async def test() -> None:
        async with serving(
            mesh, state_dir=tmp_path / "state", insecure_send_keys=True, workload_cert_lifetime=lifetime
        ) as server:
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, PRODUCTPAGE) as stays:
                async with AdsClient(address, REVIEWS_V1) as leaves:
                    await leaves.wait_for(lambda c: len(c.resources[types.SECRET]) == 2, timeout=20)
                await stays.wait_for(lambda c: len(c.resources[types.SECRET]) == 2, timeout=20)
                first = stays.resources[types.SECRET]["default"]
                await stays.wait_for(lambda c: c.resources[types.SECRET]["default"] != first, timeout=20)
                assert server.secrets.issued >= 3
                await asyncio.sleep(3)
                assert set(server.secrets.held_nodes()) == {PRODUCTPAGE}

    run(test)
