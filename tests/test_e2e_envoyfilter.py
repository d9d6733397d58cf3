"""End to end: EnvoyFilters served by `meshctl serve` change what a real Envoy does to traffic.

A Lua filter inserted before the router on the sidecar's outbound listeners adds a header the
backend sees; a local rate limit filter answers 429 past its budget; deleting the EnvoyFilter's
file takes the filter out again, without a restart and without a request failing meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import needs_envoy
from test_e2e_serve import NS, Mesh, service_entry, wait_for, workload_entry

from meshctl.testing.backends import RequestLoop, send
from meshctl.testing.envoy import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

#: How long a config change may take to reach traffic.
CONVERGE = 15.0

LUA = f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: add-header, namespace: {NS}}}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {{name: envoy.filters.http.router}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          defaultSourceCode:
            inlineString: |
              function envoy_on_request(request_handle)
                request_handle:headers():add("x-from-lua", "hello")
              end
"""

#: A budget of 3 requests, refilled once an hour: the 4th within the test is refused.
RATE_LIMIT = f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: rate-limit, namespace: {NS}}}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {{name: envoy.filters.http.router}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.local_ratelimit
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
          stat_prefix: http_local_rate_limiter
          token_bucket: {{max_tokens: 3, tokens_per_fill: 3, fill_interval: 3600s}}
          filter_enabled:
            runtime_key: local_rate_limit_enabled
            default_value: {{numerator: 100, denominator: HUNDRED}}
          filter_enforced:
            runtime_key: local_rate_limit_enforced
            default_value: {{numerator: 100, denominator: HUNDRED}}
"""


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with ExitStack() as stack:
        yield Mesh(tmp_path, stack)


def _web(mesh: Mesh) -> tuple[int, str, object]:
    port = free_port()
    backend = mesh.backend("web-v1", "127.0.0.21", port)
    mesh.write("web.yaml", service_entry("web", port), workload_entry("web-v1", "127.0.0.21", "web", "v1"))
    return port, f"web.{NS}.mesh", backend


def test_lua_filter_adds_a_header_the_backend_sees_and_goes_with_its_file(mesh: Mesh) -> None:
    port, host, backend = _web(mesh)
    mesh.write("lua.yaml", LUA)
    server = mesh.serve()
    mesh.envoy(server)
    wait_for(lambda: send(port, host).ok, "Envoy routes the first request")
    assert backend.last_headers.get("x-from-lua") == "hello"  # type: ignore[attr-defined]

    with RequestLoop(port, host) as loop:
        loop.wait_for_answers(5)
        mesh.remove("lua.yaml")

        def header_gone() -> bool:
            return send(port, host).ok and "x-from-lua" not in backend.last_headers  # type: ignore[attr-defined]

        wait_for(header_gone, "the Lua filter is gone once its file is", CONVERGE)
        loop.wait_for_answers(5)
    assert loop.failures == []


def test_local_rate_limit_answers_429_past_its_budget(mesh: Mesh) -> None:
    port, host, _ = _web(mesh)
    server = mesh.serve()
    mesh.envoy(server)
    wait_for(lambda: send(port, host).ok, "Envoy routes the first request")
    mesh.write("rate-limit.yaml", RATE_LIMIT)
    wait_for(lambda: send(port, host).status == 429, "requests past the budget get 429", CONVERGE)
    assert [send(port, host).status for _ in range(5)] == [429] * 5
