"""End to end: a grpcio client's mutual TLS from xDS (ISTIO_MUTUAL), with its certificates from
the files `meshctl ca issue` writes, read by the certificate provider `meshctl bootstrap --grpc
--cert-dir` declares.

The server is a plain gRPC TLS server that requires a client certificate of the mesh's root (its
own a workload certificate of the same CA, for the service account its WorkloadEntry names): a call
only succeeds when the client did the mesh's mutual TLS, which it takes from meshctl alone.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.security.selfsigned import load_or_create_root
from meshctl.testing.envoy import free_port
from meshctl.testing.grpc_apps import NamedServer, XdsClient
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "shop"
HOST = f"echo.{NS}.mesh"
IMPOSTOR = f"impostor.{NS}.mesh"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"


def mesh(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  ports: [{{number: {port}, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: echo}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: echo-v1, namespace: {NS}}}
spec: {{address: 127.0.0.2, serviceAccount: echo, labels: {{app: echo}}}}
---
# The same server under another name, said to run as another service account: not who it is.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: impostor, namespace: {NS}}}
spec:
  hosts: [{IMPOSTOR}]
  location: MESH_INTERNAL
  ports: [{{number: {port}, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: impostor}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: impostor, namespace: {NS}}}
spec: {{address: 127.0.0.2, serviceAccount: reviews, labels: {{app: impostor}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: impostor, namespace: {NS}}}
spec:
  host: {IMPOSTOR}
  trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: echo, namespace: {NS}}}
spec:
  host: {HOST}
  trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}
"""


def workload_certificate(state: Path, account: str) -> IssuedCertificate:
    """A workload's certificate for serving and calling (what Envoys are sent over SDS) from the
    root `meshctl ca issue` made in `state`."""
    root = load_or_create_root(state, "cluster.local", datetime.now(UTC))
    authority = CertificateAuthority(root.material, source=str(root.directory))
    return authority.issue_workload(WorkloadIdentity("cluster.local", NS, account))


def issue(state: Path, proxy: str, account: str, out: Path) -> Path:
    subprocess.run(
        [*meshctl_command(), "ca", "issue", "--proxy", proxy, "--service-account", account, "--out", str(out),
         "--state-dir", str(state)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


class Mesh:
    def __init__(self, serve: ServeProcess, port: int, client_certs: Path) -> None:
        self.serve, self.port, self.client_certs = serve, port, client_certs

    def client(self, *, xds_credentials: bool, host: str = HOST) -> XdsClient:
        command = [*meshctl_command(), "bootstrap", "--grpc", "--proxy", CLIENT]
        command += ["--xds-address", self.serve.xds_address, "--cert-dir", str(self.client_certs)]
        printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        bootstrap: dict[str, Any] = json.loads(printed)
        return XdsClient(f"{host}:{self.port}", bootstrap, xds_credentials=xds_credentials)


@pytest.fixture
def mtls_mesh(tmp_path: Path) -> Iterator[Mesh]:
    port = free_port()
    state = tmp_path / "state"
    client_certs = issue(state, f"client.{NS}", "client", tmp_path / "client")
    served = workload_certificate(state, "echo")
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(mesh(port))
    credentials = grpc.ssl_server_credentials(
        [(served.private_key_pem, served.cert_chain_pem)],
        root_certificates=(client_certs / "root-cert.pem").read_bytes(),
        require_client_auth=True,
    )
    with ExitStack() as stack:
        stack.enter_context(NamedServer(f"127.0.0.2:{port}", "v1", credentials=credentials))
        serve = stack.enter_context(ServeProcess([config], extra_args=["--state-dir", str(state)]))
        yield Mesh(serve, port, client_certs)


def test_istio_mutual_from_xds_reaches_a_server_that_requires_mesh_certificates(mtls_mesh: Mesh) -> None:
    with mtls_mesh.client(xds_credentials=True) as client:
        assert client.calls(5) == ({"v1": 5}, {})
    # The TLS is xDS's: the same client without xDS credentials speaks plaintext, and is refused.
    with mtls_mesh.client(xds_credentials=False) as client:
        assert client.calls(3) == ({}, {grpc.StatusCode.UNAVAILABLE.name: 3})


def test_a_server_whose_identity_is_not_the_services_is_refused(mtls_mesh: Mesh) -> None:
    with mtls_mesh.client(xds_credentials=True) as client:
        assert client.calls(3) == ({"v1": 3}, {})
    # The same server and certificate, for a service the mesh says runs as another account.
    with mtls_mesh.client(xds_credentials=True, host=IMPOSTOR) as client:
        assert client.calls(3) == ({}, {grpc.StatusCode.UNAVAILABLE.name: 3})
