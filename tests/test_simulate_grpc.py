"""`meshctl simulate xds:///HOST:PORT/SERVICE/METHOD`: where a proxyless gRPC node's call goes,
with gRPC's rules (the listener named by the target, routes on /SERVICE/METHOD and metadata, a
status code for what fails), and the same routing decision an Envoy sidecar makes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import runner

from meshctl.cli.app import app

MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  workloadSelector: {labels: {app: echo}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v1, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: echo, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v2, namespace: shop}
spec: {address: 10.0.0.2, labels: {app: echo, version: v2}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client, namespace: shop}
spec: {address: 10.0.0.9, labels: {app: client}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: shop}
spec:
  host: echo.shop.mesh
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.mesh]
  http:
  - match: [{headers: {x-canary: {exact: "true"}}}]
    route: [{destination: {host: echo.shop.mesh, subset: v2}}]
  - match: [{uri: {prefix: /pkg.Echo/Fail}}]
    fault: {abort: {httpStatus: 403, percentage: {value: 100}}}
    route: [{destination: {host: echo.shop.mesh, subset: v1}}]
  - timeout: 3s
    route:
    - {destination: {host: echo.shop.mesh, subset: v1}, weight: 80}
    - {destination: {host: echo.shop.mesh, subset: v2}, weight: 20}
"""
CALL = "xds:///echo.shop.mesh:7070/pkg.Echo/Say"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpc-simulate")
    (root / "shop").mkdir()
    (root / "shop" / "mesh.yaml").write_text(MESH)
    return root


def run(mesh: Path, url: str, *args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(
        app, ["simulate", url, "--config-dir", str(mesh), "--proxy", "client.shop", "-o", "json", *args]
    )
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def clusters(answer: dict[str, Any]) -> list[tuple[str, int]]:
    return [(c["name"], c["weight"]) for c in answer["clusters"]]


def test_a_call_takes_the_listener_named_by_its_target_and_the_header_route(mesh: Path) -> None:
    status, answer = run(mesh, CALL, "-H", "x-canary: true")
    assert status == 0
    assert answer["listener"] == "echo.shop.mesh:7070"
    assert answer["route_config"] == "outbound|7070||echo.shop.mesh"
    assert clusters(answer) == [("outbound|7070|v2|echo.shop.mesh", 100)]
    assert answer["request"]["url"] == CALL


def test_the_deadline_is_the_routes_max_stream_duration(mesh: Path) -> None:
    _, answer = run(mesh, CALL)
    assert clusters(answer) == [("outbound|7070|v1|echo.shop.mesh", 80), ("outbound|7070|v2|echo.shop.mesh", 20)]
    assert answer["action"]["timeout"] == "3s"
    _, canary = run(mesh, CALL, "-H", "x-canary: true")
    assert canary["action"]["timeout"] == "none"


def test_a_fault_abort_is_the_status_grpc_maps_it_to(mesh: Path) -> None:
    status, answer = run(mesh, "xds:///echo.shop.mesh:7070/pkg.Echo/Fail")
    assert status == 0
    assert answer["outcome"]["flag"] == "PERMISSION_DENIED" and answer["outcome"]["status"] is None


def test_a_target_the_node_is_not_sent_fails_unavailable(mesh: Path) -> None:
    status, answer = run(mesh, "xds:///ratings.shop.mesh:7070/pkg.Echo/Say")
    assert status == 1
    assert answer["outcome"]["flag"] == "UNAVAILABLE"
    assert "LDS resource ratings.shop.mesh:7070 does not exist" in answer["outcome"]["reason"]


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/pkg.Echo/Say", ()), ("/pkg.Echo/Say", ("x-canary: true",)), ("/pkg.Echo/Say", ("x-canary: no",))],
)
def test_a_sidecar_and_a_grpc_client_route_the_same_call_alike(mesh: Path, path: str, headers: tuple[str, ...]) -> None:
    given = [a for h in headers for a in ("-H", h)]
    _, grpc = run(mesh, f"xds:///echo.shop.mesh:7070{path}", *given)
    _, envoy = run(
        mesh, f"http://echo.shop.mesh:7070{path}", "-X", "POST", "-H", "content-type: application/grpc", *given
    )
    assert clusters(grpc) == clusters(envoy) and grpc["source"] == envoy["source"]


@pytest.mark.parametrize(
    "url", ["xds:///echo.shop.mesh:7070", "xds:///echo.shop.mesh:7070/Say", "xds:///echo.shop.mesh:99999/a.B/C"]
)
def test_a_call_without_a_method_or_port_is_a_usage_error(mesh: Path, url: str) -> None:
    result = runner.invoke(app, ["simulate", url, "--config-dir", str(mesh), "--proxy", "client.shop"])
    assert result.exit_code == 2 and "xds:///" in result.output.replace("\n", "")


def test_a_cases_file_checks_grpc_calls_beside_http_requests(mesh: Path, tmp_path: Path) -> None:
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        """- name: canary call
  proxy: client.shop
  request: {url: "xds:///echo.shop.mesh:7070/pkg.Echo/Say", headers: {x-canary: "true"}}
  expect: {cluster: "outbound|7070|v2|echo.shop.mesh", grpc_status: OK}
- name: failing call
  proxy: client.shop
  request: {url: "xds:///echo.shop.mesh:7070/pkg.Echo/Fail"}
  expect: {grpc_status: permission_denied}
- name: the sidecar's request alike
  proxy: client.shop
  request: {url: "http://echo.shop.mesh:7070/pkg.Echo/Say", method: POST, headers: {x-canary: "true"}}
  expect: {cluster: "outbound|7070|v2|echo.shop.mesh"}
- name: wrong on purpose
  proxy: client.shop
  request: {url: "xds:///echo.shop.mesh:7070/pkg.Echo/Say"}
  expect: {grpc_status: UNAVAILABLE}
"""
    )
    result = runner.invoke(app, ["simulate", "--config-dir", str(mesh), "--cases", str(cases)])
    assert result.exit_code == 1, result.output
    assert "wrong on purpose: grpc_status: expected UNAVAILABLE, got OK" in result.stdout
    assert "4 case(s): 3 passed, 1 failed" in result.output
