"""A wildcard VirtualService under a Sidecar that imports one host, through a real Envoy: Istio's
selectVirtualServices keeps `*.wc.mesh` for an egress import of `reviews.wc.mesh`, so its header
rule moves traffic to v2; before, the VirtualService was dropped and v1 answered every request."""

from __future__ import annotations

import time

import pytest
from conftest import needs_envoy

from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
]

CLIENT = "sidecar~127.0.0.9~client.wc~wc.svc.cluster.local"


def mesh(port: int, app_port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: wc}}
spec:
  hosts: [reviews.wc.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v1, namespace: wc}}
spec: {{address: 127.0.0.71, labels: {{app: reviews, version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v2, namespace: wc}}
spec: {{address: 127.0.0.72, labels: {{app: reviews, version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: wc}}
spec:
  host: reviews.wc.mesh
  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: everything, namespace: wc}}
spec:
  hosts: ["*.wc.mesh"]
  http:
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]
    route: [{{destination: {{host: reviews.wc.mesh, subset: v2}}}}]
  - route: [{{destination: {{host: reviews.wc.mesh, subset: v1}}}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: wc}}
spec:
  egress: [{{hosts: ["./reviews.wc.mesh"]}}]
"""


def test_a_wildcard_virtual_service_routes_for_a_host_the_sidecar_imports() -> None:
    port = free_port()
    with Backend("reviews-v1", "127.0.0.71") as v1, Backend("reviews-v2", "127.0.0.72", port=v1.port):
        snapshot = snapshot_from_yaml(mesh(port, v1.port))
        resources = generate(snapshot, proxy_for(snapshot, CLIENT))
        with EnvoyProcess(bootstrap(resources, node_id=CLIENT)):
            deadline = time.monotonic() + 30
            while not send(port, "reviews.wc.mesh").ok and time.monotonic() < deadline:
                time.sleep(0.2)
            assert send(port, "reviews.wc.mesh", headers={"end-user": "jason"}).backend == "reviews-v2"
            assert send(port, "reviews.wc.mesh").backend == "reviews-v1"
