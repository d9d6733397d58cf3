"""Tracing on every HTTP connection manager, as Istio's `configureTracingFromTelemetry` and
`configureFromProviderConfig` (pilot/pkg/networking/core/tracing.go) build it, for the side of
the proxy a listener is (`snapshot/tracing.py`).

The tracer is typed as Istio types it for a current proxy: Zipkin v2 JSON over the
`collector_service` HTTP service (`/api/v2/spans` and a 5 s timeout unless the provider says,
128-bit trace ids unless `enable64bitTraceId`, B3 context unless W3C is asked for); OpenTelemetry
over gRPC, or OTLP/HTTP when the provider has `http`; Datadog and SkyWalking to their clusters.
Sampling is Istio's: client and overall sampling 100%, random sampling the Telemetry's
percentage. Istio's own tags (canonical service and revision, namespace, mesh and cluster ids,
and the RBAC dry-run results) come first unless `enableIstioTags` is off, then the custom ones,
sorted by tag. A gateway and SkyWalking spawn an upstream span, as Istio's default does.

One difference, on purpose: OTLP/HTTP without a `timeout` gets Zipkin's 5 s, since Envoy
requires one and refuses the listener without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from envoy.config.core.v3 import base_pb2, grpc_service_pb2, http_service_pb2, http_uri_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.trace.v3 import datadog_pb2, http_tracer_pb2, opentelemetry_pb2, skywalking_pb2, zipkin_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.extensions.tracers.opentelemetry.resource_detectors.v3 import (
    dynatrace_resource_detector_pb2,
    environment_resource_detector_pb2,
)
from envoy.type.metadata.v3 import metadata_pb2
from envoy.type.tracing.v3 import custom_tag_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2, duration_pb2, message, wrappers_pb2

from meshctl.config.schema import parse_duration
from meshctl.snapshot.tracing import TraceSide
from meshctl.xds.listener_walk import rewrite_filters

ZIPKIN: Final = "envoy.tracers.zipkin"
OPENTELEMETRY: Final = "envoy.tracers.opentelemetry"
DATADOG: Final = "envoy.tracers.datadog"
SKYWALKING: Final = "envoy.tracers.skywalking"
#: Istio's default Zipkin path and timeout.
ZIPKIN_PATH: Final = "/api/v2/spans"
DEFAULT_TIMEOUT_NANOS: Final = 5 * 10**9
_RBAC: Final = "envoy.filters.http.rbac"
#: Istio's RBAC dry-run tags: (tag, the RBAC filter's dynamic metadata key).
_POLICY_TAGS: Final = (
    ("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
    ("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"),
)


def _packed(config: message.Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(config, deterministic=True)
    return out


def _duration(text: Any, default: int | None = None) -> duration_pb2.Duration | None:
    nanos = parse_duration(text) if isinstance(text, str) else None
    if nanos is None:
        nanos = default
    if nanos is None:
        return None
    return duration_pb2.Duration(seconds=nanos // 10**9, nanos=nanos % 10**9)


def _header_value(header: Any) -> str:
    # `envName` reads istiod's environment in Istio; meshctl has none to read, so it is empty.
    return str(header.get("value", "")) if isinstance(header, dict) else ""


def _headers(headers: Any) -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=str(h.get("name", "")), value=_header_value(h)),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for h in headers or ()
        if isinstance(h, dict)
    ]


def _envoy_grpc(cluster: str, authority: str) -> grpc_service_pb2.GrpcService:
    return grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster, authority=authority)
    )


def _zipkin(side: TraceSide, options: dict[str, Any]) -> zipkin_pb2.ZipkinConfig:
    collector = side.collector
    path = options.get("path") or ZIPKIN_PATH
    w3c = options.get("traceContextOption") == "USE_B3_WITH_W3C_PROPAGATION"
    service = http_service_pb2.HttpService(
        http_uri=http_uri_pb2.HttpUri(
            uri=f"http://{collector.hostname}{path}",
            cluster=collector.cluster,
            timeout=_duration(options.get("timeout"), DEFAULT_TIMEOUT_NANOS),
        ),
        request_headers_to_add=_headers(options.get("headers")),
    )
    return zipkin_pb2.ZipkinConfig(
        collector_endpoint_version=zipkin_pb2.ZipkinConfig.HTTP_JSON,
        trace_id_128bit=not options.get("enable64bitTraceId", False),
        shared_span_context=wrappers_pb2.BoolValue(value=False),
        collector_service=service,
        trace_context_option=(
            zipkin_pb2.ZipkinConfig.USE_B3_WITH_W3C_PROPAGATION if w3c else zipkin_pb2.ZipkinConfig.USE_B3
        ),
    )


def _opentelemetry(side: TraceSide, options: dict[str, Any]) -> opentelemetry_pb2.OpenTelemetryConfig:
    collector = side.collector
    config = opentelemetry_pb2.OpenTelemetryConfig(service_name=side.service_cluster)
    http = options.get("http")
    if isinstance(http, dict):
        path = str(http.get("path", "")).lstrip("/")
        config.http_service.CopyFrom(
            http_service_pb2.HttpService(
                http_uri=http_uri_pb2.HttpUri(
                    uri=f"{collector.hostname}/{path}" if path else collector.hostname,
                    cluster=collector.cluster,
                    timeout=_duration(http.get("timeout"), DEFAULT_TIMEOUT_NANOS),
                ),
                request_headers_to_add=_headers(http.get("headers")),
            )
        )
    else:
        found = options.get("grpc")
        grpc: dict[str, Any] = found if isinstance(found, dict) else {}
        service = _envoy_grpc(collector.cluster, collector.hostname)
        timeout = _duration(grpc.get("timeout"))
        if timeout is not None:
            service.timeout.CopyFrom(timeout)
        for h in grpc.get("initialMetadata") or ():
            if isinstance(h, dict):
                service.initial_metadata.add(key=str(h.get("name", "")), value=_header_value(h))
        config.grpc_service.CopyFrom(service)
    detectors = options.get("resourceDetectors")
    if isinstance(detectors, dict):
        if "environment" in detectors:
            config.resource_detectors.add(
                name="envoy.tracers.opentelemetry.resource_detectors.environment",
                typed_config=_packed(environment_resource_detector_pb2.EnvironmentResourceDetectorConfig()),
            )
        if "dynatrace" in detectors:
            config.resource_detectors.add(
                name="envoy.tracers.opentelemetry.resource_detectors.dynatrace",
                typed_config=_packed(dynatrace_resource_detector_pb2.DynatraceResourceDetectorConfig()),
            )
    return config


def _provider(side: TraceSide) -> tuple[str, message.Message, bool]:
    """The tracer's extension name, typed config, and whether it spawns an upstream span."""
    collector = side.collector
    options = collector.provider.settings()
    kind = collector.provider.kind
    if kind == "zipkin":
        return ZIPKIN, _zipkin(side, options), False
    if kind == "datadog":
        config = datadog_pb2.DatadogConfig(
            collector_cluster=collector.cluster,
            service_name=side.service_cluster,
            collector_hostname=collector.hostname,
        )
        return DATADOG, config, False
    if kind == "skywalking":
        return (
            SKYWALKING,
            skywalking_pb2.SkyWalkingConfig(grpc_service=_envoy_grpc(collector.cluster, collector.hostname)),
            True,
        )
    return OPENTELEMETRY, _opentelemetry(side, options), False


def _tags(side: TraceSide) -> list[custom_tag_pb2.CustomTag]:
    tags = []
    if side.istio_tags:
        for tag, value in side.istio_tags:
            tags.append(custom_tag_pb2.CustomTag(tag=tag, literal=custom_tag_pb2.CustomTag.Literal(value=value)))
        for tag, key in _POLICY_TAGS:
            kind = metadata_pb2.MetadataKind(request=metadata_pb2.MetadataKind.Request())
            path = [metadata_pb2.MetadataKey.PathSegment(key=key)]
            meta = custom_tag_pb2.CustomTag.Metadata(
                kind=kind, metadata_key=metadata_pb2.MetadataKey(key=_RBAC, path=path)
            )
            tags.append(custom_tag_pb2.CustomTag(tag=tag, metadata=meta))
    for tag, kind, value, default in side.custom_tags:
        if kind == "literal":
            tags.append(custom_tag_pb2.CustomTag(tag=tag, literal=custom_tag_pb2.CustomTag.Literal(value=value)))
        elif kind == "environment":
            env = custom_tag_pb2.CustomTag.Environment(name=value, default_value=default)
            tags.append(custom_tag_pb2.CustomTag(tag=tag, environment=env))
        else:
            header = custom_tag_pb2.CustomTag.Header(name=value, default_value=default)
            tags.append(custom_tag_pb2.CustomTag(tag=tag, request_header=header))
    return sorted(tags, key=lambda t: t.tag)


def hcm_tracing(side: TraceSide) -> hcm_pb2.HttpConnectionManager.Tracing:
    """The connection manager's `tracing` for one side (Istio's buildHCMTracing and sampling)."""
    name, config, spawns = _provider(side)
    out = hcm_pb2.HttpConnectionManager.Tracing(
        provider=http_tracer_pb2.Tracing.Http(name=name, typed_config=_packed(config)),
        client_sampling=percent_pb2.Percent(value=100.0),
        random_sampling=percent_pb2.Percent(value=side.sampling),
        overall_sampling=percent_pb2.Percent(value=100.0),
        custom_tags=_tags(side),
    )
    if spawns or side.gateway:
        out.spawn_upstream_span.value = True
    max_tag = side.collector.provider.settings().get("maxTagLength", 0)
    if side.collector.provider.kind != "skywalking" and isinstance(max_tag, int) and max_tag > 0:
        out.max_path_tag_length.value = max_tag
    return out


def with_tracing(listeners: Iterable[listener_pb2.Listener], side: TraceSide | None) -> list[listener_pb2.Listener]:
    """`listeners` with `side`'s tracing on every HTTP connection manager (unchanged without)."""
    out = list(listeners)
    if side is None:
        return out
    tracing = hcm_tracing(side)
    request_id = uuid_pb2.UuidRequestIdConfig(
        use_request_id_for_trace_sampling=wrappers_pb2.BoolValue(value=side.use_request_id)
    )

    def trace(manager: hcm_pb2.HttpConnectionManager) -> None:
        manager.tracing.CopyFrom(tracing)
        manager.request_id_extension.typed_config.Pack(request_id)

    rewrite_filters(out, hcm_pb2.HttpConnectionManager, trace)
    return out
