"""EnvoyFilter listener patches: pilot's listener_patch_test cases (filter chain, network and
HTTP filter operations, listener ADD/REMOVE/MERGE, virtual listeners matched by the filter
chain's port), restated as EnvoyFilter YAML on listeners written as protobuf JSON; and a real
Envoy (`meshctl validate --envoy`) loading a generated mesh that every kind of patch touched.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_envoy
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2  # noqa: F401  # registers Lua
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import json_format
from test_envoyfilter_patches import ROUTER, SIDECAR, _filter, _patched

from meshctl.testing.serve_process import meshctl_command

HCM = "envoy.filters.network.http_connection_manager"
_HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def _hcm(*filters: str, **extra: Any) -> dict[str, Any]:
    return {"name": HCM, "typed_config": {"@type": _HCM_TYPE, "stat_prefix": "x", **extra,
            "http_filters": [{"name": f} for f in filters]}}  # fmt: skip


def _listener(data: dict[str, Any]) -> Any:
    return json_format.ParseDict(data, listener_pb2.Listener())


def _http_filters(listener: Any, chain: int = 0) -> list[str]:
    for f in listener.filter_chains[chain].filters:
        if f.name == HCM:
            hcm = hcm_pb2.HttpConnectionManager()
            f.typed_config.Unpack(hcm)
            return [h.name for h in hcm.http_filters]
    return []


def _outbound(port: int, *chains: dict[str, Any], name: str = "") -> Any:
    return _listener({"name": name or f"0.0.0.0_{port}", "traffic_direction": "OUTBOUND",
                      "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
                      "filter_chains": list(chains)})  # fmt: skip


LISTENER_PATCHES = """\
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 12345}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80}}
    patch: {operation: MERGE, value: {listener_filters_timeout: 30s}}
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: new-outbound-listener}}
  - applyTo: FILTER_CHAIN
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80, filterChain: {sni: "*.foo.com"}}}
    patch: {operation: REMOVE}
  - applyTo: FILTER_CHAIN
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80}}
    patch: {operation: ADD, value: {filter_chain_match: {server_names: [added.com]}}}
  - applyTo: NETWORK_FILTER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80, filterChain: {filter: {name: TCP_NAME}}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: merged
  - applyTo: NETWORK_FILTER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80, filterChain: {filter: {name: TCP_NAME}}}}
    patch: {operation: INSERT_BEFORE, value: {name: before-tcp-proxy}}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME, subFilter: {name: http-filter2}}}}
    patch: {operation: INSERT_AFTER, value: {name: http-filter3}}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME, subFilter: {name: http-filter2}}}}
    patch: {operation: INSERT_BEFORE, value: {name: http-filter1.5}}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME}}}
    patch: {operation: INSERT_FIRST, value: {name: http-filter0}}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME, subFilter: {name: http-filter-to-go}}}}
    patch: {operation: REMOVE}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME, subFilter: {name: http-filter-old}}}}
    patch: {operation: REPLACE, value: {name: http-filter-new}}
  - applyTo: NETWORK_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: HCM_NAME}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          xff_num_trusted_hops: 4
          common_http_protocol_options: {idle_timeout: 30s}
  - applyTo: LISTENER
    match: {context: SIDECAR_INBOUND, listener: {portNumber: 80}}
    patch: {operation: REMOVE}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener: {portNumber: 9080, filterChain: {filter: {name: HCM_NAME}}}
    patch: {operation: ADD, value: {name: http-filter-inbound}}
""".replace("HCM_NAME", HCM).replace("TCP_NAME", "envoy.filters.network.tcp_proxy")


HTTP_FILTERS = ("http-filter-to-go", "http-filter-old", "http-filter2", "envoy.filters.http.router")


def test_outbound_listener_operations() -> None:
    tcp = {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "tcp", "cluster": "c"}}  # fmt: skip
    given = [
        _outbound(12345, {"filters": [tcp]}),
        _outbound(
            80,
            {"filter_chain_match": {"server_names": ["*.foo.com"]}, "filters": [tcp]},
            {"filter_chain_match": {"server_names": ["bar.com"]}, "filters": [tcp]},
        ),
        _outbound(
            8080,
            {
                "filters": [
                    _hcm(
                        "http-filter-to-go",
                        "http-filter-old",
                        "http-filter2",
                        "envoy.filters.http.router",
                        use_remote_address=True,
                    )
                ]
            },
        ),
    ]
    got = {item.name: item for item in _patched(_filter(LISTENER_PATCHES), SIDECAR, listeners=given)["listeners"]}

    assert sorted(got) == ["0.0.0.0_80", "0.0.0.0_8080", "new-outbound-listener"]
    port80 = got["0.0.0.0_80"]
    assert port80.listener_filters_timeout.seconds == 30
    assert [list(c.filter_chain_match.server_names) for c in port80.filter_chains] == [["bar.com"], ["added.com"]]
    assert [f.name for f in port80.filter_chains[0].filters] == ["before-tcp-proxy", "envoy.filters.network.tcp_proxy"]
    proxy = tcp_proxy_pb2.TcpProxy()
    port80.filter_chains[0].filters[1].typed_config.Unpack(proxy)
    assert (proxy.stat_prefix, proxy.cluster) == ("merged", "c")  # merged, not replaced

    port8080 = got["0.0.0.0_8080"]
    assert _http_filters(port8080) == [
        "http-filter0",
        "http-filter-new",
        "http-filter1.5",
        "http-filter2",
        "http-filter3",
        "envoy.filters.http.router",
    ]
    hcm = hcm_pb2.HttpConnectionManager()
    port8080.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    assert (hcm.xff_num_trusted_hops, hcm.use_remote_address.value) == (4, True)
    assert hcm.common_http_protocol_options.idle_timeout.seconds == 30


def test_inbound_virtual_listener_is_matched_by_its_chains_ports() -> None:
    virtual = _listener(
        {
            "name": "virtualInbound",
            "traffic_direction": "INBOUND",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
            "filter_chains": [
                {"filter_chain_match": {"destination_port": 9080}, "filters": [_hcm("envoy.filters.http.router")]},
                {"filter_chain_match": {"destination_port": 7070}, "filters": [_hcm("envoy.filters.http.router")]},
            ],
        }
    )
    inbound80 = _listener({"name": "10.0.0.99_80", "traffic_direction": "INBOUND",
                           "address": {"socket_address": {"address": "10.0.0.99", "port_value": 80}}})  # fmt: skip
    listeners = _patched(_filter(LISTENER_PATCHES), SIDECAR, listeners=[virtual, inbound80])["listeners"]
    # The 80 REMOVE (a LISTENER patch) matches the listener's own port; the HTTP filter ADD the
    # chain of port 9080, before the router. (The outbound ADD comes once, after them.)
    assert [x.name for x in listeners] == ["virtualInbound", "new-outbound-listener"]
    got = listeners[0]
    assert _http_filters(got, 0) == ["http-filter-inbound", "envoy.filters.http.router"]
    assert _http_filters(got, 1) == ["envoy.filters.http.router"]


def test_gateway_gets_no_sidecar_patch_and_any_context_adds_once() -> None:
    patches = """\
  - applyTo: LISTENER
    patch: {operation: ADD, value: {name: added-anywhere}}
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: REMOVE}
"""
    given = [_outbound(8080, {"filters": [_hcm("envoy.filters.http.router")]})]
    assert [x.name for x in _patched(_filter(patches), ROUTER, listeners=given)["listeners"]] == [
        "0.0.0.0_8080",
        "added-anywhere",
    ]
    assert [x.name for x in _patched(_filter(patches), SIDECAR, listeners=given)["listeners"]] == ["added-anywhere"]


MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-1, namespace: shop}
spec: {address: 10.0.0.5, labels: {app: web}}
"""

EVERY_KIND = """\
  - applyTo: HTTP_FILTER
    match:
      listener: {filterChain: {filter: {name: HCM_NAME, subFilter: {name: envoy.filters.http.router}}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: "function envoy_on_request(h) end"}
  - applyTo: NETWORK_FILTER
    match: {listener: {filterChain: {filter: {name: HCM_NAME}}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          xff_num_trusted_hops: 2
  - applyTo: LISTENER
    match: {context: SIDECAR_INBOUND}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 65536}}
  - applyTo: CLUSTER
    match: {cluster: {service: web.shop.mesh}}
    patch: {operation: MERGE, value: {connect_timeout: 3s, per_connection_buffer_limit_bytes: 32768}}
  - applyTo: ROUTE_CONFIGURATION
    patch: {operation: MERGE, value: {request_headers_to_remove: [x-internal]}}
  - applyTo: VIRTUAL_HOST
    patch:
      operation: ADD
      value: {name: added, domains: [added.example.com], routes: [{match: {prefix: /}, direct_response: {status: 204}}]}
  - applyTo: HTTP_ROUTE
    match: {routeConfiguration: {vhost: {name: "web.shop.mesh:8080"}}}
    patch: {operation: MERGE, value: {route: {timeout: 7s}}}
""".replace("HCM_NAME", HCM)


CLIENT = "sidecar~10.0.0.9~client.shop~shop.svc.cluster.local"


@needs_envoy
@pytest.mark.e2e
def test_a_real_envoy_accepts_a_mesh_every_kind_of_patch_touched(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH + "---\n" + _filter(EVERY_KIND, namespace="shop"))
    dump = subprocess.run(
        [*meshctl_command(), "dump", "--config-dir", str(tmp_path), "--proxy", CLIENT, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for patched in ("envoy.filters.http.lua", "xff_num_trusted_hops", "x-internal", "added.example.com", '"7s"'):
        assert patched in dump, patched
    proc = subprocess.run(
        [*meshctl_command(), "validate", str(tmp_path), "--envoy", "--proxy", CLIENT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no problems found" in proc.stderr


def test_simulate_routes_through_patched_config(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH + "---\n" + _filter(EVERY_KIND, namespace="shop"))
    command = [*meshctl_command(), "simulate", "--config-dir", str(tmp_path), "--proxy", CLIENT]
    added = subprocess.run(
        [*command, "http://added.example.com:8080/"], capture_output=True, text=True, timeout=120, check=False
    )
    assert added.returncode == 0, added.stderr
    assert "virtual host   added" in added.stdout and "204" in added.stdout
    web = subprocess.run(
        [*command, "http://web.shop.mesh:8080/", "-o", "json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert web.returncode == 0, web.stderr
    assert '"timeout": "7s"' in web.stdout


def test_listener_filter_operations() -> None:
    patches = """\
  - applyTo: LISTENER_FILTER
    match: {listener: {portNumber: 8080, listenerFilter: envoy.filters.listener.http_inspector}}
    patch: {operation: INSERT_BEFORE, value: {name: envoy.filters.listener.proxy_protocol}}
  - applyTo: LISTENER_FILTER
    match: {listener: {listenerFilter: envoy.filters.listener.tls_inspector}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER_FILTER
    match: {listener: {portNumber: 9090}}
    patch: {operation: ADD, value: {name: never-added}}
"""
    given = _outbound(8080, {"filters": [_hcm("envoy.filters.http.router")]})
    given.listener_filters.add(name="envoy.filters.listener.tls_inspector")
    given.listener_filters.add(name="envoy.filters.listener.http_inspector")
    (got,) = _patched(_filter(patches), SIDECAR, listeners=[given])["listeners"]
    assert [f.name for f in got.listener_filters] == [
        "envoy.filters.listener.proxy_protocol",
        "envoy.filters.listener.http_inspector",
    ]
