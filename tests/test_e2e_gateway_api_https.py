"""A Gateway API HTTPS listener through a real Envoy: its certificateRef is served over SDS from
`serve --credentials-dir` as Istio names it, `kubernetes-gateway://NAMESPACE/NAME`, and a
replaced certificate reaches the gateway without a restart. The setup (CAs, the gateway's
proven xDS identity, the secrets) is the credentialName test's."""

from __future__ import annotations

import http.client
import socket
import ssl
from pathlib import Path

import pytest
from conftest import envoy_log_left_open, needs_envoy
from cryptography import x509
from test_gateway_credentials import BACKEND, HOST, NS, ROUTER, Setup, served_certificate, wait_until, write_secret

from meshctl.testing.backends import Backend
from meshctl.testing.envoy import EnvoyProcess
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]


def gateway_api_yaml(port: int, backend_port: int) -> str:
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
spec:
  address: 127.0.0.30
  labels: {{gateway.networking.k8s.io/gateway-name: ingress}}
  serviceAccount: ingress
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  gatewayClassName: istio
  listeners:
  - name: https
    port: {port}
    protocol: HTTPS
    hostname: {HOST}
    tls: {{mode: Terminate, certificateRefs: [{{name: edge-cert}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: reviews, namespace: {NS}}}
spec:
  parentRefs: [{{name: ingress}}]
  rules:
  - backendRefs: [{{group: networking.istio.io, kind: Hostname, name: {HOST}, port: 9080}}]
"""


def test_an_https_listener_serves_its_certificate_ref_and_follows_its_rotation(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    (setup.mesh / "mesh.yaml").write_text(gateway_api_yaml(setup.port, setup.backend_port))
    roots = ssl.create_default_context(cadata=setup.public.root_pem.decode())

    def get() -> int:
        sock = socket.create_connection(("127.0.0.1", setup.port), timeout=10)
        conn = http.client.HTTPConnection(HOST, setup.port, timeout=10)
        conn.sock = roots.wrap_socket(sock, server_hostname=HOST)
        try:
            conn.request("GET", "/", headers={"Host": HOST})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

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
            serial = x509.load_pem_x509_certificate(setup.edge_cert.cert_chain_pem).serial_number
            wait_until(
                "the listener serving edge-cert", lambda: served_certificate(setup.port).serial_number == serial, logs
            )
            assert get() == 200  # checked against the public root and the host name
            assert "kubernetes-gateway://edge/edge-cert" in envoy.admin("/config_dump?resource=dynamic_active_secrets")
            rotated = setup.public.issue_server(dns_names=[HOST])
            write_secret(setup.credentials, NS, "edge-cert", rotated)
            serial = x509.load_pem_x509_certificate(rotated.cert_chain_pem).serial_number
            wait_until("the rotated certificate", lambda: served_certificate(setup.port).serial_number == serial, logs)
            assert get() == 200
