"""A sidecar routing by an HTTPRoute whose parent is a Service (the Gateway API's mesh routing,
GAMMA), through a real Envoy: the route becomes the service's VirtualService for the mesh, so
a request with `end-user: jason` goes to reviews-v2 and every other one to reviews."""

from __future__ import annotations

import time

import pytest
from conftest import needs_envoy

from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "gm"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
HOST = f"reviews.{NS}.svc.cluster.local"


def mesh(port: int, app_port: int) -> str:
    def service(name: str, version: str) -> str:
        return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {NS}}}
spec:
  hosts: [{name}.{NS}.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  workloadSelector: {{labels: {{app: reviews, version: {version}}}}}
---
"""

    return f"""{service("reviews", "v1")}{service("reviews-v2", "v2")}apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v1, namespace: {NS}}}
spec: {{address: 127.0.0.71, labels: {{app: reviews, version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v2, namespace: {NS}}}
spec: {{address: 127.0.0.72, labels: {{app: reviews, version: v2}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: reviews, namespace: {NS}}}
spec:
  parentRefs: [{{group: "", kind: Service, name: reviews, port: {port}}}]
  rules:
  - matches: [{{headers: [{{name: end-user, value: jason}}]}}]
    backendRefs: [{{name: reviews-v2, port: {port}}}]
  - backendRefs: [{{name: reviews, port: {port}}}]
"""


def test_a_sidecar_routes_by_an_http_route_whose_parent_is_the_service() -> None:
    port = free_port()
    with Backend("reviews-v1", "127.0.0.71") as v1, Backend("reviews-v2", "127.0.0.72", port=v1.port):
        snapshot = snapshot_from_yaml(mesh(port, v1.port))
        resources = generate(snapshot, proxy_for(snapshot, CLIENT))
        with EnvoyProcess(bootstrap(resources, node_id=CLIENT)):
            deadline = time.monotonic() + 30
            while not send(port, HOST).ok and time.monotonic() < deadline:
                time.sleep(0.2)
            assert send(port, HOST, headers={"end-user": "jason"}).backend == "reviews-v2"
            assert {send(port, HOST).backend for _ in range(20)} == {"reviews-v1"}
