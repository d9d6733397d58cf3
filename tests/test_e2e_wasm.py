"""End to end: a WasmPlugin with a local module, served by `meshctl serve`, runs in a real Envoy.

The module is assembled in Python (`meshctl.testing.wasm`): it adds a request header carrying
its configuration, so the backend seeing the header proves that Envoy loaded the module with
its V8 runtime, ran it on the outbound HTTP filter chain, and passed `pluginConfig` to it as
Istio does (a JSON string). Deleting the WasmPlugin's file takes the filter out again, without
a restart and without a request failing meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import needs_envoy
from test_e2e_serve import NS, Mesh, service_entry, wait_for, workload_entry

from meshctl.testing.backends import RequestLoop, send
from meshctl.testing.envoy import free_port
from meshctl.testing.wasm import header_module

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

CONVERGE = 15.0
HEADER = "x-wasm-plugin"


def wasm_plugin(module: Path, *, sha256: str = "", greeting: str = "hello") -> str:
    digest = f"\n  sha256: {sha256}" if sha256 else ""
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: stamp, namespace: {NS}}}
spec:
  url: file://{module}{digest}
  pluginConfig: {{greeting: {greeting}, count: 2}}
  match: [{{mode: CLIENT}}]
"""


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with ExitStack() as stack:
        yield Mesh(tmp_path, stack)


def test_a_local_wasm_module_adds_a_header_the_backend_sees_and_goes_with_its_file(mesh: Mesh, tmp_path: Path) -> None:
    module = tmp_path / "stamp.wasm"
    module.write_bytes(header_module(HEADER))
    port = free_port()
    backend = mesh.backend("web-v1", "127.0.0.21", port)
    mesh.write("web.yaml", service_entry("web", port), workload_entry("web-v1", "127.0.0.21", "web", "v1"))
    host = f"web.{NS}.mesh"
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    mesh.write("wasm.yaml", wasm_plugin(module, sha256=digest))
    server = mesh.serve()
    mesh.envoy(server)
    wait_for(lambda: send(port, host).ok, "Envoy routes the first request")
    assert json.loads(backend.last_headers[HEADER]) == {"count": 2, "greeting": "hello"}

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        mesh.remove("wasm.yaml")

        def header_gone() -> bool:
            return send(port, host).ok and HEADER not in backend.last_headers

        wait_for(header_gone, "the wasm filter is gone once its file is", CONVERGE)
        loop.wait_for_answers(5)
    assert loop.failures == []


def test_a_module_whose_sha256_does_not_match_is_not_applied_and_the_last_good_one_stays(
    mesh: Mesh, tmp_path: Path
) -> None:
    module = tmp_path / "stamp.wasm"
    module.write_bytes(header_module(HEADER))
    port = free_port()
    backend = mesh.backend("web-v1", "127.0.0.21", port)
    mesh.write("web.yaml", service_entry("web", port), workload_entry("web-v1", "127.0.0.21", "web", "v1"))
    host = f"web.{NS}.mesh"
    mesh.write("wasm.yaml", wasm_plugin(module, sha256=hashlib.sha256(module.read_bytes()).hexdigest()))
    server = mesh.serve()
    mesh.envoy(server)
    wait_for(lambda: send(port, host).ok and HEADER in backend.last_headers, "the plugin runs")

    mesh.write("wasm.yaml", wasm_plugin(module, sha256="ab" * 32, greeting="bye"))
    wait_for(lambda: "has sha256" in server.log(), "the server reports the mismatch", CONVERGE)
    assert send(port, host).ok
    assert json.loads(backend.last_headers[HEADER]) == {"count": 2, "greeting": "hello"}
