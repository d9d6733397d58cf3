"""Telemetry tracing through a real Envoy and `meshctl serve`: a Zipkin provider in MeshConfig, a
namespace Telemetry that samples every request, and a collector (a local stand-in for Zipkin)
that receives the sidecar's spans. Editing the Telemetry switches the spans off (sampling 0, then
`disableSpanReporting`) and on again, live: the same Envoy, no restart, no request refused."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, send
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess
from meshctl.testing.zipkin import ZipkinCollector

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "tr"
HOST = f"shop.{NS}.mesh"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
MESH_CONFIG = "extensionProviders:\n- {name: zipkin, zipkin: {service: zipkin.obs.mesh, port: %d}}\n"


def services(port: int, app_port: int, collector_port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: shop, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  endpoints: [{{address: 127.0.0.82}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: zipkin, namespace: obs}}
spec:
  hosts: [zipkin.obs.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {collector_port}, name: http, protocol: HTTP}}]
  endpoints: [{{address: 127.0.0.83}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {NS}}}
spec:
  egress: [{{hosts: ["./*"]}}]
"""


def telemetry(tracing: str) -> str:
    return f"""apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: traces, namespace: {NS}}}
spec:
  tracing: [{{providers: [{{name: zipkin}}], {tracing}}}]
"""


def write(directory: Path, name: str, text: str) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, directory / name)


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def _managers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if str(node.get("@type", "")).endswith("HttpConnectionManager"):
            yield node
        for value in node.values():
            yield from _managers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _managers(value)


def samplings(envoy: EnvoyProcess, port: int) -> set[float | None]:
    """The random sampling of the shop listener's connection managers as Envoy runs them (None:
    no tracing); empty while Envoy has no such listener."""
    dump = json.loads(envoy.admin("config_dump"))
    out: set[float | None] = set()
    for section in dump["configs"]:
        for listener in section.get("dynamic_listeners", []):
            active = listener.get("active_state", {}).get("listener", {})
            if not listener.get("name", "").endswith(f"_{port}"):
                continue
            for manager in _managers(active):
                tracing = manager.get("tracing")
                out.add(None if tracing is None else float(tracing.get("random_sampling", {}).get("value", 0.0)))
    return out


def traced(collector: ZipkinCollector, path: str) -> list[str]:
    return [url for url in collector.paths() if url.endswith(path)]


def test_spans_reach_the_collector_and_a_telemetry_edit_switches_them_live(tmp_path: Path) -> None:
    with ExitStack() as stack:
        collector = stack.enter_context(ZipkinCollector("127.0.0.83"))
        backend = stack.enter_context(Backend("shop", "127.0.0.82"))
        port = free_port()
        mesh = tmp_path / "mesh"
        mesh.mkdir()
        write(mesh, "services.yaml", services(port, backend.port, collector.port))
        write(mesh, "telemetry.yaml", telemetry("randomSamplingPercentage: 100"))
        mesh_config = tmp_path / "meshconfig.yaml"
        mesh_config.write_text(MESH_CONFIG % collector.port)
        server = stack.enter_context(ServeProcess([mesh], extra_args=["--mesh-config", str(mesh_config)]))
        stack.callback(lambda: print(f"--- meshctl serve log:\n{server.log()[-6000:]}"))
        envoy = stack.enter_context(EnvoyProcess(server.bootstrap(CLIENT)))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-4000:]}"))
        wait_for(lambda: send(port, HOST, path="/ready").ok, "the client reaches shop")

        # Sampling 100: each request's span reaches the collector, through the collector's
        # cluster the Sidecar (egress ./* only) would have left out.
        for i in range(3):
            assert send(port, HOST, path=f"/traced-{i}").ok
        assert collector.wait_for(lambda _: all(traced(collector, f"/traced-{i}") for i in range(3))), collector.paths()
        span = next(s for s in collector.spans if str(s.get("tags", {}).get("http.url", "")).endswith("/traced-0"))
        assert span["kind"] == "CLIENT" and span["tags"].get("istio.namespace") == NS, span

        # Sampling 0, then span reporting off: requests still go through, and send no span.
        write(mesh, "telemetry.yaml", telemetry("randomSamplingPercentage: 0"))
        wait_for(lambda: samplings(envoy, port) == {0.0}, "Envoy samples nothing")
        for i in range(5):
            assert send(port, HOST, path=f"/unsampled-{i}").ok
        write(mesh, "telemetry.yaml", telemetry("randomSamplingPercentage: 100, disableSpanReporting: true"))
        wait_for(lambda: samplings(envoy, port) == {None}, "Envoy traces nothing")
        for i in range(5):
            assert send(port, HOST, path=f"/unreported-{i}").ok

        # On again: the marker's span arrives; had any request since been traced, its span
        # (sent by the same Zipkin driver, in order) would have come before it.
        write(mesh, "telemetry.yaml", telemetry("randomSamplingPercentage: 100"))
        wait_for(lambda: samplings(envoy, port) == {100.0}, "Envoy samples everything again")
        assert send(port, HOST, path="/marker").ok
        assert collector.wait_for(lambda _: bool(traced(collector, "/marker"))), collector.paths()
        assert [p for p in collector.paths() if "/unsampled-" in p or "/unreported-" in p] == []
        assert envoy.running and server.runs == 1  # the same Envoy and server all along
