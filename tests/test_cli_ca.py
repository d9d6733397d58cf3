"""`meshctl ca root` and `meshctl ca issue`: what an operator runs to trust the mesh and to give a
VM (or the xDS server) its certificate, with the files checked by cryptography's path verifier."""

from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import ssl
import stat
import subprocess
from concurrent import futures
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store
from typer.testing import CliRunner

from meshctl.cli import exits
from meshctl.cli.app import app, ca_app
from meshctl.testing.serve_process import meshctl_command

runner = CliRunner()


def ca(*args: str | Path) -> tuple[int, str, str]:
    result = runner.invoke(app, ["ca", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def leaf_and_rest(out: Path) -> tuple[x509.Certificate, list[x509.Certificate]]:
    leaf, *rest = x509.load_pem_x509_certificates((out / "cert-chain.pem").read_bytes())
    return leaf, rest


def test_root_prints_the_root_and_makes_it_on_first_use(tmp_path: Path) -> None:
    status, first, stderr = ca("root", "--state-dir", tmp_path)
    assert status == 0, stderr
    (root,) = x509.load_pem_x509_certificates(first.encode())
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert "made a new root CA" in stderr and str(tmp_path / "ca") in stderr
    status, again, stderr = ca("root", "--state-dir", tmp_path)
    assert (status, again, stderr) == (0, first, "")


def test_root_of_a_plug_in_ca_is_its_root_cert_file(tmp_path: Path) -> None:
    """A plug-in directory made from a self-signed root (Istio takes a root as ca-cert.pem too)."""
    ca("root", "--state-dir", tmp_path / "state")
    plugin = tmp_path / "cacerts"
    plugin.mkdir()
    for name, source in [
        ("ca-cert.pem", "root-cert.pem"),
        ("root-cert.pem", "root-cert.pem"),
        ("cert-chain.pem", "root-cert.pem"),
        ("ca-key.pem", "ca-key.pem"),
    ]:
        shutil.copy(tmp_path / "state" / "ca" / source, plugin / name)
    status, stdout, stderr = ca("root", "--ca-dir", plugin, "--state-dir", tmp_path / "unused")
    assert (status, stdout) == (0, (plugin / "root-cert.pem").read_text()), stderr
    assert not (tmp_path / "unused").exists()


def test_issue_for_a_vm_proxy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    status, stdout, stderr = ca("issue", "--proxy", "web.bookinfo", "--out", out, "--state-dir", tmp_path / "state")
    assert (status, stdout) == (0, ""), stderr
    assert sorted(p.name for p in out.iterdir()) == ["cert-chain.pem", "key.pem", "root-cert.pem", "sds"]
    assert stat.S_IMODE((out / "key.pem").stat().st_mode) == 0o600
    # The SDS file `meshctl bootstrap --xds-cert-dir` has Envoy read the pair through.
    sds = (out / "sds" / "xds-client-cert.yaml").read_text()
    assert str((out / "cert-chain.pem").absolute()) in sds and str((out / "key.pem").absolute()) in sds
    leaf, rest = leaf_and_rest(out)
    roots = x509.load_pem_x509_certificates((out / "root-cert.pem").read_bytes())
    verified = PolicyBuilder().store(Store(roots)).build_client_verifier().verify(leaf, rest)
    assert verified.subjects == [
        x509.DNSName("web.bookinfo"),
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/bookinfo/sa/default"),
    ]
    key = serialization.load_pem_private_key((out / "key.pem").read_bytes(), password=None)
    assert key.public_key() == leaf.public_key()
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert lifetime.total_seconds() == 720 * 3600 + 60
    assert "web.bookinfo" in stderr and "renew after" in stderr


def tls_handshake(server_dir: Path, client_dir: Path) -> None:
    """A mutual TLS handshake over a socket pair between a server holding `server_dir`'s
    certificate and a client holding `client_dir`'s, each trusting its directory's root (names
    are SPIFFE ids: no host name check, as in the mesh). Raises ssl.SSLError on a refusal."""
    contexts = []
    for purpose, directory in ((ssl.Purpose.CLIENT_AUTH, server_dir), (ssl.Purpose.SERVER_AUTH, client_dir)):
        context = ssl.create_default_context(purpose, cafile=str(directory / "root-cert.pem"))
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(directory / "cert-chain.pem", directory / "key.pem")
        contexts.append(context)
    left, right = socket.socketpair()
    with left, right, futures.ThreadPoolExecutor(1) as pool:
        server = contexts[0].wrap_socket(left, server_side=True, do_handshake_on_connect=False)
        client = contexts[1].wrap_socket(right, do_handshake_on_connect=False)
        with server, client:
            served = pool.submit(server.do_handshake)
            client.do_handshake()  # a refusal is sent to the server as an alert: its handshake ends too
            served.result(10)


def test_a_proxy_certificate_serves_the_mesh_mutual_tls(tmp_path: Path) -> None:
    """A proxyless gRPC server serves with its workload's `ca issue --proxy` certificate: a
    client certificate alone is refused by the calling side."""
    state = tmp_path / "state"
    for proxy, account in (("echo-v1.shop", "echo"), ("client.shop", "client")):
        args = ["--proxy", proxy, "--service-account", account, "--out", tmp_path / account]
        status, _, stderr = ca("issue", *args, "--state-dir", state)
        assert status == 0, stderr
    tls_handshake(tmp_path / "echo", tmp_path / "client")


def test_issue_names_the_service_account_and_trust_domain(tmp_path: Path) -> None:
    args = ["--proxy", "reviews-v1-vm.bookinfo", "--service-account", "reviews", "--trust-domain", "example.org"]
    status, _, stderr = ca("issue", *args, "--lifetime", "90m", "--out", tmp_path, "--state-dir", tmp_path / "s")
    assert status == 0, stderr
    leaf, _ = leaf_and_rest(tmp_path)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://example.org/ns/bookinfo/sa/reviews"]
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds() == 91 * 60


def test_issue_for_the_xds_server(tmp_path: Path) -> None:
    args = ["--server", "meshctl.example.com", "--server", "10.10.0.1", "--out", tmp_path]
    status, _, stderr = ca("issue", *args, "--state-dir", tmp_path / "state")
    assert status == 0, stderr
    leaf, rest = leaf_and_rest(tmp_path)
    store = Store(x509.load_pem_x509_certificates((tmp_path / "root-cert.pem").read_bytes()))
    for name in (x509.DNSName("meshctl.example.com"), x509.IPAddress(ipaddress.ip_address("10.10.0.1"))):
        PolicyBuilder().store(store).build_server_verifier(name).verify(leaf, rest)
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_issue_never_overwrites_without_force(tmp_path: Path) -> None:
    args = ["issue", "--proxy", "web.bookinfo", "--out", tmp_path, "--state-dir", tmp_path / "state"]
    assert ca(*args)[0] == 0
    before = (tmp_path / "key.pem").read_bytes()
    status, stdout, stderr = ca(*args)
    assert (status, stdout) == (2, "")
    assert stderr.startswith("error: ") and "already exist" in stderr and "--force" in stderr
    assert str(tmp_path / "key.pem") in stderr
    assert (tmp_path / "key.pem").read_bytes() == before
    assert ca(*args, "--force")[0] == 0
    assert (tmp_path / "key.pem").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "key.pem").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--proxy", "web"], "is not NAME.NAMESPACE"),
        (["--proxy", "web."], "is not NAME.NAMESPACE"),
        (["--proxy", ".bookinfo"], "is not NAME.NAMESPACE"),
        (["--proxy", "web.book.info"], "is not NAME.NAMESPACE"),
        (["--proxy", "web_1.bookinfo"], "is not NAME.NAMESPACE"),
        ([], "exactly one of --proxy"),
        (["--proxy", "web.bookinfo", "--server", "meshctl.example.com"], "exactly one of --proxy"),
        (["--server", "not a host"], "neither a DNS name nor an IP address"),
        (["--proxy", "web.bookinfo", "--lifetime", "3 days"], "--lifetime"),
        (["--proxy", "web.bookinfo", "--lifetime", "0s"], "--lifetime"),
        (["--proxy", "web.bookinfo", "--service-account", "a/b"], "service account"),
    ],
)
def test_issue_refuses_bad_flags(tmp_path: Path, args: list[str], words: str) -> None:
    status, stdout, stderr = ca("issue", *args, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
    assert (status, stdout) == (2, ""), stderr
    assert stderr.startswith("error: ") and words in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_a_broken_ca_dir_is_named(tmp_path: Path) -> None:
    status, stdout, stderr = ca("issue", "--proxy", "web.bookinfo", "--out", tmp_path / "out", "--ca-dir", tmp_path)
    assert (status, stdout) == (2, "")
    assert f"error: {tmp_path / 'ca-cert.pem'}: no such file" in stderr


@pytest.mark.parametrize("command", ["root", "issue"])
def test_ca_commands_follow_the_cli_conventions(command: str) -> None:
    result = runner.invoke(app, ["ca", command, "-h"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"Usage: meshctl ca {command}" in result.output
    rows = [line for line in result.output.splitlines() if re.match(r"^│ +(\* +)?-", line) and "--help" not in line]
    assert rows, result.output
    for row in rows:
        assert not re.search(r"<(str|int|float|path|bool)>|list\[", row), row
    edge = exits.reported(lambda: None).__code__
    callbacks = {c.name: c.callback for c in ca_app.registered_commands}
    assert callbacks[command] is not None and callbacks[command].__code__ is edge


def test_meshctl_ca_root_as_installed(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*meshctl_command(), "ca", "root", "--state-dir", str(tmp_path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (tmp_path / "ca" / "root-cert.pem").read_bytes()
