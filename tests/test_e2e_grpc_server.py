"""End to end: a proxyless gRPC server (`grpc.server(xds=True)`, `xds_server_credentials`) gets its
listener from `meshctl serve` and serves, plaintext or, under a STRICT PeerAuthentication, only
the mesh's mutual TLS, with its certificate from the workload's files.

Server and client are grpcio processes started from `meshctl bootstrap --grpc` output, the
server as the WorkloadEntry's workload (its node id carries the entry's address).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshctl.security.ca import CertificateAuthority
from meshctl.security.identity import WorkloadIdentity
from meshctl.security.selfsigned import load_or_create_root
from meshctl.testing.envoy import free_port
from meshctl.testing.grpc_apps import XdsClient, XdsServer
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "shop"
HOST = f"echo.{NS}.mesh"
#: A server serves once its listener comes: calls are retried until then, within this.
SERVING = 20.0


DENY_CLIENT = f"""---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-client, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: echo}}}}
  action: DENY
  rules: [{{from: [{{source: {{principals: [cluster.local/ns/{NS}/sa/client]}}}}]}}]
"""


def mesh(port: int, strict: bool) -> str:
    text = f"""apiVersion: networking.istio.io/v1
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
"""
    if strict:
        text += f"""---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {NS}}}
spec: {{mtls: {{mode: STRICT}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: echo, namespace: {NS}}}
spec:
  host: {HOST}
  trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}
"""
    return text


def workload_files(state: Path, account: str, out: Path) -> Path:
    """A workload's certificate (serving and calling), key and root, as `meshctl ca issue` lays
    them out, from the root in `state` (made when missing)."""
    root = load_or_create_root(state, "cluster.local", datetime.now(UTC))
    issued = CertificateAuthority(root.material, source=str(root.directory)).issue_workload(
        WorkloadIdentity("cluster.local", NS, account)
    )
    out.mkdir()
    (out / "cert-chain.pem").write_bytes(issued.cert_chain_pem)
    (out / "key.pem").write_bytes(issued.private_key_pem)
    (out / "root-cert.pem").write_bytes(root.material.root_pem)
    return out


class Mesh:
    def __init__(self, serve: ServeProcess, port: int, certs: Path) -> None:
        self.serve, self.port, self.certs = serve, port, certs

    def bootstrap(self, proxy: str, ip: str, certs: Path) -> dict[str, Any]:
        command = [*meshctl_command(), "bootstrap", "--grpc", "--proxy", proxy, "--ip", ip]
        command += ["--xds-address", self.serve.xds_address, "--cert-dir", str(certs)]
        printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        result: dict[str, Any] = json.loads(printed)
        return result

    def client(self, *, xds_credentials: bool) -> XdsClient:
        bootstrap = self.bootstrap(f"client.{NS}", "127.0.0.9", self.certs / "client")
        return XdsClient(f"{HOST}:{self.port}", bootstrap, xds_credentials=xds_credentials, timeout=2.0)

    def server(self) -> XdsServer:
        bootstrap = self.bootstrap(f"echo-v1.{NS}", "127.0.0.2", self.certs / "server")
        return XdsServer(f"127.0.0.2:{self.port}", "v1", bootstrap)


def until_served(client: XdsClient) -> None:
    deadline = time.monotonic() + SERVING
    while True:
        replies, errors = client.calls(1)
        if replies == {"v1": 1}:
            return
        assert time.monotonic() < deadline, f"the xDS server never served: {errors}"


def make_mesh(tmp_path: Path, strict: bool, extra: str = "") -> Iterator[Mesh]:
    port = free_port()
    state = tmp_path / "state"
    certs = tmp_path / "certs"
    certs.mkdir()
    workload_files(state, "echo", certs / "server")
    workload_files(state, "client", certs / "client")
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(mesh(port, strict) + extra)
    with ExitStack() as stack:
        serve = stack.enter_context(ServeProcess([config], extra_args=["--state-dir", str(state)]))
        built = Mesh(serve, port, certs)
        stack.enter_context(built.server())
        yield built


@pytest.fixture
def plain_mesh(tmp_path: Path) -> Iterator[Mesh]:
    yield from make_mesh(tmp_path, strict=False)


@pytest.fixture
def strict_mesh(tmp_path: Path) -> Iterator[Mesh]:
    yield from make_mesh(tmp_path, strict=True)


@pytest.fixture
def denying_mesh(tmp_path: Path) -> Iterator[Mesh]:
    yield from make_mesh(tmp_path, strict=True, extra=DENY_CLIENT)


def test_a_grpc_xds_server_serves_once_meshctl_sends_its_listener(plain_mesh: Mesh) -> None:
    with plain_mesh.client(xds_credentials=False) as client:
        until_served(client)
        assert client.calls(5) == ({"v1": 5}, {})


def test_strict_serves_the_mesh_mutual_tls_and_refuses_plaintext(strict_mesh: Mesh) -> None:
    with strict_mesh.client(xds_credentials=True) as client:
        until_served(client)
        assert client.calls(5) == ({"v1": 5}, {})
    with strict_mesh.client(xds_credentials=False) as client:
        assert client.calls(3) == ({}, {grpc.StatusCode.UNAVAILABLE.name: 3})


def test_an_authorization_policy_denying_the_client_fails_its_calls(denying_mesh: Mesh) -> None:
    with denying_mesh.client(xds_credentials=True) as client:
        deadline = time.monotonic() + SERVING
        while True:  # until the server serves (and so enforces its listener's policy)
            replies, errors = client.calls(1)
            if errors == {grpc.StatusCode.PERMISSION_DENIED.name: 1}:
                break
            assert not replies, "a call the policy denies was served"
            assert time.monotonic() < deadline, f"the xDS server never served: {errors}"
        assert client.calls(3) == ({}, {grpc.StatusCode.PERMISSION_DENIED.name: 3})
