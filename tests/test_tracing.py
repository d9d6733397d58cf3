"""Telemetry tracing: the connection manager's `tracing` per provider as Istio's pilot builds it
(its tracing_test.go cases, on meshctl's generated listeners), the hierarchy and precedence of
Telemetry levels, the collectors' clusters, and what validate says of a collector it does not know."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import runner
from envoy.config.core.v3 import base_pb2, grpc_service_pb2, http_service_pb2, http_uri_pb2
from envoy.config.trace.v3 import datadog_pb2, opentelemetry_pb2, skywalking_pb2, zipkin_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.extensions.tracers.opentelemetry.resource_detectors.v3 import (
    dynatrace_resource_detector_pb2,
    environment_resource_detector_pb2,
)
from envoy.type.metadata.v3 import metadata_pb2
from envoy.type.tracing.v3 import custom_tag_pb2
from google.protobuf import duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from meshctl.cli.app import app
from meshctl.config.findings import Severity
from meshctl.config.mesh import MeshSettings, mesh_settings
from meshctl.snapshot.collectors import collector_problems
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.server import run, serving
from meshctl.xds import types
from meshctl.xds.generate import generate

CLUSTER = "outbound|9411||collector.obs.mesh"
HOST = "collector.obs.mesh"
NODE = "sidecar~10.0.0.7~a-1.app~app.svc.cluster.local"

MESH_YAML = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: collector, namespace: obs}
spec:
  hosts: [collector.obs.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9411, name: http, protocol: HTTP}, {number: 4317, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.0.0.50}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shop, namespace: app}
spec:
  hosts: [shop.app.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a-1, namespace: app}
spec: {address: 10.0.0.7, labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cart, namespace: app}
spec:
  hosts: [cart.app.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9081, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.9}]
---"""

#: The tracing entry Istio's cases use: sampling 99.999 and an environment tag `test` (FOO).
ISTIO_CASE = (
    "{providers: [{name: %s}], randomSamplingPercentage: 99.999, customTags: {test: {environment: {name: FOO}}}}"
)


def settings(*providers: dict[str, Any], **extra: Any) -> MeshSettings:
    found, findings = mesh_settings({"extensionProviders": list(providers), **extra})
    assert found is not None, findings
    assert not [f for f in findings if f.severity is Severity.ERROR], findings
    return found


def telemetry(name: str, namespace: str, spec: str) -> str:
    return f"""
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: {name}, namespace: {namespace}}}
spec: {spec}
---"""


def managers(resources: Any, inbound: bool | None = None) -> list[hcm_pb2.HttpConnectionManager]:
    """Every HTTP connection manager of the listeners (only inbound ones, only outbound ones)."""
    out = []
    for listener in resources[types.LISTENER]:
        is_inbound = listener.name.startswith("10.0.0.7_") or listener.name == "virtualInbound"
        if inbound is not None and is_inbound != inbound:
            continue
        for chain in [*listener.filter_chains, listener.default_filter_chain]:
            for f in chain.filters:
                if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                    manager = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(manager)
                    out.append(manager)
    return out


def generated(mesh: MeshSettings, yaml: str, node: str = NODE, labels: dict[str, str] | None = None) -> Any:
    snapshot = snapshot_from_yaml(MESH_YAML + yaml, mesh=mesh)
    metadata: dict[str, Any] = {"INTERCEPTION_MODE": "REDIRECT"}
    if labels is not None:
        metadata["LABELS"] = labels
    return generate(snapshot, proxy_for(snapshot, node, metadata))


def outbound_tracing(mesh: MeshSettings, entry: str) -> hcm_pb2.HttpConnectionManager.Tracing | None:
    """The one tracing every outbound connection manager has with a namespace Telemetry of one
    tracing `entry` (None: none has any)."""
    found = managers(generated(mesh, telemetry("ns", "app", "{tracing: [" + entry + "]}")), inbound=False)
    assert found
    tracings = {m.tracing.SerializeToString(deterministic=True) for m in found}
    assert len(tracings) == 1, "every outbound connection manager traces alike"
    return found[0].tracing if found[0].HasField("tracing") else None


def literal(tag: str, value: str) -> custom_tag_pb2.CustomTag:
    return custom_tag_pb2.CustomTag(tag=tag, literal=custom_tag_pb2.CustomTag.Literal(value=value))


def policy(tag: str, key: str) -> custom_tag_pb2.CustomTag:
    meta = custom_tag_pb2.CustomTag.Metadata(
        kind=metadata_pb2.MetadataKind(request=metadata_pb2.MetadataKind.Request()),
        metadata_key=metadata_pb2.MetadataKey(
            key="envoy.filters.http.rbac", path=[metadata_pb2.MetadataKey.PathSegment(key=key)]
        ),
    )
    return custom_tag_pb2.CustomTag(tag=tag, metadata=meta)


#: Istio's defaultTracingTags() plus its `test` environment tag, for workload a-1 of namespace app
#: (canonical service from its `app` label; Istio's test proxy has none, so `unknown`/`default`).
ISTIO_TAGS = [
    policy("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
    policy("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
    policy("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
    policy("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"),
    literal("istio.canonical_revision", "latest"),
    literal("istio.canonical_service", "a"),
    literal("istio.cluster_id", "unknown"),
    literal("istio.mesh_id", "unknown"),
    literal("istio.namespace", "app"),
    custom_tag_pb2.CustomTag(tag="test", environment=custom_tag_pb2.CustomTag.Environment(name="FOO")),
]


def expected(
    name: str, config: Message, max_tag: int = 256, spawn: bool = False
) -> hcm_pb2.HttpConnectionManager.Tracing:
    """Istio's fakeTracingConfig: sampling 100/100/99.999, its tags, the provider's config."""
    out = hcm_pb2.HttpConnectionManager.Tracing(custom_tags=ISTIO_TAGS)
    out.client_sampling.value = 100.0
    out.overall_sampling.value = 100.0
    out.random_sampling.value = 99.999
    out.provider.name = name
    out.provider.typed_config.Pack(config)
    if max_tag:
        out.max_path_tag_length.value = max_tag
    if spawn:
        out.spawn_upstream_span.value = True
    return out


def zipkin_config(path: str = "/api/v2/spans", id128: bool = True, w3c: bool = False) -> zipkin_pb2.ZipkinConfig:
    return zipkin_pb2.ZipkinConfig(
        collector_endpoint_version=zipkin_pb2.ZipkinConfig.HTTP_JSON,
        trace_id_128bit=id128,
        shared_span_context=wrappers_pb2.BoolValue(value=False),
        collector_service=http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(
                uri=f"http://{HOST}{path}", cluster=CLUSTER, timeout=duration_pb2.Duration(seconds=5)
            )
        ),
        trace_context_option=(
            zipkin_pb2.ZipkinConfig.USE_B3_WITH_W3C_PROPAGATION if w3c else zipkin_pb2.ZipkinConfig.USE_B3
        ),
    )


def assert_same(got: Message | None, want: Message) -> None:
    assert got is not None
    # Any fields compare by bytes: unpack the provider's config to show a readable difference.
    assert got.provider.name == want.provider.name
    kind = type(want_config := _unpacked(want))
    assert _unpacked(got, kind) == want_config
    got_rest, want_rest = type(got)(), type(want)()
    got_rest.CopyFrom(got)
    want_rest.CopyFrom(want)
    got_rest.ClearField("provider")
    want_rest.ClearField("provider")
    assert got_rest == want_rest


def _unpacked(tracing: Any, kind: type[Message] | None = None) -> Message:
    for candidate in (kind,) if kind else (
        zipkin_pb2.ZipkinConfig, opentelemetry_pb2.OpenTelemetryConfig, datadog_pb2.DatadogConfig,
        skywalking_pb2.SkyWalkingConfig,
    ):  # fmt: skip
        assert candidate is not None
        if tracing.provider.typed_config.Is(candidate.DESCRIPTOR):
            out = candidate()
            tracing.provider.typed_config.Unpack(out)
            return out
    raise AssertionError(tracing.provider.typed_config.type_url)


ZIPKIN = {"name": "zipkin", "zipkin": {"service": HOST, "port": 9411, "maxTagLength": 256}}
OTEL_GRPC = {"name": "otel", "opentelemetry": {"service": HOST, "port": 4317, "maxTagLength": 256}}
OTEL_HTTP = {
    "name": "otel",
    "opentelemetry": {
        "service": HOST,
        "port": 4317,
        "maxTagLength": 256,
        "http": {
            "path": "/v1/traces",
            "timeout": "3s",
            "headers": [{"name": "custom-header", "value": "custom-value"}],
        },
    },
}
OTEL_GRPC_CLUSTER = "outbound|4317||collector.obs.mesh"


def otel_http_config(**extra: Any) -> opentelemetry_pb2.OpenTelemetryConfig:
    return opentelemetry_pb2.OpenTelemetryConfig(
        service_name="a.app",
        http_service=http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(
                uri=f"{HOST}/v1/traces", cluster=OTEL_GRPC_CLUSTER, timeout=duration_pb2.Duration(seconds=3)
            ),
            request_headers_to_add=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key="custom-header", value="custom-value"),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            ],
        ),
        **extra,
    )


def test_zipkin_as_istio_builds_it() -> None:
    got = outbound_tracing(settings(ZIPKIN), ISTIO_CASE % "zipkin")
    assert_same(got, expected("envoy.tracers.zipkin", zipkin_config()))


@pytest.mark.parametrize(
    ("options", "config"),
    [
        ({"enable64bitTraceId": True}, zipkin_config(id128=False)),
        ({"path": "/custom/path/api/v2/spans"}, zipkin_config(path="/custom/path/api/v2/spans")),
        ({"traceContextOption": "USE_B3_WITH_W3C_PROPAGATION"}, zipkin_config(w3c=True)),
        ({"traceContextOption": "USE_B3"}, zipkin_config()),
    ],
)
def test_zipkin_options(options: dict[str, Any], config: zipkin_pb2.ZipkinConfig) -> None:
    provider = {"name": "zipkin", "zipkin": {**ZIPKIN["zipkin"], **options}}
    got = outbound_tracing(settings(provider), ISTIO_CASE % "zipkin")
    assert_same(got, expected("envoy.tracers.zipkin", config))


def test_datadog_names_the_proxy_as_its_service() -> None:
    provider = {"name": "dd", "datadog": {"service": HOST, "port": 9411, "maxTagLength": 256}}
    got = outbound_tracing(settings(provider), ISTIO_CASE % "dd")
    config = datadog_pb2.DatadogConfig(collector_cluster=CLUSTER, service_name="a.app", collector_hostname=HOST)
    assert_same(got, expected("envoy.tracers.datadog", config))


def test_skywalking_spawns_an_upstream_span_and_has_no_tag_length() -> None:
    provider = {"name": "sw", "skywalking": {"service": HOST, "port": 9411}}
    got = outbound_tracing(settings(provider), ISTIO_CASE % "sw")
    grpc = grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=CLUSTER, authority=HOST)
    )
    config = skywalking_pb2.SkyWalkingConfig(grpc_service=grpc)
    assert_same(got, expected("envoy.tracers.skywalking", config, max_tag=0, spawn=True))


def test_opentelemetry_over_grpc() -> None:
    got = outbound_tracing(settings(OTEL_GRPC), ISTIO_CASE % "otel")
    grpc = grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=OTEL_GRPC_CLUSTER, authority=HOST)
    )
    config = opentelemetry_pb2.OpenTelemetryConfig(service_name="a.app", grpc_service=grpc)
    assert_same(got, expected("envoy.tracers.opentelemetry", config))


def test_opentelemetry_over_grpc_with_initial_metadata() -> None:
    provider = {
        "name": "otel",
        "opentelemetry": {
            **OTEL_GRPC["opentelemetry"],
            "grpc": {"timeout": "3s", "initialMetadata": [{"name": "Authentication", "value": "token-xxxxx"}]},
        },
    }
    got = outbound_tracing(settings(provider), ISTIO_CASE % "otel")
    grpc = grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=OTEL_GRPC_CLUSTER, authority=HOST),
        timeout=duration_pb2.Duration(seconds=3),
        initial_metadata=[base_pb2.HeaderValue(key="Authentication", value="token-xxxxx")],
    )
    config = opentelemetry_pb2.OpenTelemetryConfig(service_name="a.app", grpc_service=grpc)
    assert_same(got, expected("envoy.tracers.opentelemetry", config))


def test_opentelemetry_over_http() -> None:
    got = outbound_tracing(settings(OTEL_HTTP), ISTIO_CASE % "otel")
    assert_same(got, expected("envoy.tracers.opentelemetry", otel_http_config()))


def test_opentelemetry_resource_detectors() -> None:
    provider = {"name": "otel", "opentelemetry": {**OTEL_HTTP["opentelemetry"], "resourceDetectors": {
        "environment": {}, "dynatrace": {}}}}  # fmt: skip
    got = outbound_tracing(settings(provider), ISTIO_CASE % "otel")
    env, dyna = (
        environment_resource_detector_pb2.EnvironmentResourceDetectorConfig(),
        dynatrace_resource_detector_pb2.DynatraceResourceDetectorConfig(),
    )
    config = otel_http_config()
    config.resource_detectors.add(name="envoy.tracers.opentelemetry.resource_detectors.environment").typed_config.Pack(
        env
    )
    config.resource_detectors.add(name="envoy.tracers.opentelemetry.resource_detectors.dynatrace").typed_config.Pack(
        dyna
    )
    assert_same(got, expected("envoy.tracers.opentelemetry", config))


def test_istio_tags_off_leaves_the_custom_ones() -> None:
    spec = "{providers: [{name: zipkin}], enableIstioTags: false, customTags: {lit: {literal: {value: v}}, " \
        "hdr: {header: {name: x-user, defaultValue: none}}}}"  # fmt: skip
    got = outbound_tracing(settings(ZIPKIN), spec)
    assert got is not None
    assert list(got.custom_tags) == [
        custom_tag_pb2.CustomTag(
            tag="hdr", request_header=custom_tag_pb2.CustomTag.Header(name="x-user", default_value="none")
        ),
        literal("lit", "v"),
    ]
    assert got.random_sampling.value == 1.0  # Istio's default when no level sets one


def test_a_prometheus_provider_does_not_trace() -> None:
    # Istio's "invalid provider" case: a provider kind that does not trace gives no tracing.
    mesh = settings(ZIPKIN, {"name": "prom", "prometheus": {}})
    assert outbound_tracing(mesh, ISTIO_CASE % "prom") is None


def test_disable_span_reporting_and_unknown_providers_give_no_tracing() -> None:
    assert outbound_tracing(settings(ZIPKIN), "{providers: [{name: zipkin}], disableSpanReporting: true}") is None
    assert outbound_tracing(settings(ZIPKIN), "{providers: [{name: nowhere}]}") is None


def test_client_only_config_leaves_the_server_side_untraced() -> None:
    spec = "{tracing: [{match: {mode: CLIENT}, providers: [{name: sw}], useRequestIdForTraceSampling: false}]}"
    mesh = settings({"name": "sw", "skywalking": {"service": HOST, "port": 9411}})
    resources = generated(mesh, telemetry("ns", "app", spec))
    inbound, outbound = managers(resources, inbound=True), managers(resources, inbound=False)
    assert inbound and outbound
    assert not any(m.HasField("tracing") for m in inbound)
    assert all(m.tracing.provider.name == "envoy.tracers.skywalking" for m in outbound)
    # useRequestIdForTraceSampling reaches the UUID request id extension, as Istio's context does.
    request_id = uuid_pb2.UuidRequestIdConfig()
    outbound[0].request_id_extension.typed_config.Unpack(request_id)
    assert request_id.use_request_id_for_trace_sampling.value is False


def tracing_spec(spec: str) -> str:
    return "{tracing: [" + spec + "]}"


def test_default_providers_trace_without_telemetry() -> None:
    mesh = settings(ZIPKIN, defaultProviders={"tracing": ["zipkin"]})
    found = managers(generated(mesh, ""))
    assert found and all(m.tracing.provider.name == "envoy.tracers.zipkin" for m in found)
    assert {m.tracing.random_sampling.value for m in found} == {1.0}


def test_levels_override_field_by_field() -> None:
    # Root: provider and 50%; the namespace: custom tags; the workload: 10%, keeping the rest.
    mesh = settings(ZIPKIN)
    yaml = (
        telemetry("mesh", "istio-system", tracing_spec("{providers: [{name: zipkin}], randomSamplingPercentage: 50}"))
        + telemetry("ns", "app", tracing_spec("{customTags: {team: {literal: {value: shop}}}}"))
        + telemetry(
            "w", "app", "{selector: {matchLabels: {app: a}}, " + tracing_spec("{randomSamplingPercentage: 10}")[1:]
        )
    )
    selected = managers(generated(mesh, yaml), inbound=False)
    other = managers(generated(mesh, yaml, "sidecar~10.0.0.8~b-1.app~app.svc.cluster.local", {"app": "b"}))
    assert {m.tracing.random_sampling.value for m in selected} == {10.0}
    assert {m.tracing.random_sampling.value for m in other} == {50.0}
    for m in selected + other:
        assert m.tracing.provider.name == "envoy.tracers.zipkin"
        assert literal("team", "shop") in m.tracing.custom_tags


def test_a_gateway_spawns_an_upstream_span() -> None:
    yaml = (
        telemetry("mesh", "istio-system", tracing_spec("{providers: [{name: zipkin}]}"))
        + """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec:
  selector: {istio: ingress}
  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.app.mesh"]}]
---"""
    )
    resources = generated(
        settings(ZIPKIN), yaml, "router~10.0.0.70~gw-1.app~app.svc.cluster.local", {"istio": "ingress"}
    )
    found = managers(resources)
    assert found and all(m.tracing.spawn_upstream_span.value for m in found)


SCOPED = """
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec:
  egress: [{hosts: ["./*"]}]
---"""


def test_the_collector_cluster_is_sent_even_where_the_sidecar_does_not_import_it() -> None:
    mesh = settings(ZIPKIN)
    untraced = generated(mesh, SCOPED)
    assert CLUSTER not in {c.name for c in untraced[types.CLUSTER]}  # the Sidecar scopes it out
    traced = generated(mesh, SCOPED + telemetry("ns", "app", tracing_spec("{providers: [{name: zipkin}]}")))
    clusters = {c.name: c for c in traced[types.CLUSTER]}
    assert CLUSTER in clusters
    # Its endpoints are sent with it (EDS), and only the collector port's cluster is added.
    assignments = {a.cluster_name: a for a in traced[types.ENDPOINT]}
    assert assignments[CLUSTER].endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address == "10.0.0.50"
    assert OTEL_GRPC_CLUSTER not in clusters


def test_a_collector_the_registry_lacks_is_not_traced_and_is_named() -> None:
    mesh = settings({"name": "zipkin", "zipkin": {"service": "obs/zipkin.obs.mesh", "port": 9411}})
    assert outbound_tracing(mesh, "{providers: [{name: zipkin}]}") is None
    problems = collector_problems(snapshot_from_yaml(MESH_YAML, mesh=mesh))
    assert [(p.field, "zipkin.obs.mesh" in why) for p, why in problems] == [("extensionProviders[0].zipkin", True)]
    wrong_port = settings({"name": "zipkin", "zipkin": {"service": HOST, "port": 1234}})
    problems = collector_problems(snapshot_from_yaml(MESH_YAML, mesh=wrong_port))
    assert len(problems) == 1 and "port 1234" in problems[0][1]


def test_validate_says_which_collector_service_is_missing(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(
        "extensionProviders:\n- name: zipkin\n  zipkin:\n    service: zipkin.obs.mesh\n    port: 9411\n"
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "all.yaml").write_text(MESH_YAML.strip().removesuffix("---"))
    result = runner.invoke(app, ["validate", str(tree), "--mesh-config", str(tmp_path / "mesh.yaml")])
    assert result.exit_code == 1, result.output
    assert "mesh.yaml:4" in result.output and "extensionProviders[0].zipkin.service" in result.output
    assert "zipkin.obs.mesh" in result.output
    known = runner.invoke(
        app, ["validate", str(tree), "--mesh-config", str(tmp_path / "mesh.yaml"), "--known-host", "*.obs.mesh"]
    )
    assert known.exit_code == 0, known.output


def test_a_telemetry_change_rekeys_only_the_proxies_whose_tracing_it_changes() -> None:
    mesh = settings(ZIPKIN)
    base = snapshot_from_yaml(MESH_YAML, mesh=mesh)
    spec = "{selector: {matchLabels: {app: a}}, tracing: [{providers: [{name: zipkin}]}]}"
    changed = snapshot_from_yaml(MESH_YAML + telemetry("w", "app", spec), mesh=mesh)
    a, b = NODE, "sidecar~10.0.0.8~b-1.app~app.svc.cluster.local"
    meta_b = {"LABELS": {"app": "b"}}
    assert proxy_for(base, a).generation_key() != proxy_for(changed, a).generation_key()
    assert proxy_for(base, a).outbound != proxy_for(changed, a).outbound
    assert proxy_for(base, b, meta_b).generation_key() == proxy_for(changed, b, meta_b).generation_key()
    assert proxy_for(base, b, meta_b).outbound == proxy_for(changed, b, meta_b).outbound


def test_serve_warns_of_a_collector_the_registry_lacks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "all.yaml").write_text(MESH_YAML.strip().removesuffix("---"))
    mesh = settings({"name": "zipkin", "zipkin": {"service": "zipkin.obs.mesh", "port": 9411}})

    async def body() -> None:
        async with serving(tmp_path, mesh=mesh):
            pass

    with caplog.at_level(logging.WARNING, logger="meshctl.server.discovery"):
        run(body)
    warned = [r.getMessage() for r in caplog.records if "extensionProviders[0].zipkin.service" in r.getMessage()]
    assert len(warned) == 1 and "'zipkin.obs.mesh' is not in the registry" in warned[0], caplog.text
