"""Gateway certificates named by `credentialName`, served over SDS from `serve --credentials-dir`.

The secrets are files laid out as Kubernetes mounts them (`DIR/NAMESPACE/NAME/tls.crt`...). The
xDS port is mutual TLS with meshctl's CA, so a gateway's connection proves its workload; the
gateway's own certificate comes from another CA, as a user's public certificate would.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import envoy_log_left_open, needs_envoy
from cryptography import x509

from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.app import Server
from meshctl.server.auth import XdsTls
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.backends import Backend
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.slow

NS = "edge"
HOST = f"reviews.{NS}.mesh"
ROUTER = f"router~127.0.0.30~ingress.{NS}~{NS}.svc.cluster.local"
OTHER_ROUTER = "router~127.0.0.32~ingress.other~other.svc.cluster.local"
BACKEND = "127.0.0.31"


def mesh_yaml(port: int, backend_port: int, mutual_port: int = 0) -> str:
    """reviews behind an HTTPS gateway in `edge` whose certificate is `credentialName: edge-cert`;
    a gateway in `other` names `other-cert` (its own) and `edge-cert` (not its namespace's)."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews, namespace: {NS}}}
spec: {{address: {BACKEND}, ports: {{http: {backend_port}}}, labels: {{app: reviews}}, serviceAccount: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: ingress, namespace: {NS}}}
spec: {{address: 127.0.0.30, labels: {{istio: ingressgateway}}, serviceAccount: ingress}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {port}, name: https, protocol: HTTPS}}
    hosts: [{HOST}]
    tls: {{mode: SIMPLE, credentialName: edge-cert}}
  - port: {{number: {mutual_port}, name: https-mutual, protocol: HTTPS}}
    hosts: [{HOST}]
    tls: {{mode: MUTUAL, credentialName: edge-mutual, subjectAltNames: [client.partner.example]}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  gateways: [ingress]
  http:
  - route: [{{destination: {{host: {HOST}, port: {{number: 9080}}}}}}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: ingress, namespace: other}}
spec: {{address: 127.0.0.32, labels: {{istio: other-gateway}}, serviceAccount: ingress}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: other}}
spec:
  selector: {{istio: other-gateway}}
  servers:
  - port: {{number: {port}, name: https, protocol: HTTPS}}
    hosts: ["*"]
    tls: {{mode: SIMPLE, credentialNames: [other-cert, edge-cert]}}
"""


def write_secret(root: Path, namespace: str, name: str, issued: IssuedCertificate) -> None:
    """The secret's files, each given its name in one step (as Kubernetes' volume swap does)."""
    directory = root / namespace / name
    directory.mkdir(parents=True, exist_ok=True)
    for file, data in (("tls.crt", issued.cert_chain_pem), ("tls.key", issued.private_key_pem)):
        temporary = directory / f".{file}.tmp"
        temporary.write_bytes(data)
        os.replace(temporary, directory / file)


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.ca = CertificateAuthority.self_signed(self.state)
        #: the CA of the gateway's public certificates: not the mesh's
        self.public = CertificateAuthority.self_signed(tmp / "public")
        self.root = tmp / "root.pem"
        self.root.write_bytes(self.ca.root_pem)
        self.server = self.write(tmp, "server", self.ca.issue_server(ip_addresses=["127.0.0.1"]))
        identity = WorkloadIdentity("cluster.local", NS, "ingress")
        self.router = self.write(tmp, "router", self.ca.issue_client([f"ingress.{NS}"], identity))
        other = WorkloadIdentity("cluster.local", "other", "ingress")
        self.other = self.write(tmp, "other", self.ca.issue_client(["ingress.other"], other))
        self.credentials = tmp / "credentials"
        self.edge_cert = self.public.issue_server(dns_names=[HOST])
        write_secret(self.credentials, NS, "edge-cert", self.edge_cert)
        write_secret(self.credentials, "other", "other-cert", self.public.issue_server(dns_names=["other.mesh"]))
        # MUTUAL: the server's pair, and in ca.crt the CA that signs the clients it accepts.
        write_secret(self.credentials, NS, "edge-mutual", self.public.issue_server(dns_names=[HOST]))
        (self.credentials / NS / "edge-mutual" / "ca.crt").write_bytes(self.public.root_pem)
        self.client = self.write(tmp, "client", self.public.issue_client(["client.partner.example"]))
        self.stranger = self.write(tmp, "stranger", self.public.issue_client(["stranger.example"]))
        self.mesh = tmp / "mesh"
        self.mesh.mkdir()
        self.port = free_port()
        self.backend_port = free_port()
        self.mutual_port = free_port()
        (self.mesh / "mesh.yaml").write_text(mesh_yaml(self.port, self.backend_port, self.mutual_port))

    @staticmethod
    def write(directory: Path, name: str, issued: IssuedCertificate) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(issued.cert_chain_pem)
        key.write_bytes(issued.private_key_pem)
        return cert, key


def _channel(server: Server, setup: Setup, client: tuple[Path, Path]) -> object:
    import grpc

    credentials = grpc.ssl_channel_credentials(setup.ca.root_pem, client[1].read_bytes(), client[0].read_bytes())
    return grpc.aio.secure_channel(f"127.0.0.1:{server.xds_port}", credentials)


def debug_dump(server: Server, node_id: str) -> str:
    url = f"http://127.0.0.1:{server.admin_port}/debug/config_dump?proxyID={urllib.parse.quote(node_id, safe='')}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _chain_secrets(listeners: dict[str, object]) -> list[str]:
    from meshctl.xds.mesh_tls import secret_names

    return sorted(secret_names([], listeners.values()))  # type: ignore[arg-type]


def test_a_proven_gateway_gets_its_namespace_credentials_and_no_other(tmp_path: Path) -> None:
    setup = Setup(tmp_path)

    async def test() -> None:
        tls = XdsTls(setup.server[0], setup.server[1], setup.root)
        async with serving(setup.mesh, tls=tls, state_dir=setup.state, credentials_dir=setup.credentials) as server:
            chan = _channel(server, setup, setup.router)
            async with AdsClient(f"127.0.0.1:{server.xds_port}", ROUTER, channel=chan) as client:  # type: ignore[arg-type]
                await client.wait_for(lambda c: "kubernetes://edge-cert" in c.resources[types.SECRET], timeout=20)
                secret = client.resources[types.SECRET]["kubernetes://edge-cert"]
                held = secret.tls_certificate  # type: ignore[attr-defined]
                assert held.certificate_chain.inline_bytes == setup.edge_cert.cert_chain_pem
                assert held.private_key.inline_bytes == setup.edge_cert.private_key_pem
                assert "kubernetes://edge-cert" in _chain_secrets(client.resources[types.LISTENER])
                # The debug dump shows the secret held, its key redacted as Envoy redacts it.
                dump = await asyncio.to_thread(debug_dump, server, ROUTER)
                assert "PRIVATE KEY" not in dump
                dumped = next(s for s in json.loads(dump)["configs"] if s["@type"].endswith("SecretsConfigDump"))
                [active] = [s for s in dumped["dynamic_active_secrets"] if s["name"] == "kubernetes://edge-cert"]
                assert active["secret"]["tls_certificate"]["private_key"] == {"inline_string": "[redacted]"}
            # A gateway of another namespace that names edge-cert is sent its own secret, never edge-cert.
            chan = _channel(server, setup, setup.other)
            async with AdsClient(f"127.0.0.1:{server.xds_port}", OTHER_ROUTER, channel=chan) as client:  # type: ignore[arg-type]
                await client.wait_for(lambda c: "kubernetes://other-cert" in c.resources[types.SECRET], timeout=20)
                assert _chain_secrets(client.resources[types.LISTENER]) == [
                    "kubernetes://edge-cert",
                    "kubernetes://other-cert",
                ]
                held = {n for n in client.resources[types.SECRET] if n.startswith("kubernetes://")}
                assert held == {"kubernetes://other-cert"}

    run(test)


def test_a_gateway_whose_connection_proves_nothing_gets_no_key_and_no_credential_server(tmp_path: Path) -> None:
    setup = Setup(tmp_path)

    async def test() -> None:
        async with (
            serving(setup.mesh, credentials_dir=setup.credentials) as server,
            AdsClient(f"127.0.0.1:{server.xds_port}", ROUTER) as client,
        ):
            await client.wait_for(lambda c: c.complete(), timeout=20)
            assert client.resources[types.SECRET] == {}
            listeners = client.resources[types.LISTENER]
            assert all(b"kubernetes://" not in m.SerializeToString() for m in listeners.values())
            assert all(
                b"PRIVATE KEY" not in m.SerializeToString() for t in client.resources.values() for m in t.values()
            )

    run(test)


def served_certificate(port: int) -> x509.Certificate:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=HOST) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def mutual_get(setup: Setup, client: tuple[Path, Path] | None) -> int:
    import http.client

    context = ssl.create_default_context(cadata=setup.public.root_pem.decode())
    if client is not None:
        context.load_cert_chain(client[0], client[1])
    sock = socket.create_connection(("127.0.0.1", setup.mutual_port), timeout=10)
    with context.wrap_socket(sock, server_hostname=HOST) as tls:
        conn = http.client.HTTPConnection(HOST, setup.mutual_port, timeout=10)
        conn.sock = tls
        conn.request("GET", "/", headers={"Host": HOST})
        response = conn.getresponse()
        response.read()
        return response.status


def wait_until(what: str, check: Callable[[], bool], log: Callable[[], str], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"{what} not seen after {deadline}s:\n{log()[-12000:]}")
        time.sleep(0.2)


@pytest.mark.e2e
@needs_envoy
@envoy_log_left_open
def test_envoy_serves_the_credential_and_follows_its_rotation_without_a_failed_request(tmp_path: Path) -> None:
    import http.client

    setup = Setup(tmp_path)
    roots = ssl.create_default_context(cadata=setup.public.root_pem.decode())

    def request(conn: http.client.HTTPSConnection) -> int:
        conn.request("GET", "/", headers={"Host": HOST})
        response = conn.getresponse()
        response.read()
        return response.status

    class Connection(http.client.HTTPSConnection):
        """To 127.0.0.1, with the gateway's host as SNI and as the name the certificate must bear."""

        def connect(self) -> None:
            sock = socket.create_connection(("127.0.0.1", setup.port), timeout=10)
            self.sock = roots.wrap_socket(sock, server_hostname=HOST)

    def connect() -> http.client.HTTPSConnection:
        return Connection(HOST, setup.port, timeout=10, context=roots)

    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "cert-chain.pem").write_bytes(setup.router[0].read_bytes())
    (vm / "key.pem").write_bytes(setup.router[1].read_bytes())
    (vm / "root-cert.pem").write_bytes(setup.ca.root_pem)
    flags = [
        "--state-dir", str(setup.state), "--tls-cert", str(setup.server[0]), "--tls-key", str(setup.server[1]),
        "--client-ca", str(setup.root), "--credentials-dir", str(setup.credentials),
    ]  # fmt: skip
    with (
        Backend("reviews", BACKEND, setup.backend_port),
        ServeProcess([setup.mesh], extra_args=flags) as serve,
    ):
        config = serve.bootstrap(ROUTER, extra_args=["--xds-cert-dir", str(vm)])
        with EnvoyProcess(config) as envoy:
            logs = lambda: envoy.log() + serve.log()  # noqa: E731
            first = setup.edge_cert
            serial = x509.load_pem_x509_certificate(first.cert_chain_pem).serial_number
            wait_until(
                "the gateway serving edge-cert", lambda: served_certificate(setup.port).serial_number == serial, logs
            )
            # The client checks the served certificate against the public root and the host name.
            kept = connect()
            assert request(kept) == 200
            failures: list[str] = []
            done = threading.Event()
            sent = [0]

            def loop() -> None:
                while not done.is_set():
                    conn = connect()
                    try:
                        status = request(conn)
                        if status != 200:
                            failures.append(f"status {status}")
                    except (OSError, http.client.HTTPException) as exc:
                        failures.append(repr(exc))
                    finally:
                        conn.close()
                    sent[0] += 1

            worker = threading.Thread(target=loop)
            worker.start()
            try:
                for _ in range(2):
                    rotated = setup.public.issue_server(dns_names=[HOST], lifetime=datetime.timedelta(days=2))
                    write_secret(setup.credentials, NS, "edge-cert", rotated)
                    serial = x509.load_pem_x509_certificate(rotated.cert_chain_pem).serial_number
                    wait_until(
                        "the gateway serving the rotated certificate",
                        lambda serial=serial: served_certificate(setup.port).serial_number == serial,
                        logs,
                    )
            finally:
                done.set()
                worker.join(30)
            assert sent[0] >= 5
            assert failures == []
            # The connection opened before the rotations still serves: nothing was dropped.
            assert request(kept) == 200
            kept.close()
            assert "credentialName" not in serve.log()
            # MUTUAL: the client must present a certificate of the CA in edge-mutual's ca.crt,
            # naming the subjectAltName the server asks for.
            assert mutual_get(setup, setup.client) == 200
            for refused in (None, setup.stranger):
                with pytest.raises((OSError, http.client.HTTPException)):
                    mutual_get(setup, refused)
