"""End to end: workload mutual TLS between real Envoys, with certificates meshctl issues over SDS.

Two VMs on loopback addresses: a server VM (`reviews`, its app behind a Sidecar ingress listener
on the VM's address, as a VM without iptables takes inbound traffic) and a client VM without a
workload of its own. `meshctl serve` runs as users run it, with its own self-signed root in a
state directory and `--insecure-send-keys` (loopback: no client certificates on the xDS port).

The client reaches reviews through its outbound listener; auto mTLS makes that hop mutual TLS
because the WorkloadEntry says it runs a proxy (`security.istio.io/tlsMode: istio`). What proves
it: the server Envoy's TLS handshake counter, and the client certificate's SPIFFE URI in the
`x-forwarded-client-cert` header the server Envoy adds for the app.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, RequestLoop, send
from meshctl.testing.builders import vm_behind_ingress_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"reviews.{NS}.mesh"
SERVER_IP = "127.0.0.21"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
SERVER = f"sidecar~{SERVER_IP}~reviews-v1.{NS}~{NS}.svc.cluster.local"
CLIENT_IDENTITY = f"spiffe://cluster.local/ns/{NS}/sa/default"
SERVER_IDENTITY = f"spiffe://cluster.local/ns/{NS}/sa/reviews"


def mesh_yaml(service_port: int, ingress_port: int, app_port: int) -> str:
    return vm_behind_ingress_yaml(
        namespace=NS,
        host=HOST,
        address=SERVER_IP,
        service_port=service_port,
        ingress_port=ingress_port,
        app_port=app_port,
    )


def peer_authentication(mode: str) -> str:
    return f"""apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {NS}}}
spec:
  mtls: {{mode: {mode}}}
"""


class Mesh:
    def __init__(self, root: Path, stack: ExitStack, *, lifetime: str = "24h") -> None:
        self.dir = root / "mesh"
        self.dir.mkdir()
        self.service_port, self.ingress_port = free_port(), free_port(SERVER_IP)
        self.app = stack.enter_context(Backend("reviews", "127.0.0.1"))
        self.write("mesh.yaml", mesh_yaml(self.service_port, self.ingress_port, self.app.port))
        args = ["--insecure-send-keys", "--workload-cert-lifetime", lifetime]
        self.server = stack.enter_context(ServeProcess([self.dir], extra_args=args))
        stack.callback(lambda: print(f"--- meshctl serve log:\n{self.server.log()[-6000:]}"))
        self.reviews = self._envoy(stack, SERVER)
        self.client = self._envoy(stack, CLIENT)

    def _envoy(self, stack: ExitStack, node_id: str) -> EnvoyProcess:
        envoy = stack.enter_context(EnvoyProcess(self.server.bootstrap(node_id)))
        stack.callback(lambda: print(f"--- envoy {node_id} log:\n{envoy.log()[-4000:]}"))
        return envoy

    def write(self, name: str, text: str) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def through_mesh(self) -> object:
        return send(self.service_port, HOST)

    def straight_to_server(self) -> object:
        """Plaintext to the server VM's inbound port, as a client outside the mesh would."""
        return send(self.ingress_port, HOST, address=SERVER_IP)

    def handshakes(self) -> int:
        stats = dict(line.split(": ", 1) for line in self.reviews.admin("stats").splitlines() if ": " in line)
        return int(stats.get(f"listener.{SERVER_IP}_{self.ingress_port}.ssl.handshake", "0"))

    def server_certificate_serial(self) -> str:
        certs = json.loads(self.reviews.admin("certs"))["certificates"]
        chains = [c for entry in certs for c in entry.get("cert_chain", [])]
        return next(
            c["serial_number"]
            for c in chains
            if any(s.get("uri") == SERVER_IDENTITY for s in c.get("subject_alt_names", []))
        )


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with ExitStack() as stack:
        yield Mesh(tmp_path, stack)


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def test_mesh_traffic_is_mutual_tls_and_each_mode_does_what_it_says(mesh: Mesh) -> None:
    wait_for(lambda: mesh.through_mesh().ok, "the client reaches reviews through the mesh")  # type: ignore[attr-defined]
    # PERMISSIVE (no policy): the mesh hop is mutual TLS, carrying the client's SPIFFE identity...
    assert mesh.through_mesh().ok  # type: ignore[attr-defined]
    assert mesh.handshakes() >= 1  # the client Envoy keeps the connection: one handshake is enough
    xfcc = mesh.app.last_headers.get("x-forwarded-client-cert", "")
    assert f"URI={CLIENT_IDENTITY}" in xfcc and f"By={SERVER_IDENTITY}" in xfcc, xfcc
    # ... and a plaintext client outside the mesh still gets in.
    assert mesh.straight_to_server().ok  # type: ignore[attr-defined]

    # STRICT: plaintext straight to the server is refused; the mesh keeps working.
    mesh.write("peer.yaml", peer_authentication("STRICT"))
    wait_for(lambda: not mesh.straight_to_server().ok, "STRICT refuses plaintext")  # type: ignore[attr-defined]
    assert mesh.straight_to_server().status == 0  # type: ignore[attr-defined]  # no HTTP answer at all
    for _ in range(5):
        assert mesh.through_mesh().ok  # type: ignore[attr-defined]

    # DISABLE: plaintext everywhere; the client stops using TLS for the namespace.
    mesh.write("peer.yaml", peer_authentication("DISABLE"))
    wait_for(lambda: mesh.straight_to_server().ok, "DISABLE accepts plaintext")  # type: ignore[attr-defined]
    wait_for(lambda: mesh.through_mesh().ok, "the mesh goes plaintext")  # type: ignore[attr-defined]
    handshakes = mesh.handshakes()
    for _ in range(5):
        assert mesh.through_mesh().ok  # type: ignore[attr-defined]
    assert mesh.handshakes() == handshakes
    assert "x-forwarded-client-cert" not in mesh.app.last_headers


def test_certificates_rotate_under_traffic_without_a_failed_request(tmp_path: Path) -> None:
    with ExitStack() as stack:
        mesh = Mesh(tmp_path, stack, lifetime="6s")  # renewed after 4 s
        wait_for(lambda: mesh.through_mesh().ok, "the client reaches reviews through the mesh")  # type: ignore[attr-defined]
        first = mesh.server_certificate_serial()
        with RequestLoop(mesh.service_port, HOST) as loop:
            wait_for(lambda: mesh.server_certificate_serial() != first, "the server's certificate is renewed", 30)
            second = mesh.server_certificate_serial()
            wait_for(lambda: mesh.server_certificate_serial() != second, "and renewed again", 30)
            loop.wait_for_answers(20)
        assert loop.failures == []
        assert loop.succeeded > 20
