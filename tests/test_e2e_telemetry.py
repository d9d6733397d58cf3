"""Telemetry's access logging through a real Envoy: a namespace's Telemetry turns a file access
log on, a workload's Telemetry turns it off for that workload and turns another on with a CEL
filter, and each proxy writes (or does not write) the requests it carries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import needs_envoy

from meshctl.config.mesh import mesh_settings
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

LOGGED = "sidecar~127.0.0.9~logged.tl~tl.svc.cluster.local"
QUIET = "sidecar~127.0.0.10~quiet.tl~tl.svc.cluster.local"


def mesh(port: int, app_port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: shop, namespace: tl}}
spec:
  hosts: [shop.tl.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  endpoints: [{{address: 127.0.0.82}}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: namespace-logs, namespace: tl}}
spec:
  accessLogging: [{{providers: [{{name: shared}}]}}]
---
apiVersion: telemetry.istio.io/v1alpha1
kind: Telemetry
metadata: {{name: quiet, namespace: tl}}
spec:
  selector: {{matchLabels: {{app: quiet}}}}
  accessLogging:
  - providers: [{{name: shared}}]
    disabled: true
  - providers: [{{name: own}}]
    filter: {{expression: "request.url_path != '/skipped'"}}
"""


def lines_of(path: Path, needle: str) -> list[str]:
    """The lines of `path` with `needle`, waiting (10 s at most) for Envoy to flush one."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [line for line in (path.read_text().splitlines() if path.exists() else []) if needle in line]
        if found:
            return found
        time.sleep(0.2)
    return []


def proxied(port: int, path: str) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if send(port, "shop.tl.mesh", path=path).ok:
            return True
        time.sleep(0.2)
    return False


def test_telemetry_turns_the_log_on_for_one_workload_and_off_for_another(tmp_path: Path) -> None:
    shared, own = tmp_path / "shared.log", tmp_path / "own.log"
    settings, findings = mesh_settings(
        {
            "extensionProviders": [
                {"name": "shared", "envoyFileAccessLog": {"path": str(shared)}},
                {"name": "own", "envoyFileAccessLog": {"path": str(own), "logFormat": {"text": "%REQ(:PATH)%"}}},
            ]
        }
    )
    assert settings is not None and findings == []
    port = free_port()
    with Backend("shop", "127.0.0.82") as backend:
        snapshot = snapshot_from_yaml(mesh(port, backend.port), mesh=settings)
        for node, app, path in ((LOGGED, "logged", "/logged"), (QUIET, "quiet", "/quiet")):
            resources = generate(snapshot, proxy_for(snapshot, node, {"LABELS": {"app": app}}))
            with EnvoyProcess(bootstrap(resources, node_id=node)):
                if app == "quiet":
                    assert proxied(port, "/skipped")  # before /quiet: its line would come first
                    assert send(port, "shop.tl.mesh", path=path).ok
                else:
                    assert proxied(port, path)
            # Read once Envoy is gone: it has flushed its logs by then.
            if app == "quiet":
                # Its own log, on beside the one turned off; the filter kept /skipped out of it.
                assert lines_of(own, "/quiet") == ["/quiet"]
                assert own.read_text().splitlines() == ["/quiet"]
            else:
                logged = lines_of(shared, "/logged")
                assert logged and '"GET /logged HTTP/1.1" 200 ' in logged[-1]
    assert [line for line in shared.read_text().splitlines() if "/quiet" in line or "/skipped" in line] == []
    assert "/logged" not in (own.read_text() if own.exists() else "")
