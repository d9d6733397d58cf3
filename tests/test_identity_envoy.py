"""End to end: a real Envoy with a client certificate gets the key of the workload it proved and
of no other, whatever IP it claims and whatever happens to its workload afterwards.

`meshctl serve` runs as users run it, with TLS on the xDS port, `--client-ca` and its own root in
a state directory; the xDS client certificates come from the same root (`meshctl ca issue`). What
Envoy holds is read from its admin API: `/certs` lists the workload certificates it was sent
over SDS, `/config_dump` its listeners.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import envoy_log_left_open, needs_envoy, wait_for

from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

NS = "shop"
#: WorkloadEntry a (no serviceAccount) claiming the IP of payments' inline endpoint.
A_AT_PAYMENTS = f"sidecar~127.0.0.31~a.{NS}~{NS}.svc.cluster.local"
#: WorkloadEntry b (no serviceAccount) claiming the IP of WorkloadEntry victim.
B_AT_VICTIM = f"sidecar~127.0.0.34~b.{NS}~{NS}.svc.cluster.local"


def mesh_yaml(payments_port: int, victim_port: int) -> str:
    """payments: a ServiceEntry whose inline endpoint runs as `payments`; victim: a WorkloadEntry
    running as `victim-sa`. Both speak mutual TLS, so a proxy calling them asks for its key."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: payments, namespace: {NS}}}
spec:
  hosts: [payments.{NS}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {payments_port}, name: http, protocol: HTTP}}]
  endpoints:
  - {{address: 127.0.0.31, serviceAccount: payments, labels: {{app: payments, security.istio.io/tlsMode: istio}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: victim, namespace: {NS}}}
spec:
  hosts: [victim.{NS}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {victim_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: victim}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: victim, namespace: {NS}}}
spec: {{address: 127.0.0.34, serviceAccount: victim-sa, labels: {{app: victim, security.istio.io/tlsMode: istio}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: a, namespace: {NS}}}
spec: {{address: 127.0.0.32, labels: {{app: a}}}}
"""


B_ENTRY = f"""apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: b, namespace: {NS}}}
spec: {{address: 127.0.0.33, labels: {{app: b}}}}
"""


class Pki:
    """meshctl's own root in a state directory: it signs the xDS certificates and the workloads'."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.state = directory / "state"
        self.ca = CertificateAuthority.self_signed(self.state)
        self.root = directory / "root.pem"
        self.root.write_bytes(self.ca.root_pem)
        self.server = self.write("server", self.ca.issue_server(ip_addresses=["127.0.0.1"]))

    def write(self, name: str, issued: IssuedCertificate) -> tuple[Path, Path]:
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert.write_bytes(issued.cert_chain_pem)
        key.write_bytes(issued.private_key_pem)
        return cert, key

    def client(self, name: str, dns: list[str], account: str | None = None) -> list[str]:
        """`meshctl bootstrap` flags presenting a new client certificate."""
        identity = WorkloadIdentity("cluster.local", NS, account) if account else None
        cert, key = self.write(name, self.ca.issue_client(dns, identity))
        return ["--xds-ca", str(self.root), "--xds-cert", str(cert), "--xds-key", str(key)]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServeProcess, Pki, Path]]:
    pki = Pki(tmp_path)
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(mesh_yaml(free_port(), free_port()))
    (mesh / "b.yaml").write_text(B_ENTRY)
    cert, key = pki.server
    flags = [
        "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(pki.root), "--state-dir", str(pki.state),
    ]  # fmt: skip
    with ServeProcess([mesh], extra_args=flags) as serve:
        yield serve, pki, mesh


def certificates(envoy: EnvoyProcess) -> set[str]:
    """The URI SANs of the certificate chains in Envoy's /certs that it was sent inline (over
    SDS): the xDS client certificate it presents itself is read from a file, and listed by path."""
    found = json.loads(envoy.admin("certs"))["certificates"]
    return {
        san["uri"]
        for entry in found
        for chain in entry.get("cert_chain", [])
        if chain.get("path") == "<inline>"
        for san in chain.get("subject_alt_names", [])
        if "uri" in san
    }


def accounts(envoy: EnvoyProcess) -> set[str]:
    return {uri.rpartition("/sa/")[2] for uri in certificates(envoy)}


def test_a_proxy_claiming_a_registry_endpoints_ip_gets_no_foreign_key(served: tuple[ServeProcess, Pki, Path]) -> None:
    serve, pki, _ = served
    # A certificate saying payments, for a node naming WorkloadEntry a: a runs as default.
    impostor = serve.bootstrap(A_AT_PAYMENTS, extra_args=pki.client("impostor", [], "payments"))
    # a's own certificate (its DNS name) with payments' IP: bound to a alone.
    own = serve.bootstrap(A_AT_PAYMENTS, extra_args=pki.client("a", [f"a.{NS}"]))
    with EnvoyProcess(impostor, wait_live=False) as refused, EnvoyProcess(own) as envoy:
        wait_for(lambda: accounts(envoy) == {"default"}, "a's own certificate in Envoy's /certs", envoy.log)
        wait_for(
            lambda: f"refused node {A_AT_PAYMENTS}" in serve.log() and "sa/default" in serve.log(),
            "the impostor refused at connect",
            serve.log,
        )
        assert certificates(envoy) == {f"spiffe://cluster.local/ns/{NS}/sa/default"}
        listeners = envoy.admin("config_dump?resource=dynamic_listeners")
        assert "inbound|" not in listeners and "payments" not in listeners.replace(f"payments.{NS}.mesh", "")
        assert certificates(refused) == set() and "outbound|" not in refused.admin("clusters")


def test_a_proxy_whose_workload_is_deleted_is_ended_not_rebound_by_ip(
    served: tuple[ServeProcess, Pki, Path],
) -> None:
    serve, pki, mesh = served
    config = serve.bootstrap(B_AT_VICTIM, extra_args=pki.client("b", [f"b.{NS}"]))
    with EnvoyProcess(config) as envoy:
        wait_for(lambda: accounts(envoy) == {"default"}, "b's certificate in Envoy's /certs", envoy.log)
        # The VM is decommissioned: its WorkloadEntry leaves the served directory.
        (mesh / "b.yaml").unlink()
        wait_for(
            lambda: f"ended the stream of proxy {B_AT_VICTIM}" in serve.log(),
            "b's stream ended when its workload went",
            serve.log,
        )
        # Envoy reconnects, and b's certificate proves nothing about victim at that IP.
        wait_for(lambda: f"refused node {B_AT_VICTIM}" in serve.log(), "b's reconnect refused", serve.log)
        assert accounts(envoy) == {"default"}
    assert f"issued spiffe://cluster.local/ns/{NS}/sa/victim-sa" not in serve.log()
