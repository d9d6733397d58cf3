"""WasmPlugin: which proxies a plugin selects, where its filter goes in their listeners, and what
Envoy is told (module, configuration, environment, failure policy), against Istio's rules; what
validation refuses; and a real Envoy (`meshctl validate --envoy`) loading a generated mesh with
an HTTP and a NETWORK plugin.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_envoy
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.wasm.v3 import wasm_pb2 as network_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from google.protobuf import json_format, wrappers_pb2

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.serve_process import meshctl_command
from meshctl.testing.wasm import header_module
from meshctl.xds import types
from meshctl.xds.wasm import apply_wasm_plugins

SIDECAR = "sidecar~10.0.0.99~client.shop~shop.svc.cluster.local"
OTHER = "sidecar~10.0.0.98~client.other~other.svc.cluster.local"
ROUTER = "router~10.0.0.97~gw.shop~shop.svc.cluster.local"
HCM = "envoy.filters.network.http_connection_manager"
_HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
CHAIN = ["envoy.filters.http.jwt_authn", "envoy.filters.http.rbac", "envoy.filters.http.grpc_stats",
         "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"]  # fmt: skip


def plugin(name: str, body: str = "", *, namespace: str = "shop", url: str = "file:///opt/wasm/m.wasm") -> str:
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  url: {url}
{body}"""


def _listener(port: int, direction: str = "OUTBOUND", filters: list[str] | None = None) -> Any:
    hcm = {"name": HCM, "typed_config": {"@type": _HCM_TYPE, "stat_prefix": "x",
           "http_filters": [{"name": f} for f in (CHAIN if filters is None else filters)]}}  # fmt: skip
    data = {"name": f"0.0.0.0_{port}", "traffic_direction": direction,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
            "filter_chains": [{"filters": [hcm]}]}  # fmt: skip
    return json_format.ParseDict(data, listener_pb2.Listener())


def _hcm(listener: Any) -> Any:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[-1].typed_config.Unpack(hcm)
    return hcm


def _filters(yaml: str, node: str = SIDECAR, *listeners: Any) -> list[list[str]]:
    snapshot = snapshot_from_yaml(yaml)
    proxy = proxy_for(snapshot, node)
    config = {types.CLUSTER: (), types.ROUTE: (), types.LISTENER: listeners or (_listener(80),)}
    out = apply_wasm_plugins(config, proxy)[types.LISTENER]
    return [[f.name for f in _hcm(listener).http_filters] for listener in out]


def test_phases_and_priorities_place_plugins_as_istio_does() -> None:
    yaml = "---\n".join(
        [
            plugin("stats", "  phase: STATS\n"),
            plugin("authn", "  phase: AUTHN\n"),
            plugin("authz-low", "  phase: AUTHZ\n  priority: -5\n"),
            plugin("authz-high", "  phase: AUTHZ\n  priority: 10\n"),
            plugin("anywhere"),
            plugin("mesh-wide", "  phase: AUTHZ\n", namespace="istio-system"),
        ]
    )
    (chain,) = _filters(yaml)
    assert (
        chain
        == [
            "shop.authn",
            "envoy.filters.http.jwt_authn",
            "shop.authz-high",  # priority 10
            "istio-system.mesh-wide",  # priority 0: the root namespace's before the proxy's
            "shop.authz-low",  # priority -5
            "envoy.filters.http.rbac",
            "shop.stats",
            "shop.anywhere",
            *CHAIN[2:],
        ]
    )


def test_without_security_filters_every_phase_goes_before_the_rest_of_the_chain() -> None:
    yaml = plugin("late") + "---\n" + plugin("early", "  phase: AUTHN\n")
    (chain,) = _filters(yaml, SIDECAR, _listener(80, filters=CHAIN[2:]))
    assert chain == ["shop.early", "shop.late", *CHAIN[2:]]


def test_match_mode_and_ports_choose_the_listeners() -> None:
    yaml = "---\n".join(
        [
            plugin("client", "  match: [{mode: CLIENT}]\n"),
            plugin("server", "  match: [{mode: SERVER, ports: [{number: 8080}]}]\n"),
            plugin("port-80", "  match: [{ports: [{number: 80}]}]\n"),
        ]
    )
    listeners = (_listener(80, filters=CHAIN[2:]), _listener(8080, "INBOUND", CHAIN[2:]), _listener(9090, "INBOUND"))
    outbound, inbound_8080, inbound_9090 = _filters(yaml, SIDECAR, *listeners)
    assert outbound[:2] == ["shop.client", "shop.port-80"]
    assert inbound_8080[0] == "shop.server"
    assert inbound_9090 == CHAIN
    (gateway,) = _filters(yaml, ROUTER, _listener(80, filters=CHAIN[2:]))
    assert gateway[:2] == ["shop.client", "shop.port-80"]  # a gateway's traffic is CLIENT


WORKLOADS = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-1, namespace: shop}
spec: {address: 10.0.0.99, labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: db-1, namespace: shop}
spec: {address: 10.0.0.96, labels: {app: db}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop}
spec:
  selector: {istio: edge}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]
---
"""


@pytest.mark.parametrize(
    ("body", "selected"),
    [
        ("", {"web", "db", "gateway"}),
        ("  selector: {matchLabels: {app: web}}\n", {"web"}),
        ("  targetRefs: [{kind: ServiceEntry, group: networking.istio.io, name: web}]\n", {"web"}),
        ("  targetRefs: [{kind: Service, group: '', name: web}]\n", {"web"}),
        ("  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: edge}]\n", {"gateway"}),
        ("  targetRefs: [{kind: Service, name: nothing}]\n", set()),
    ],
)
def test_selection_by_namespace_selector_and_target_refs(body: str, selected: set[str]) -> None:
    snapshot = snapshot_from_yaml(WORKLOADS + plugin("p", body))
    nodes = {
        "web": "sidecar~10.0.0.99~web-1.shop~shop.svc.cluster.local",
        "db": "sidecar~10.0.0.96~db-1.shop~shop.svc.cluster.local",
        "gateway": "router~10.0.0.97~edge.shop~shop.svc.cluster.local",
        "other namespace": OTHER,
    }
    metadata = {"gateway": {"LABELS": {"istio": "edge"}}}
    found = {name for name, node in nodes.items() if proxy_for(snapshot, node, metadata.get(name)).wasm_plugins}
    assert found == selected


def test_the_root_namespace_applies_to_every_proxy() -> None:
    snapshot = snapshot_from_yaml(plugin("p", namespace="istio-system"))
    assert proxy_for(snapshot, OTHER).wasm_plugins and proxy_for(snapshot, SIDECAR).wasm_plugins
    snapshot = snapshot_from_yaml(plugin("p"))
    assert not proxy_for(snapshot, OTHER).wasm_plugins and proxy_for(snapshot, SIDECAR).wasm_plugins


def _wasm_config(listener: Any, name: str) -> Any:
    wasm = http_wasm_pb2.Wasm()
    next(f for f in _hcm(listener).http_filters if f.name == name).typed_config.Unpack(wasm)
    return wasm.config


def test_what_envoy_is_told_of_a_plugin() -> None:
    body = """  pluginName: my-root
  pluginConfig: {header: x-a, limits: {rps: 10, burst: 2.5}, on: true}
  failStrategy: FAIL_OPEN
  vmConfig:
    env:
    - {name: POD_NAME, valueFrom: HOST}
    - {name: MODE, value: strict}
"""
    snapshot = snapshot_from_yaml(plugin("p", body, url="file:///opt/wasm/filter.wasm"))
    (listener,) = apply_wasm_plugins({types.LISTENER: (_listener(80),)}, proxy_for(snapshot, SIDECAR))[types.LISTENER]
    config = _wasm_config(listener, "shop.p")
    assert config.name == "shop.p" and config.root_id == "my-root"
    assert config.failure_policy == wasm_pb2.FAIL_OPEN
    assert config.vm_config.runtime == "envoy.wasm.runtime.v8"
    assert config.vm_config.code.local.filename == "/opt/wasm/filter.wasm"
    assert list(config.vm_config.environment_variables.host_env_keys) == ["POD_NAME"]
    assert dict(config.vm_config.environment_variables.key_values) == {"MODE": "strict"}
    text = wrappers_pb2.StringValue()
    config.configuration.Unpack(text)
    assert json.loads(text.value) == {"header": "x-a", "limits": {"rps": 10, "burst": 2.5}, "on": True}
    assert '"rps":10}' in text.value  # whole numbers as protojson writes them, not 10.0


def test_a_network_plugin_goes_before_the_terminal_network_filter() -> None:
    snapshot = snapshot_from_yaml(plugin("tcp", "  type: NETWORK\n"))
    (listener,) = apply_wasm_plugins({types.LISTENER: (_listener(80),)}, proxy_for(snapshot, SIDECAR))[types.LISTENER]
    assert [f.name for f in listener.filter_chains[0].filters] == ["shop.tcp", HCM]
    wasm = network_wasm_pb2.Wasm()
    listener.filter_chains[0].filters[0].typed_config.Unpack(wasm)
    assert wasm.config.failure_policy == wasm_pb2.FAIL_CLOSED
    assert [f.name for f in _hcm(listener).http_filters] == CHAIN


def _findings(text: str) -> list[tuple[Severity, str, str]]:
    return [(f.severity, f.field, f.message) for f in load_text(text, "wasm.yaml").findings]


def test_sha256_is_checked_against_the_module(tmp_path: Path) -> None:
    module = tmp_path / "m.wasm"
    module.write_bytes(header_module())
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    url = f"file://{module}"
    assert _findings(plugin("p", f"  sha256: {digest}\n", url=url)) == []
    ((severity, field, message),) = _findings(plugin("p", f"  sha256: {'ab' * 32}\n", url=url))
    assert (severity, field) == (Severity.ERROR, "spec.sha256")
    assert f"has sha256 {digest}, not {'ab' * 32}" in message
    ((severity, field, message),) = _findings(plugin("p", f"  sha256: {digest}\n", url=f"file://{tmp_path}/gone.wasm"))
    assert (severity, field) == (Severity.ERROR, "spec.sha256") and "cannot check the sha256" in message


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ("  sha256: ABC\n", "spec.sha256", "64 lowercase hex digits"),
        ("  targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: x}]\n",
         "spec.targetRefs[0].kind", "GatewayClass"),
        ("  targetRefs: [{kind: Pod, name: x}]\n", "spec.targetRefs[0].kind", "not core/Pod"),
        ("  selector: {matchLabels: {a: b}}\n  targetRefs: [{kind: Service, name: x}]\n", "spec.targetRefs[0]",
         "only one of targetRefs or selector"),
        ("  vmConfig: {env: [{name: A, valueFrom: HOST, value: x}]}\n", "spec.vmConfig.env[0].value", "INLINE"),
        ("  vmConfig: {env: [{name: A}, {name: A}]}\n", "spec.vmConfig.env[1].name", "duplicate"),
        ("  match: [{ports: [{number: 70000}]}]\n", "spec.match[0].ports[0].number", "1-65535"),
    ],
)  # fmt: skip
def test_validation_errors_name_the_field(body: str, field: str, message: str) -> None:
    errors = [(f, m) for s, f, m in _findings(plugin("p", body)) if s is Severity.ERROR]
    assert any(f == field and message in m for f, m in errors), errors


def test_a_relative_module_path_is_an_error() -> None:
    errors = [(f, m) for s, f, m in _findings(plugin("p", url="file://m.wasm")) if s is Severity.ERROR]
    assert errors == [("spec.url", "url 'file://m.wasm' must name an absolute path (file:///path/to/module.wasm)")]


MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.21}]
---
"""


@needs_envoy
def test_a_real_envoy_loads_the_generated_http_and_network_plugins(tmp_path: Path) -> None:
    module = tmp_path / "m.wasm"
    module.write_bytes(header_module())
    url = f"file://{module}"
    yaml = MESH + plugin("http", "  phase: AUTHN\n", url=url) + "---\n" + plugin("tcp", "  type: NETWORK\n", url=url)
    (tmp_path / "mesh.yaml").write_text(yaml)
    node = "sidecar~127.0.0.9~client.shop~shop.svc.cluster.local"
    dump = subprocess.run(
        [*meshctl_command(), "dump", "--config-dir", str(tmp_path), "--proxy", node, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "filters.http.wasm.v3.Wasm" in dump and "filters.network.wasm.v3.Wasm" in dump
    proc = subprocess.run(
        [*meshctl_command(), "validate", str(tmp_path), "--envoy", "--proxy", node],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no problems found" in proc.stderr


def test_a_wasm_plugin_change_regenerates_only_the_proxies_it_selects() -> None:
    from test_cache import MESH, SECOND_V1, assert_serves_what_generate_makes, node

    from meshctl.server.cache import ResourceCache

    reviews, reviews_b, details = (
        node("reviews-v1-vm", "10.10.0.41"),
        node("reviews-v1-b", "10.10.0.44"),
        node("details-v1-vm", "10.10.0.21"),
    )
    wasm = "---\n" + plugin("stamp", "  selector: {matchLabels: {app: reviews}}\n", namespace="bookinfo")
    before = snapshot_from_yaml(MESH + SECOND_V1)
    after = snapshot_from_yaml(MESH + SECOND_V1 + wasm)
    changed = snapshot_from_yaml(MESH + SECOND_V1 + wasm.replace("m.wasm", "n.wasm"))
    cache = ResourceCache()
    old = {n: cache.resources(before, proxy_for(before, n)) for n in (reviews, reviews_b, details)}
    outbound = cache.outbound_generations
    new = {n: cache.resources(after, proxy_for(after, n)) for n in (reviews, reviews_b, details)}
    assert cache.outbound_generations == outbound  # no outbound part reads WasmPlugins
    for t in (types.CLUSTER, types.LISTENER, types.ROUTE):
        assert new[details].of(t) is old[details].of(t), t  # not selected: the same sets
    listeners = new[reviews].of(types.LISTENER)
    assert listeners is not old[reviews].of(types.LISTENER)
    assert any(b"/opt/wasm/m.wasm" in r.body for r in listeners.values())
    assert listeners is new[reviews_b].of(types.LISTENER)  # two replicas share one set
    assert_serves_what_generate_makes(new[reviews], after, proxy_for(after, reviews), "with the plugin")
    third = cache.resources(changed, proxy_for(changed, reviews)).of(types.LISTENER)
    assert any(b"/opt/wasm/n.wasm" in r.body for r in third.values())


def test_validate_names_file_line_resource_and_field_of_a_sha256_mismatch(tmp_path: Path) -> None:
    module = tmp_path / "m.wasm"
    module.write_bytes(header_module())
    config = tmp_path / "config"
    config.mkdir()
    body = f"  sha256: {'ab' * 32}\n  selector: {{matchLabels: {{app: nowhere}}}}\n"
    (config / "wasm.yaml").write_text(plugin("p", body, url=f"file://{module}"))
    proc = subprocess.run(
        [*meshctl_command(), "validate", str(config)], capture_output=True, text=True, timeout=120, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    (line,) = [x for x in output.splitlines() if "spec.sha256" in x]
    assert "wasm.yaml:6:3 WasmPlugin shop/p spec.sha256: " in line and "the plugin is not applied" in line
    assert "IST0127" in output  # its selector selects no workload
