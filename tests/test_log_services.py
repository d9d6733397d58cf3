"""Telemetry access logs sent to a collector service (`envoyHttpAls`, `envoyTcpAls`,
`envoyOtelAls`) as Istio's telemetry_logging.go builds them, with the collector's cluster and
the Telemetry's CEL filter; and a sample of every tracer and log service the real Envoy loads
through `meshctl validate --envoy`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import needs_envoy, runner
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.access_loggers.open_telemetry.v3 import logs_service_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from opentelemetry.proto.common.v1 import common_pb2
from ruamel.yaml import YAML
from test_tracing import HOST, MESH_YAML, OTEL_GRPC_CLUSTER, generated, managers, settings, telemetry

from meshctl.cli.app import app
from meshctl.config.findings import Severity
from meshctl.config.mesh import mesh_settings
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.access_log import TEXT_FORMAT
from meshctl.xds.generate import generate

HTTP_ALS = {
    "name": "http-als",
    "envoyHttpAls": {
        "service": HOST,
        "port": 4317,
        "logName": "shop",
        "additionalRequestHeadersToLog": ["x-user"],
    },
}
TCP_ALS = {"name": "tcp-als", "envoyTcpAls": {"service": HOST, "port": 4317}}
OTEL_ALS = {
    "name": "otel-als",
    "envoyOtelAls": {"service": HOST, "port": 4317, "logFormat": {"labels": {"status": "%RESPONSE_CODE%"}}},
}


def logs(mesh: Any, spec: str, inbound: bool | None = False) -> list[Any]:
    found = managers(generated(mesh, telemetry("ns", "app", spec)), inbound=inbound)
    assert found
    return list(found[0].access_log)


def grpc_common(log_name: str) -> als_pb2.CommonGrpcAccessLogConfig:
    common = als_pb2.CommonGrpcAccessLogConfig(log_name=log_name, transport_api_version=2)
    common.grpc_service.envoy_grpc.cluster_name = OTEL_GRPC_CLUSTER
    common.grpc_service.envoy_grpc.authority = HOST
    return common


def test_http_als_as_istio_builds_it() -> None:
    [log] = logs(settings(HTTP_ALS), "{accessLogging: [{providers: [{name: http-als}]}]}")
    assert log.name == "envoy.access_loggers.http_grpc"
    config = als_pb2.HttpGrpcAccessLogConfig()
    log.typed_config.Unpack(config)
    assert config == als_pb2.HttpGrpcAccessLogConfig(
        common_config=grpc_common("shop"), additional_request_headers_to_log=["x-user"]
    )


def test_tcp_als_logs_tcp_proxies_too() -> None:
    mesh = settings(TCP_ALS)
    yaml = (
        telemetry("ns", "app", "{accessLogging: [{providers: [{name: tcp-als}]}]}")
        + """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: app}
spec:
  hosts: [db.app.mesh]
  addresses: [10.1.0.5]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  endpoints: [{address: 10.0.0.60}]
---"""
    )
    resources = generated(mesh, yaml)
    proxies = []
    for listener in resources[types.LISTENER]:
        for chain in listener.filter_chains:
            for f in chain.filters:
                if f.typed_config.Is(tcp_proxy_pb2.TcpProxy.DESCRIPTOR):
                    proxy = tcp_proxy_pb2.TcpProxy()
                    f.typed_config.Unpack(proxy)
                    if proxy.cluster.endswith("db.app.mesh"):
                        proxies.append(proxy)
    assert proxies
    for proxy in proxies:
        [log] = proxy.access_log
        config = als_pb2.TcpGrpcAccessLogConfig()
        log.typed_config.Unpack(config)
        assert log.name == "envoy.access_loggers.tcp_grpc"
        assert config.common_config == grpc_common("tcp_envoy_accesslog")


def test_otel_als_with_labels_and_the_filter_expression() -> None:
    spec = "{accessLogging: [{providers: [{name: otel-als}], filter: {expression: 'response.code >= 500'}}]}"
    [log] = logs(settings(OTEL_ALS), spec)
    assert log.name == "envoy.access_loggers.open_telemetry"
    config = logs_service_pb2.OpenTelemetryAccessLogConfig()
    log.typed_config.Unpack(config)
    want = logs_service_pb2.OpenTelemetryAccessLogConfig(
        common_config=grpc_common("otel_envoy_accesslog"),
        disable_builtin_labels=True,
        body=common_pb2.AnyValue(string_value=TEXT_FORMAT),
    )
    want.attributes.values.add(key="status", value=common_pb2.AnyValue(string_value="%RESPONSE_CODE%"))
    assert config == want
    cel = cel_pb2.ExpressionFilter()
    log.filter.extension_filter.typed_config.Unpack(cel)
    assert cel.expression == "response.code >= 500"


def test_log_service_collector_cluster_is_sent_and_disabled_sides_log_nothing() -> None:
    spec = (
        "{accessLogging: [{providers: [{name: http-als}]}, {match: {mode: SERVER}, providers: [{name: http-als}],"
        " disabled: true}]}"
    )
    mesh = settings(HTTP_ALS)
    scoped = """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec:
  egress: [{hosts: ["./*"]}]
---"""
    resources = generated(mesh, scoped + telemetry("ns", "app", spec))
    assert OTEL_GRPC_CLUSTER in {c.name for c in resources[types.CLUSTER]}
    assert all(not m.access_log for m in managers(resources, inbound=True))
    assert all(m.access_log for m in managers(resources, inbound=False))


def test_provider_settings_are_checked_with_their_field() -> None:
    cases = [
        ({"name": "z", "zipkin": {"port": 9411}}, "extensionProviders[0].zipkin.service"),
        ({"name": "z", "zipkin": {"service": HOST, "port": 0}}, "extensionProviders[0].zipkin.port"),
        ({"name": "z", "zipkin": {"service": HOST, "port": 1, "timeout": "soon"}},
         "extensionProviders[0].zipkin.timeout"),
        ({"name": "o", "opentelemetry": {"service": HOST, "port": 1, "http": {}, "grpc": {}}},
         "extensionProviders[0].opentelemetry"),
    ]  # fmt: skip
    for provider, field in cases:
        _, findings = mesh_settings({"extensionProviders": [provider]})
        assert [f.field for f in findings if f.severity is Severity.ERROR] == [field], findings
    _, findings = mesh_settings({"extensionProviders": [{"name": "ls", "lightstep": {"service": HOST, "port": 1}}]})
    assert [(f.severity, f.field) for f in findings] == [(Severity.WARNING, "extensionProviders[0]")]
    assert "opentelemetry" in findings[0].message


SAMPLE_MESH = f"""
extensionProviders:
- {{name: zipkin, zipkin: {{service: {HOST}, port: 9411, maxTagLength: 256}}}}
- {{name: otel, opentelemetry: {{service: {HOST}, port: 4317, grpc: {{timeout: 3s}}}}}}
- {{name: otel-http, opentelemetry: {{service: {HOST}, port: 9411, http: {{path: /v1/traces}},
    resourceDetectors: {{environment: {{}}}}}}}}
- {{name: dd, datadog: {{service: {HOST}, port: 9411}}}}
- {{name: sw, skywalking: {{service: {HOST}, port: 4317}}}}
- {{name: http-als, envoyHttpAls: {{service: {HOST}, port: 4317}}}}
- {{name: tcp-als, envoyTcpAls: {{service: {HOST}, port: 4317}}}}
- {{name: otel-als, envoyOtelAls: {{service: {HOST}, port: 4317, logFormat: {{text: "%REQ(:PATH)%"}}}}}}
"""


def _workload(name: str, address: str) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: app}}
spec: {{address: {address}, labels: {{app: {name}}}}}
---"""


@pytest.mark.e2e
@needs_envoy
def test_envoy_loads_every_tracer_and_log_service(tmp_path: Path) -> None:
    tracers = ["zipkin", "otel", "otel-http", "dd", "sw"]
    yaml = MESH_YAML + telemetry(
        "logs", "app", "{accessLogging: [{providers: [{name: http-als}, {name: tcp-als}, {name: otel-als}]}]}"
    )
    for i, tracer in enumerate(tracers):
        name = f"w{i}"
        selected = f"{{selector: {{matchLabels: {{app: {name}}}}}, tracing: [{{providers: [{{name: {tracer}}}]}}]}}"
        yaml += _workload(name, f"10.0.1.{i + 1}") + telemetry(f"t-{tracer}", "app", selected)
    (tmp_path / "mesh.yaml").write_text(SAMPLE_MESH)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "all.yaml").write_text(yaml)
    result = runner.invoke(app, ["validate", str(tree), "--mesh-config", str(tmp_path / "mesh.yaml"), "--envoy"])
    assert result.exit_code == 0, result.output
    assert "checked 6 proxy config(s)" in result.output, result.output
    # What Envoy loaded has each tracer and every log service on the workloads' listeners.
    mesh, _ = mesh_settings(YAML().load(SAMPLE_MESH))
    snapshot = snapshot_from_yaml(yaml, mesh=mesh)
    names = {"zipkin": "zipkin", "otel": "opentelemetry", "otel-http": "opentelemetry", "dd": "datadog",
             "sw": "skywalking"}  # fmt: skip
    for i, tracer in enumerate(tracers):
        node = f"sidecar~10.0.1.{i + 1}~w{i}.app~app.svc.cluster.local"
        found = managers(generate(snapshot, proxy_for(snapshot, node)))
        assert {m.tracing.provider.name for m in found} == {f"envoy.tracers.{names[tracer]}"}
        assert all(len(m.access_log) == 3 for m in found)
