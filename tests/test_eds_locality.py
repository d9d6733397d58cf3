"""Locality load balancing on EDS clusters, relative to each proxy as Istio applies it: failover
priorities by proximity once a cluster has outlier detection, and `distribute` weights; shared
by the proxies of one locality, and what the cache serves is what `generate` makes."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from conftest import needs_envoy

from meshctl.server.cache import ResourceCache
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds import types
from meshctl.xds.generate import generate
from meshctl.xds.names import resource_name

EAST = "sidecar~10.0.1.1~client-east.loc~loc.svc.cluster.local"
WEST = "sidecar~10.0.1.2~client-west.loc~loc.svc.cluster.local"
NOWHERE = "sidecar~10.0.1.9~adhoc.loc~loc.svc.cluster.local"
CLUSTER_HOST = "api.loc.mesh"


DEFAULT_ADDRESSES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def mesh(rule: str, port: int = 80, app_port: int = 8080, addresses: tuple[str, str, str] = DEFAULT_ADDRESSES) -> str:
    a, b, c = addresses
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: loc}}
spec:
  hosts: [{CLUSTER_HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  endpoints:
  - {{address: {a}, locality: us-east/zone-a}}
  - {{address: {b}, locality: us-east/zone-b}}
  - {{address: {c}, locality: us-west/zone-c}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: client, namespace: loc}}
spec:
  hosts: [client.loc.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9000, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: client}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client-east, namespace: loc}}
spec: {{address: 10.0.1.1, labels: {{app: client}}, locality: us-east/zone-a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client-west, namespace: loc}}
spec: {{address: 10.0.1.2, labels: {{app: client}}, locality: us-west/zone-c}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: api, namespace: loc}}
spec:
  host: {CLUSTER_HOST}
  trafficPolicy:
{rule}
"""


FAILOVER = "    outlierDetection: {consecutive5xxErrors: 5}\n"
DISTRIBUTE = (
    "    loadBalancer:\n      localityLbSetting:\n        distribute:\n"
    '        - {from: "us-east/*", to: {"us-east/zone-a": 80, "us-west/*": 20}}\n'
)


def assignment(text: str, node: str, port: int = 80) -> dict[str, tuple[int, int]]:
    """zone -> (priority, weight) of the api cluster's assignment as `node` gets it."""
    snapshot = snapshot_from_yaml(text)
    proxy = proxy_for(snapshot, node)
    name = f"outbound|{port}||{CLUSTER_HOST}"
    (la,) = [a for a in generate(snapshot, proxy)[types.ENDPOINT] if resource_name(a) == name]
    cached = ResourceCache().resources(snapshot, proxy).of(types.ENDPOINT)[resource_name(la)]
    assert cached.body.endswith(la.SerializeToString(deterministic=True))  # what the server sends
    return {g.locality.zone: (g.priority, g.load_balancing_weight.value) for g in la.endpoints if g.lb_endpoints}


def test_failover_priorities_are_relative_to_each_proxy() -> None:
    """Istio's ApplyLocalityLoadBalancer: the proxy's zone first, its region next, the rest last."""
    east = assignment(mesh(FAILOVER), EAST)
    west = assignment(mesh(FAILOVER), WEST)
    assert {z: p for z, (p, _) in east.items()} == {"zone-a": 0, "zone-b": 1, "zone-c": 2}
    assert {z: p for z, (p, _) in west.items()} == {"zone-c": 0, "zone-a": 1, "zone-b": 1}
    # A proxy that knows no locality gets the shared assignment.
    assert {p for p, _ in assignment(mesh(FAILOVER), NOWHERE).values()} == {0}


def test_without_outlier_detection_every_proxy_shares_one_assignment() -> None:
    assert assignment(mesh("    connectionPool: {tcp: {maxConnections: 10}}\n"), EAST) == assignment(
        mesh("    connectionPool: {tcp: {maxConnections: 10}}\n"), WEST
    )


def test_distribute_weights_the_localities_for_the_proxy() -> None:
    east = assignment(mesh(DISTRIBUTE), EAST)
    assert east == {"zone-a": (0, 80), "zone-c": (0, 20)}  # zone-b is given nothing


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
def test_distribute_weights_hold_over_real_traffic() -> None:
    """100 requests from a proxy in us-east: about 80 reach zone-a and 20 us-west, none zone-b."""
    port = free_port()
    with (
        Backend("zone-a", "127.0.0.91") as a,
        Backend("zone-b", "127.0.0.92", port=a.port),
        Backend("zone-c", "127.0.0.93", port=a.port),
    ):
        text = mesh(DISTRIBUTE, port, a.port, ("127.0.0.91", "127.0.0.92", "127.0.0.93"))
        snapshot = snapshot_from_yaml(text)
        resources = generate(snapshot, proxy_for(snapshot, EAST))
        with EnvoyProcess(bootstrap(resources, node_id=EAST)):
            deadline = time.monotonic() + 30
            while not send(port, CLUSTER_HOST).ok and time.monotonic() < deadline:
                time.sleep(0.2)
            counts = Counter(send(port, CLUSTER_HOST).backend for _ in range(100))
    assert counts["zone-b"] == 0
    # Binomial(100, 0.8): outside 55..98 about once in a billion runs.
    assert 55 <= counts["zone-a"] <= 98 and counts["zone-a"] + counts["zone-c"] == 100, counts


def test_a_grpc_node_gets_the_failover_priorities_of_its_locality() -> None:
    """A proxyless gRPC node is served the per-locality variant an Envoy of its locality gets
    (gRPC fails over by priority), by the server as by `dump --grpc`."""
    from meshctl.xds.grpc_gen import generate_grpc

    snapshot = snapshot_from_yaml(mesh(FAILOVER))
    name = f"outbound|80||{CLUSTER_HOST}"
    for node, expected in (
        (EAST, {"zone-a": 0, "zone-b": 1, "zone-c": 2}),
        (WEST, {"zone-c": 0, "zone-a": 1, "zone-b": 1}),
    ):
        proxy = proxy_for(snapshot, node, {"GENERATOR": "grpc"})
        (la,) = [a for a in generate_grpc(snapshot, proxy)[types.ENDPOINT] if resource_name(a) == name]
        assert {g.locality.zone: g.priority for g in la.endpoints} == expected  # type: ignore[attr-defined]
        cached = ResourceCache().resources(snapshot, proxy).of(types.ENDPOINT)[name]
        assert cached.body.endswith(la.SerializeToString(deterministic=True))
