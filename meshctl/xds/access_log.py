"""Access logs on every HTTP connection manager and TCP proxy: those Telemetry turns on for
the side of the proxy a listener is (`snapshot/telemetry.py`), else MeshConfig's
(`accessLogFile`, `accessLogEncoding`, `accessLogFormat`), in Istio's default format unless the
provider says.

With no Telemetry and no `accessLogFile` there is no access log, as in Istio. The gRPC access log
services (`envoyHttpAls`, `envoyTcpAls`, `envoyOtelAls`) send to their collector's cluster
(`snapshot/collectors.py`) as Istio's `telemetry_logging.go` builds them; Istio's default filter
state objects (its peer metadata, which upstream Envoy does not make) are left out. A Telemetry
`filter.expression` becomes Envoy's CEL access log filter, as Istio maps it. The default formats
carry the fields of Istio's (`pilot/pkg/model/telemetry_logging.go`), so log parsers written for Istio read them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2
from envoy.config.core.v3 import substitution_format_string_pb2 as fmt_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.access_loggers.open_telemetry.v3 import logs_service_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2, struct_pb2
from google.protobuf.message import Message
from opentelemetry.proto.common.v1 import common_pb2

from meshctl.config.mesh import MeshSettings
from meshctl.config.mesh_providers import ENVOY_PROVIDER, FileLogProvider
from meshctl.snapshot.collectors import Collector
from meshctl.snapshot.telemetry import LogEntry, LogPlan
from meshctl.xds.listener_walk import rewrite_filters

FILE_LOGGER: Final = "envoy.access_loggers.file"
HTTP_GRPC_LOGGER: Final = "envoy.access_loggers.http_grpc"
TCP_GRPC_LOGGER: Final = "envoy.access_loggers.tcp_grpc"
OTEL_LOGGER: Final = "envoy.access_loggers.open_telemetry"
#: Istio's log names when the provider gives none.
_LOG_NAMES: Final = {
    "envoyHttpAls": "http_envoy_accesslog",
    "envoyTcpAls": "tcp_envoy_accesslog",
    "envoyOtelAls": "otel_envoy_accesslog",
}
#: The name Istio gives the CEL filter of a Telemetry `filter.expression`.
CEL_FILTER: Final = "envoy.access_loggers.extension_filters.cel"

#: Istio's default text format.
TEXT_FORMAT: Final = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    "%RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% '
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
)

#: Istio's default JSON fields.
JSON_FIELDS: Final = {
    "start_time": "%START_TIME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration": "%DURATION%",
    "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%",
    "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "authority": "%REQ(:AUTHORITY)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%",
    "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "route_name": "%ROUTE_NAME%",
}


def access_log(mesh: MeshSettings) -> accesslog_pb2.AccessLog | None:
    """The file access log the mesh asks for, or None (Istio's buildFileAccessLogHelper)."""
    if not mesh.access_log_file:
        return None
    return _file_log(mesh.access_log_file, mesh.access_log_encoding == "JSON", mesh.access_log_format, JSON_FIELDS)


def provider_log(mesh: MeshSettings, entry: LogEntry) -> accesslog_pb2.AccessLog | None:
    """The access log of one Telemetry entry (None for a provider meshctl does not write): a
    declared `envoyFileAccessLog` provider, or the built-in `envoy` one, which writes where
    `accessLogFile` says (standard output when it says nothing) in MeshConfig's format."""
    provider: FileLogProvider | None = mesh.providers.file_log(entry.provider)
    if entry.collector is not None:
        log = _service_log(entry.collector)
    elif provider is not None:
        labels = json.loads(provider.labels) if provider.labels else {}
        log = _file_log(provider.path, bool(provider.labels), provider.text, labels or JSON_FIELDS)
    elif entry.provider == ENVOY_PROVIDER:
        path = mesh.access_log_file or "/dev/stdout"
        log = _file_log(path, mesh.access_log_encoding == "JSON", mesh.access_log_format, JSON_FIELDS)
    else:
        return None
    if entry.filter:
        cel = any_pb2.Any()
        cel.Pack(cel_pb2.ExpressionFilter(expression=entry.filter))
        log.filter.extension_filter.name = CEL_FILTER
        log.filter.extension_filter.typed_config.CopyFrom(cel)
    return log


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _service_log(collector: Collector) -> accesslog_pb2.AccessLog:
    """A gRPC access log service's log (Istio's httpGrpc/tcpGrpc/openTelemetry access logs)."""
    kind = collector.provider.kind
    options = collector.provider.settings()
    common = als_pb2.CommonGrpcAccessLogConfig(
        log_name=str(options.get("logName") or _LOG_NAMES[kind]),
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
                cluster_name=collector.cluster, authority=collector.hostname
            )
        ),
        transport_api_version=config_source_pb2.ApiVersion.V3,
        filter_state_objects_to_log=_strings(options.get("filterStateObjectsToLog")),
    )
    config: Message
    if kind == "envoyHttpAls":
        name = HTTP_GRPC_LOGGER
        config = als_pb2.HttpGrpcAccessLogConfig(
            common_config=common,
            additional_request_headers_to_log=_strings(options.get("additionalRequestHeadersToLog")),
            additional_response_headers_to_log=_strings(options.get("additionalResponseHeadersToLog")),
            additional_response_trailers_to_log=_strings(options.get("additionalResponseTrailersToLog")),
        )
    elif kind == "envoyTcpAls":
        name, config = TCP_GRPC_LOGGER, als_pb2.TcpGrpcAccessLogConfig(common_config=common)
    else:
        name = OTEL_LOGGER
        fmt = options.get("logFormat") or {}
        text = fmt.get("text") or TEXT_FORMAT
        otel = logs_service_pb2.OpenTelemetryAccessLogConfig(
            common_config=common,
            disable_builtin_labels=True,
            body=common_pb2.AnyValue(string_value=text),
        )
        labels = fmt.get("labels") or {}
        for key in sorted(labels):
            otel.attributes.values.add(key=key, value=common_pb2.AnyValue(string_value=str(labels[key])))
        config = otel
    packed = any_pb2.Any()
    packed.Pack(config, deterministic=True)
    return accesslog_pb2.AccessLog(name=name, typed_config=packed)


def _file_log(path: str, json_format: bool, text: str, labels: Mapping[str, str]) -> accesslog_pb2.AccessLog:
    fmt = fmt_pb2.SubstitutionFormatString()
    if json_format:
        fields = struct_pb2.Struct()
        fields.update(labels)
        fmt.json_format.CopyFrom(fields)
    else:
        text = text or TEXT_FORMAT
        fmt.text_format_source.inline_string = text if text.endswith("\n") else text + "\n"
    logger = file_pb2.FileAccessLog(path=path, log_format=fmt)
    packed = any_pb2.Any()
    # Deterministic: the JSON format is a Struct (a protobuf map), which Pack otherwise writes in an
    # order that differs between processes, and replicas must send the same bytes and versions.
    packed.Pack(logger, deterministic=True)
    return accesslog_pb2.AccessLog(name=FILE_LOGGER, typed_config=packed)


def access_logs(mesh: MeshSettings, plan: LogPlan) -> list[accesslog_pb2.AccessLog]:
    """The access logs of one side of a proxy: Telemetry's plan, or MeshConfig's log when no
    Telemetry applies (Istio falls back only then: a provider turned off keeps it off)."""
    if not plan:
        log = access_log(mesh)
        return [log] if log is not None else []
    logs = (provider_log(mesh, entry) for entry in plan if not entry.disabled)
    return [log for log in logs if log is not None]


def with_access_log(
    listeners: Iterable[listener_pb2.Listener], mesh: MeshSettings, plan: LogPlan = ()
) -> list[listener_pb2.Listener]:
    """`listeners` with their side's access logs (`plan`, else the mesh's) on every HTTP
    connection manager and TCP proxy (unchanged when there are none)."""
    out = list(listeners)
    logs = access_logs(mesh, plan)
    if not logs:
        return out
    rewrite_filters(out, hcm_pb2.HttpConnectionManager, lambda manager: manager.access_log.extend(logs))
    rewrite_filters(out, tcp_proxy_pb2.TcpProxy, lambda proxy: proxy.access_log.extend(logs))
    return out
