"""End to end: grpcio's own xDS client, no Envoy, routed by `meshctl serve`.

A `meshctl serve` process, gRPC servers on their own loopback addresses (127.0.0.2 is v1,
127.0.0.3 v2, as two VMs) that answer with their name, and a grpcio client process started from
`meshctl bootstrap --grpc` output, dialing `xds:///echo.shop.mesh:PORT`. The client resolves,
routes, splits, retries and injects faults itself, from what meshctl serves it.

Nothing waits a fixed time: a step that waits for a change polls for its outcome.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import needs_envoy

from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.grpc_apps import METHOD, NamedServer, XdsClient
from meshctl.testing.serve_process import ServeProcess, meshctl_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "shop"
HOST = f"echo.{NS}.mesh"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
CONVERGE = 10.0


def mesh(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
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
spec: {{address: 127.0.0.2, labels: {{app: echo, version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: echo-v2, namespace: {NS}}}
spec: {{address: 127.0.0.3, labels: {{app: echo, version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: echo-flaky, namespace: {NS}}}
spec: {{address: 127.0.0.4, labels: {{app: echo, version: flaky}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: echo, namespace: {NS}}}
spec:
  host: {HOST}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
  - {{name: flaky, labels: {{version: flaky}}}}
"""


def virtual_service(http: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: echo, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  http:
{http}"""


SPLIT = """  - match: [{headers: {x-version: {exact: v2}}}]
    route: [{destination: {host: echo.shop.mesh, subset: v2}}]
  - match: [{headers: {x-fault: {exact: abort}}}]
    fault: {abort: {grpcStatus: PERMISSION_DENIED, percentage: {value: 100}}}
    route: [{destination: {host: echo.shop.mesh, subset: v1}}]
  - match: [{headers: {x-flaky: {exact: retried}}}]
    retries: {attempts: 2, retryOn: unavailable}
    route: [{destination: {host: echo.shop.mesh, subset: flaky}}]
  - match: [{headers: {x-flaky: {exact: once}}}]
    retries: {attempts: 0}
    route: [{destination: {host: echo.shop.mesh, subset: flaky}}]
  - route:
    - {destination: {host: echo.shop.mesh, subset: v1}, weight: 20}
    - {destination: {host: echo.shop.mesh, subset: v2}, weight: 80}
"""
ALL_V1 = """  - route: [{destination: {host: echo.shop.mesh, subset: v1}}]
"""


class Mesh:
    def __init__(self, directory: Path, serve: ServeProcess, port: int) -> None:
        self.directory, self.serve, self.port = directory, serve, port

    def client(self, name: str = HOST, *, port: int | None = None) -> XdsClient:
        """A client dialing `name:PORT` (the mesh's port unless `port`; none when it is 0)."""
        out = subprocess.run(
            [*meshctl_command(), "bootstrap", "--grpc", "--proxy", CLIENT, "--xds-address", self.serve.xds_address],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        bootstrap: dict[str, Any] = json.loads(out)
        port = self.port if port is None else port
        return XdsClient(f"{name}:{port}" if port else name, bootstrap)


@pytest.fixture
def grpc_mesh(tmp_path: Path) -> Iterator[Mesh]:
    port = free_port()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(mesh(port))
    (config / "vs.yaml").write_text(virtual_service(SPLIT))
    with ExitStack() as stack:
        stack.enter_context(NamedServer(f"127.0.0.2:{port}", "v1"))
        stack.enter_context(NamedServer(f"127.0.0.3:{port}", "v2"))
        stack.enter_context(NamedServer(f"127.0.0.4:{port}", "flaky", flaky=True))
        serve = stack.enter_context(ServeProcess([config]))
        yield Mesh(config, serve, port)


def test_header_match_routes_to_subset(grpc_mesh: Mesh) -> None:
    with grpc_mesh.client() as client:
        replies, errors = client.calls(30, {"x-version": "v2"})
    assert (replies, errors) == ({"v2": 30}, {})


def test_weighted_split_within_bounds(grpc_mesh: Mesh) -> None:
    with grpc_mesh.client() as client:
        replies, errors = client.calls(200)
    assert not errors
    assert replies["v1"] + replies["v2"] == 200
    # 20% of 200 is 40, sd 5.7: [15, 70] is far outside the noise, and excludes 0/100 and 50/50.
    assert 15 <= replies["v1"] <= 70, replies


def test_fault_abort(grpc_mesh: Mesh) -> None:
    with grpc_mesh.client() as client:
        replies, errors = client.calls(10, {"x-fault": "abort"})
    assert (replies, errors) == ({}, {grpc.StatusCode.PERMISSION_DENIED.name: 10})


def test_retry_on_unavailable(grpc_mesh: Mesh) -> None:
    with grpc_mesh.client() as client:
        # without retries every other call fails; with them each failure is retried and succeeds
        assert client.calls(10, {"x-flaky": "once"}) == ({"flaky": 5}, {grpc.StatusCode.UNAVAILABLE.name: 5})
        assert client.calls(10, {"x-flaky": "retried"}) == ({"flaky": 10}, {})


def test_live_edit_moves_traffic(grpc_mesh: Mesh) -> None:
    with grpc_mesh.client() as client:
        replies, _ = client.calls(50)
        assert replies["v2"] > 0
        (grpc_mesh.directory / "vs.yaml").write_text(virtual_service(ALL_V1))
        deadline = time.monotonic() + CONVERGE
        while True:
            replies, errors = client.calls(20)
            if replies == {"v1": 20}:
                break
            assert time.monotonic() < deadline, f"traffic did not move to v1: {replies} {errors}"
        # the same channel keeps following the mesh: the header route is gone with the edit
        assert client.calls(20, {"x-version": "v2"}) == ({"v1": 20}, {})


def until_answered(client: XdsClient, expected: dict[str, int], metadata: dict[str, str] | None = None) -> None:
    """Calls until they all answer as `expected` (the mesh is served a new file meanwhile)."""
    deadline = time.monotonic() + CONVERGE
    while True:
        replies, errors = client.calls(sum(expected.values()), metadata)
        if (replies, errors) == (expected, {}):
            return
        assert time.monotonic() < deadline, f"not answered as {expected}: {replies} {errors}"


def test_a_one_port_service_is_dialed_without_its_port(grpc_mesh: Mesh) -> None:
    """`xds:///echo.shop.mesh`: the listener of that very name, routed as with the port."""
    with grpc_mesh.client(port=0) as client:
        until_answered(client, {"v2": 20}, {"x-version": "v2"})
        replies, errors = client.calls(100)
        assert not errors and replies["v1"] + replies["v2"] == 100 and replies["v1"] >= 5, replies


DNS_SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: by-dns, namespace: shop}}
spec:
  hosts: [by-dns.shop.mesh]
  location: MESH_INTERNAL
  ports: [{{number: {port}, name: grpc, protocol: GRPC}}]
  resolution: DNS
  endpoints: [{{address: localhost}}]
"""


def test_a_dns_service_is_reached_through_a_logical_dns_cluster(grpc_mesh: Mesh) -> None:
    """A ServiceEntry resolved by DNS: gRPC gets a LOGICAL_DNS cluster and resolves the name."""
    port = free_port()
    with NamedServer(f"127.0.0.1:{port}", "by-dns"):
        (grpc_mesh.directory / "dns.yaml").write_text(DNS_SERVICE.format(port=port))
        with grpc_mesh.client("by-dns.shop.mesh", port=port) as client:
            until_answered(client, {"by-dns": 10})


def envoy_calls(channel: grpc.Channel, n: int, metadata: dict[str, str]) -> tuple[Counter[str], Counter[str]]:
    who = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    replies: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for _ in range(n):
        try:
            replies[who(b"", timeout=5.0, metadata=tuple(metadata.items())).decode()] += 1
        except grpc.RpcError as exc:
            errors[exc.code().name] += 1
    return replies, errors


@needs_envoy
def test_an_envoy_sidecar_and_a_grpc_client_route_alike(grpc_mesh: Mesh) -> None:
    """The same requests through an Envoy sidecar (its outbound listener on 127.0.0.1:PORT) and
    through grpcio's xDS client take the same routes."""
    node = f"sidecar~127.0.0.8~envoy-client.{NS}~{NS}.svc.cluster.local"
    with EnvoyProcess(grpc_mesh.serve.bootstrap(node)) as _envoy, grpc_mesh.client() as client:
        authority = f"{HOST}:{grpc_mesh.port}"
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_mesh.port}", options=[("grpc.default_authority", authority)])
        with channel:
            deadline = time.monotonic() + CONVERGE
            while envoy_calls(channel, 1, {"x-version": "v2"})[0] != {"v2": 1}:
                assert time.monotonic() < deadline, "the Envoy sidecar never routed"
            for metadata, n in (({"x-version": "v2"}, 10), ({"x-fault": "abort"}, 5), ({"x-flaky": "retried"}, 6)):
                assert envoy_calls(channel, n, metadata) == client.calls(n, metadata), metadata
