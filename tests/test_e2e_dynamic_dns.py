"""DYNAMIC_DNS ServiceEntries and outbound policy ALLOW_ANY_DYNAMIC_DNS through a real Envoy:
Envoy's dynamic forward proxy resolves the name each request gives (HTTP Host, TLS SNI) and
connects there, as Istio's sidecars do (pilot's TestSidecarDynamicDNSClusters and
TestSidecarDynamicDNSFilters; the integration test TestAllowAnyDynamicDNSPolicy).

Names resolve through a DNS server of the test's own (`meshctl.testing.dns`), which the Envoy's
bootstrap names as its resolver: `*.localtest.example` to the backend's loopback address, and
nothing else. Before, the entry was left out of the mesh (no cluster, listener or route) and
ALLOW_ANY_DYNAMIC_DNS was refused by MeshConfig validation.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_envoy

from meshctl.config.mesh import MeshSettings, mesh_settings
from meshctl.testing.backends import Backend, Reply, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.dns import DnsServer
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.testing.serve_process import ServeProcess
from meshctl.xds import types
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

CLIENT = "sidecar~127.0.0.9~client.egress~egress.svc.cluster.local"
#: Where the names resolve: not 127.0.0.1, where the sidecar's own outbound listener is.
BACKEND_IP = "127.0.0.73"
OTHER_IP = "127.0.0.74"


def entry(http_port: int, tls_port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: wildcard, namespace: egress}}
spec:
  hosts: ["*.localtest.example"]
  location: MESH_EXTERNAL
  resolution: DYNAMIC_DNS
  ports:
  - {{number: {http_port}, name: http, protocol: HTTP}}
  - {{number: {tls_port}, name: tls, protocol: TLS}}
"""


def mesh(mode: str, max_hosts: int, tls: dict[str, Any] | None = None) -> MeshSettings:
    outbound: dict[str, Any] = {"mode": mode, **({"tls": tls} if tls else {})}
    settings, findings = mesh_settings({"outboundTrafficPolicy": outbound, "dnsCacheMaxHosts": max_hosts})
    assert settings is not None, findings
    return settings


def resources(
    mode: str, http_port: int, tls_port: int, *, max_hosts: int = 16, tls: dict[str, Any] | None = None
) -> dict[str, Any]:
    snapshot = snapshot_from_yaml(entry(http_port, tls_port), mesh=mesh(mode, max_hosts, tls))
    return generate(snapshot, proxy_for(snapshot, CLIENT))


def envoy_config(generated: dict[str, Any], dns: DnsServer) -> dict[str, Any]:
    config = bootstrap(generated, node_id=CLIENT)
    config["typed_dns_resolver_config"] = dns.resolver_config()
    return config


def first_answer(port: int, host: str) -> Reply:
    """The first reply that is not Envoy still starting (no listener yet)."""
    deadline = time.monotonic() + 30
    reply = send(port, host)
    while reply.status == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        reply = send(port, host)
    return reply


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with DnsServer({"localtest.example": BACKEND_IP, "anywhere.example": OTHER_IP}) as server:
        yield server


def test_http_to_any_name_under_the_wildcard_reaches_what_it_resolves_to(dns: DnsServer) -> None:
    """TestSidecarDynamicDNSFilters (HTTP): the request's Host is resolved by the proxy; a host
    the entry does not cover follows REGISTRY_ONLY (502)."""
    port = free_port()
    generated = resources("REGISTRY_ONLY", port, free_port())
    names = {c.name for c in generated[types.CLUSTER]}
    assert f"outbound|{port}||*.localtest.example" in names
    with Backend("wild", BACKEND_IP, port=port) as backend, EnvoyProcess(envoy_config(generated, dns)):
        first = first_answer(port, f"a.localtest.example:{port}")
        assert (first.status, first.backend) == (200, "wild"), first
        assert send(port, f"b.c.localtest.example:{port}").backend == "wild"
        assert backend.served == 2
        assert {"a.localtest.example", "b.c.localtest.example"} <= set(dns.queries)
        outside = send(port, f"x.anywhere.example:{port}")
        assert outside.status == 502, outside
        assert "x.anywhere.example" not in dns.queries
        # An app on a VM without iptables can use the sidecar as its HTTP proxy: the request
        # line's absolute URL gives the host.
        assert _absolute_form(port, f"http://d.localtest.example:{port}/x").startswith("HTTP/1.1 200")
        assert backend.served == 3


def _absolute_form(port: int, url: str) -> str:
    """The status line of `GET URL` sent in absolute form, as a client sends it to its proxy."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"GET {url} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        return conn.makefile("rb").readline().decode()


def test_the_dns_cache_holds_no_more_names_than_dnsCacheMaxHosts(dns: DnsServer) -> None:
    """A client cannot make the proxy resolve and keep names without end: past the bound a
    request for a new name gets Envoy's 503, while the names already held keep working."""
    port = free_port()
    generated = resources("REGISTRY_ONLY", port, free_port(), max_hosts=2)
    with Backend("wild", BACKEND_IP, port=port), EnvoyProcess(envoy_config(generated, dns)):
        assert first_answer(port, f"a.localtest.example:{port}").backend == "wild"
        assert send(port, f"b.localtest.example:{port}").backend == "wild"
        overflow = send(port, f"c.localtest.example:{port}")
        assert (overflow.status, overflow.body) == (503, "DNS cache overflow"), overflow
        assert send(port, f"a.localtest.example:{port}").backend == "wild"


def test_allow_any_dynamic_dns_sends_http_for_unknown_hosts_through_the_forward_proxy(dns: DnsServer) -> None:
    """TestAllowAnyDynamicDNSPolicy: HTTP for a host no service declares is resolved by its Host
    and reaches it, on a VM without iptables too, where ALLOW_ANY can only answer 502."""
    port = free_port()
    with Backend("anywhere", OTHER_IP, port=port) as backend:
        with EnvoyProcess(envoy_config(resources("ALLOW_ANY", port, free_port()), dns)):
            assert first_answer(port, f"x.anywhere.example:{port}").status == 502
        generated = resources("ALLOW_ANY_DYNAMIC_DNS", port, free_port())
        assert "AllowAnyDynamicDNSCluster" in {c.name for c in generated[types.CLUSTER]}
        with EnvoyProcess(envoy_config(generated, dns)):
            reply = first_answer(port, f"x.anywhere.example:{port}")
            assert (reply.status, reply.backend) == (200, "anywhere"), reply
            # The entry's own hosts still go to the entry's cluster, resolved in its own cache,
            # to BACKEND_IP, where nothing listens in this test.
            assert send(port, f"a.localtest.example:{port}").status == 503
        assert backend.served == 1


class _TlsEcho:
    """A TLS server that answers each connection with the SNI it was sent."""

    def __init__(self, host: str, port: int, cert: Path, key: Path) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        self.seen: list[str] = []
        self._context.sni_callback = lambda sock, name, ctx: self.seen.append(name or "") and None
        self._sock = socket.create_server((host, port))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                with self._context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"hello " + (self.seen[-1] if self.seen else "").encode())
            except (OSError, ssl.SSLError):
                continue

    def __enter__(self) -> _TlsEcho:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        self._thread.join(timeout=5)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from meshctl.security.selfsigned import throwaway_certificate

    cert, key = throwaway_certificate("a.localtest.example")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_text(cert)
    key_path.write_text(key)
    return cert_path, key_path


def _tls_call(port: int, sni: str) -> str:
    """Open TLS to the sidecar's listener with `sni` (no certificate check: the point is where
    the connection goes); what the server says, or the error."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=sni) as tls,
        ):
            return tls.recv(100).decode()
    except (OSError, ssl.SSLError) as exc:
        return f"error: {type(exc).__name__}"


def test_tls_is_routed_by_its_sni_to_what_the_sni_resolves_to(dns: DnsServer, tmp_path: Path) -> None:
    """TestSidecarDynamicDNSFilters (TLS): the SNI under the wildcard is resolved on the service
    port and the connection passed through; an SNI outside the entry finds no chain."""
    tls_port = free_port()
    generated = resources("REGISTRY_ONLY", free_port(), tls_port)
    cert, key = _self_signed(tmp_path)
    with _TlsEcho(BACKEND_IP, tls_port, cert, key), EnvoyProcess(envoy_config(generated, dns)):
        deadline = time.monotonic() + 30
        answer = _tls_call(tls_port, "a.localtest.example")
        while answer.startswith("error") and time.monotonic() < deadline:
            time.sleep(0.2)
            answer = _tls_call(tls_port, "a.localtest.example")
        assert answer == "hello a.localtest.example"
        assert _tls_call(tls_port, "x.anywhere.example").startswith("error")


def test_a_dynamic_dns_entry_written_while_serving_reaches_envoy_over_ads(dns: DnsServer, tmp_path: Path) -> None:
    """Through `meshctl serve` and an Envoy from `meshctl bootstrap`: the entry, written while
    both run, is pushed and accepted (Envoy takes the DFP cluster, filters and routes over ADS),
    and traffic to names under the wildcard flows; removing the entry takes the listener away."""
    port = free_port()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "client.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: egress}\n"
        "spec: {egress: [{hosts: ['./*']}]}\n"
    )
    with (
        Backend("wild", BACKEND_IP, port=port) as backend,
        ServeProcess([config]) as server,
    ):
        envoy_bootstrap = server.bootstrap(CLIENT)
        envoy_bootstrap["typed_dns_resolver_config"] = dns.resolver_config()
        with EnvoyProcess(envoy_bootstrap):
            assert send(port, f"a.localtest.example:{port}").status == 0  # no listener yet
            (config / "wildcard.yaml").write_text(entry(port, free_port()))
            deadline = time.monotonic() + 30
            while not send(port, f"a.localtest.example:{port}").ok and time.monotonic() < deadline:
                time.sleep(0.1)
            reply = send(port, f"z.localtest.example:{port}")
            assert (reply.status, reply.backend) == (200, "wild"), reply
            assert backend.served >= 2
            (config / "wildcard.yaml").unlink()
            deadline = time.monotonic() + 30
            while send(port, f"a.localtest.example:{port}").status != 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert send(port, f"a.localtest.example:{port}").status == 0


class _HttpsBackend:
    """An HTTPS server answering every GET with 200 and the SNI it was reached by."""

    def __init__(self, host: str, port: int, cert: Path, key: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        seen: list[str] = []
        context.sni_callback = lambda sock, name, ctx: seen.append(name or "") and None
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"over tls"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> _HttpsBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def test_allow_any_dynamic_dns_originates_the_meshs_outbound_tls(dns: DnsServer, tmp_path: Path) -> None:
    """Istio's TestAllowAnyDynamicDNSWithTLS: the app speaks plaintext HTTP, the forward proxy
    resolves the Host and originates TLS (`outboundTrafficPolicy.tls`), naming the host in its
    SNI."""
    port = free_port()
    cert, key = _self_signed(tmp_path)
    tls = {"mode": "SIMPLE", "insecureSkipVerify": True}
    generated = resources("ALLOW_ANY_DYNAMIC_DNS", port, free_port(), tls=tls)
    with _HttpsBackend(OTHER_IP, port, cert, key) as backend, EnvoyProcess(envoy_config(generated, dns)):
        reply = first_answer(port, f"x.anywhere.example:{port}")
        assert (reply.status, reply.body) == (200, "over tls"), reply
        assert backend.seen == ["x.anywhere.example"]
