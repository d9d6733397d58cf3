"""A real Envoy running a router's generated config: the HTTP settings Istio gives gateways.

A Gateway on a port the kernel picks exposes `reviews.edge.mesh` through a VirtualService to one
backend on its own loopback address. The router's config comes from the generators the server
runs (snapshot_from_yaml -> proxy_for -> generate), in a static bootstrap. Each test names the
Istio function whose behaviour it checks.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy

from meshctl.testing.backends import Backend
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

NS = "edge"
HOST = f"reviews.{NS}.mesh"
ROUTER = f"router~127.0.0.30~ingress.{NS}~{NS}.svc.cluster.local"
ROUTER_META = {"LABELS": {"istio": "ingressgateway"}}
BACKEND_ADDRESS = "127.0.0.31"


def mesh_yaml(gateway_port: int, upstream: Backend) -> str:
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
spec:
  address: {BACKEND_ADDRESS}
  ports: {{http: {upstream.port}}}
  labels: {{app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http, protocol: HTTP}}
    hosts: [{HOST}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  gateways: [ingress]
  http:
  - route: [{{destination: {{host: {HOST}, port: {{number: 9080}}}}}}]
"""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class Gateway:
    port: int
    upstream: Backend

    def request(
        self, authority: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE)
        try:
            conn.request(method, "/", body=body, headers={"Host": authority, **(headers or {})})
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
        finally:
            conn.close()


def _wait_until_routing(gateway: Gateway) -> None:
    """Envoy reports LIVE before its listener takes connections on a loaded machine; wait for a 200."""
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        try:
            reply = gateway.request(HOST)
            if reply.status == 200:
                return
            last = reply
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"the gateway did not route within {DEADLINE:.0f}s: {last!r}")


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with ExitStack() as stack:
        upstream = stack.enter_context(Backend("reviews", BACKEND_ADDRESS))
        port = free_port()
        snapshot = snapshot_from_yaml(mesh_yaml(port, upstream), namespace=NS)
        resources = generate(snapshot, proxy_for(snapshot, ROUTER, ROUTER_META))
        envoy = stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=ROUTER)))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        gw = Gateway(port, upstream)
        _wait_until_routing(gw)
        yield gw


def test_host_header_with_another_port_routes(gateway: Gateway) -> None:
    """buildGatewayHTTPRouteConfig sets IgnorePortInHostMatching: the virtual host answers to
    `reviews.edge.mesh` with any port (a gRPC client always sends one); other hosts get 404."""
    for authority in (HOST, f"{HOST}:12345", f"{HOST}:{gateway.port}"):
        reply = gateway.request(authority)
        assert (reply.status, reply.body) == (200, "reviews\n"), authority
    assert gateway.request("other.example.com:12345").status == 404


def test_responses_name_the_server_istio_envoy(gateway: Gateway) -> None:
    """buildGatewayConnectionManager: ProxyHeaders' server name for ListenerClassGateway, written
    over the upstream's own `Server` header (OVERWRITE)."""
    assert gateway.request(HOST).headers["server"] == "istio-envoy"


def test_expect_100_continue_reaches_the_upstream(gateway: Gateway) -> None:
    """buildHTTPConnectionManager sets proxy_100_continue (features.Enable100ContinueHeaders): the
    upstream gets `Expect: 100-continue` and answers it; Envoy neither answers it nor strips it."""
    body = b"hello"
    headers = {"Expect": "100-continue", "Content-Length": str(len(body))}
    reply = gateway.request(HOST, "POST", body, headers)
    assert reply.status == 200
    assert gateway.upstream.last_headers.get("expect") == "100-continue"
