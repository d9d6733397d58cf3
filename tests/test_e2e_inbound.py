"""End to end: a real Envoy's `virtualInbound` as iptables REDIRECT uses it, with mutual TLS
modes and HTTP policy on ports no service declares a protocol for.

iptables is not available to tests, so the original destination is fed to Envoy directly: the
generated `virtualInbound` listens on a loopback address, with a PROXY protocol listener filter
after `original_dst` that restores the destination the client names, as the kernel's
SO_ORIGINAL_DST would after a REDIRECT. Everything after that is the generated config as meshctl
serves it (static, with a throwaway CA for the mesh's secrets): the filter chain match on the
original port, the inspectors, mutual TLS, RBAC, and `InboundPassthroughCluster`, which connects
to the original destination (the app on its loopback address) from 127.0.0.6.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import needs_envoy

from meshctl.security.selfsigned import throwaway_certificate
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds import types
from meshctl.xds.generate import generate_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

APP_IP = "127.0.0.31"
NODE = f"sidecar~{APP_IP}~web-1.e2e~e2e.svc.cluster.local"
PROXY_PROTOCOL = {
    "name": "envoy.filters.listener.proxy_protocol",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol"},
}


def mesh_yaml(*, web_port: int, mode: str, extra: str = "") -> str:
    """A workload at APP_IP serving `web` on `web_port`, a port whose protocol is neither declared
    nor implied by its name; `mode` for its namespace."""
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: e2e}}
spec:
  hosts: [web.e2e.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 80, name: web, targetPort: {web_port}}}]
  workloadSelector: {{labels: {{app: web}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: web-1, namespace: e2e}}
spec: {{address: {APP_IP}, labels: {{app: web}}}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: e2e}}
spec: {{mtls: {{mode: {mode}}}}}
{extra}"""


def redirected_envoy(text: str) -> tuple[EnvoyProcess, int]:
    """An Envoy with the proxy's generated clusters and its `virtualInbound`, listening on a
    free loopback port that takes the original destination from a PROXY protocol header; and
    that port."""
    snapshot = snapshot_from_yaml(text)
    generated = generate_config(snapshot, proxy_for(snapshot, NODE, {"INTERCEPTION_MODE": "REDIRECT"}))
    inbound = [item for item in generated[types.LISTENER] if item.name == "virtualInbound"]
    config = bootstrap({types.CLUSTER: generated[types.CLUSTER], types.LISTENER: inbound})
    (listener,) = config["static_resources"]["listeners"]
    port = free_port(APP_IP)
    listener["address"] = {"socket_address": {"address": APP_IP, "port_value": port}}
    assert listener["listener_filters"][0]["name"] == "envoy.filters.listener.original_dst"
    listener["listener_filters"].insert(1, PROXY_PROTOCOL)
    return EnvoyProcess(config), port


def connect(listen_port: int, original_port: int) -> socket.socket:
    """A connection to the proxy as iptables would hand it one for APP_IP:`original_port`."""
    sock = socket.create_connection((APP_IP, listen_port), timeout=5)
    sock.sendall(f"PROXY TCP4 127.0.0.9 {APP_IP} 40000 {original_port}\r\n".encode())
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, ssl.SSLError):
        pass
    return data


def plaintext_get(listen_port: int, original_port: int, path: str = "/") -> bytes:
    """A plaintext HTTP/1.1 GET; the raw response (empty when the proxy closed the connection)."""
    with connect(listen_port, original_port) as sock:
        try:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n".encode())
        except OSError:
            return b""
        return _read_all(sock)


def tls_get(listen_port: int, original_port: int) -> bytes:
    """A GET over the client's own TLS (no ALPN, no client certificate), as an app that
    terminates TLS itself is called; empty when the handshake or the connection fails."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with connect(listen_port, original_port) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="web.e2e.mesh") as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
                return _read_all(sock)
        except (OSError, ssl.SSLError):
            return b""


class TlsApp:
    """An app that terminates its own TLS on APP_IP: every request is answered `tls-app`."""

    def __init__(self, directory: Path) -> None:
        cert, key = throwaway_certificate("web.e2e.mesh")
        (directory / "cert.pem").write_text(cert)
        (directory / "key.pem").write_text(key)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
        self.sock = socket.create_server((APP_IP, 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    with self.context.wrap_socket(conn, server_side=True) as tls:
                        self.handshakes += 1
                        tls.recv(65536)
                        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\ntls-app")
                except (OSError, ssl.SSLError):
                    continue

    def close(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def tls_app(tmp_path: Path) -> Iterator[TlsApp]:
    app = TlsApp(tmp_path)
    try:
        yield app
    finally:
        app.close()


def _status(response: bytes) -> int:
    first = response.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else 0


def test_strict_refuses_plaintext_to_an_undeclared_port_and_permissive_passes_both(tls_app: TlsApp) -> None:
    """Istio's buildInboundPassthroughChains under STRICT (peer_authentication_simulation_test:
    plaintext to a port no service declares fails) and PERMISSIVE (plaintext and an app's own
    TLS pass through to the app)."""
    with Backend("web-app", APP_IP) as app:
        undeclared_http, undeclared_tls = app.port, tls_app.port
        envoy, listen = redirected_envoy(mesh_yaml(web_port=free_port(APP_IP), mode="STRICT"))
        with envoy:
            assert plaintext_get(listen, undeclared_http) == b""
            assert tls_get(listen, undeclared_tls) == b""  # the mesh's handshake, not the app's
            assert (app.served, tls_app.handshakes) == (0, 0)
            stats = envoy.stats()
            assert stats.get("listener.127.0.0.31_" + str(listen) + ".no_filter_chain_match", 0) >= 1
        envoy, listen = redirected_envoy(mesh_yaml(web_port=free_port(APP_IP), mode="PERMISSIVE"))
        with envoy:
            response = plaintext_get(listen, undeclared_http)
            assert _status(response) == 200 and b"web-app" in response
            assert tls_get(listen, undeclared_tls).endswith(b"tls-app")
            assert (app.served, tls_app.handshakes) == (1, 1)


DENY_ADMIN = """---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: e2e}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin"], methods: ["GET"]}}]}]
"""


def test_http_authorization_policy_applies_on_a_port_without_a_protocol() -> None:
    """Protocol sniffing on inbound ports (ListenerProtocolAuto): plaintext HTTP to a port whose
    protocol is not declared reaches a connection manager, so a path rule denies `/admin` and
    lets `/` through (served as TCP, the rule's HTTP fields would deny every connection). The
    port's inbound cluster sends to the app on 127.0.0.1, as on a VM."""
    with Backend("web-app", "127.0.0.1") as app:
        envoy, listen = redirected_envoy(mesh_yaml(web_port=app.port, mode="PERMISSIVE", extra=DENY_ADMIN))
        with envoy:
            allowed = plaintext_get(listen, app.port, "/")
            denied = plaintext_get(listen, app.port, "/admin")
            assert _status(allowed) == 200 and b"web-app" in allowed
            assert _status(denied) == 403
            assert b"RBAC: access denied" in denied
            assert app.served == 1


def test_http_authorization_policy_on_a_sidecar_ingress_port_without_a_protocol_on_a_vm() -> None:
    """The same without iptables (INTERCEPTION_MODE NONE, the VM default): a Sidecar ingress
    listener without a protocol binds the VM's address and sniffs HTTP, so the path rule holds."""
    with Backend("web-app", "127.0.0.1") as app:
        port = free_port(APP_IP)
        sidecar = f"""---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: web, namespace: e2e}}
spec:
  workloadSelector: {{labels: {{app: web}}}}
  ingress: [{{port: {{number: {port}, name: web}}, defaultEndpoint: "127.0.0.1:{app.port}"}}]
"""
        snapshot = snapshot_from_yaml(mesh_yaml(web_port=app.port, mode="PERMISSIVE", extra=DENY_ADMIN + sidecar))
        generated = generate_config(snapshot, proxy_for(snapshot, NODE))
        listeners = [item for item in generated[types.LISTENER] if item.name == f"{APP_IP}_{port}"]
        assert len(listeners) == 1
        config = bootstrap({types.CLUSTER: generated[types.CLUSTER], types.LISTENER: listeners})
        with EnvoyProcess(config):
            allowed = send(port, "web", address=APP_IP)
            denied = send(port, "web", path="/admin", address=APP_IP)
        assert (allowed.status, allowed.backend) == (200, "web-app")
        assert denied.status == 403 and "RBAC: access denied" in denied.body
        assert app.served == 1
