"""MeshConfig's access log through a real Envoy: Istio's default text format, or its JSON fields,
written to the file `accessLogFile` names, for every request a sidecar proxies."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import needs_envoy

from meshctl.config.mesh import mesh_settings
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
]

CLIENT = "sidecar~127.0.0.9~client.al~al.svc.cluster.local"


def mesh(port: int, app_port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: shop, namespace: al}}
spec:
  hosts: [shop.al.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  endpoints: [{{address: 127.0.0.81}}]
"""


def logged(path: Path) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if lines:
            return lines
        time.sleep(0.2)
    return []


@pytest.mark.parametrize("encoding", ["TEXT", "JSON"])
def test_each_request_is_logged_in_istios_format(tmp_path: Path, encoding: str) -> None:
    log = tmp_path / "access.log"
    settings, findings = mesh_settings({"accessLogFile": str(log), "accessLogEncoding": encoding})
    assert settings is not None and findings == []
    port = free_port()
    with Backend("shop", "127.0.0.81") as backend:
        snapshot = snapshot_from_yaml(mesh(port, backend.port), mesh=settings)
        resources = generate(snapshot, proxy_for(snapshot, CLIENT))
        with EnvoyProcess(bootstrap(resources, node_id=CLIENT)):
            deadline = time.monotonic() + 30
            while not send(port, "shop.al.mesh", path="/cart").ok and time.monotonic() < deadline:
                time.sleep(0.2)
            lines = logged(log)
    assert lines, "nothing was logged"
    cluster = f"outbound|{port}||shop.al.mesh"
    if encoding == "JSON":
        entry = json.loads(lines[-1])
        assert (entry["method"], entry["path"], entry["response_code"], entry["upstream_cluster"]) == (
            "GET",
            "/cart",
            200,
            cluster,
        )
        assert entry["authority"] == "shop.al.mesh"
    else:
        assert '"GET /cart HTTP/1.1" 200 ' in lines[-1] and f" {cluster} " in lines[-1]
        assert '"shop.al.mesh"' in lines[-1]
