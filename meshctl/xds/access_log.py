"""Access logs as MeshConfig asks for them (`accessLogFile`, `accessLogEncoding`,
`accessLogFormat`), in Istio's default format, on every HTTP connection manager and TCP proxy.

Istio writes its access log through its Telemetry API or these MeshConfig fields; a VM has no
Telemetry resources here, so the MeshConfig fields are the switch. With no `accessLogFile` there
is no access log, as in Istio. The default formats carry the fields of Istio's
(`pilot/pkg/model/telemetry_logging.go`), so log parsers written for Istio read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import substitution_format_string_pb2 as fmt_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2, struct_pb2

from meshctl.config.mesh import MeshSettings

FILE_LOGGER: Final = "envoy.access_loggers.file"

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
    fmt = fmt_pb2.SubstitutionFormatString()
    if mesh.access_log_encoding == "JSON":
        fields = struct_pb2.Struct()
        fields.update(JSON_FIELDS)
        fmt.json_format.CopyFrom(fields)
    else:
        text = mesh.access_log_format or TEXT_FORMAT
        fmt.text_format_source.inline_string = text if text.endswith("\n") else text + "\n"
    logger = file_pb2.FileAccessLog(path=mesh.access_log_file, log_format=fmt)
    packed = any_pb2.Any()
    # Deterministic: the JSON format is a Struct (a protobuf map), which Pack otherwise writes in an
    # order that differs between processes, and replicas must send the same bytes and versions.
    packed.Pack(logger, deterministic=True)
    return accesslog_pb2.AccessLog(name=FILE_LOGGER, typed_config=packed)


def with_access_log(listeners: Iterable[listener_pb2.Listener], mesh: MeshSettings) -> list[listener_pb2.Listener]:
    """`listeners` with the mesh's access log on every HTTP connection manager and TCP proxy
    (unchanged when there is none)."""
    out = list(listeners)
    log = access_log(mesh)
    if log is None:
        return out
    for listener in out:
        chains = list(listener.filter_chains)
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)
        for chain in chains:
            for network_filter in chain.filters:
                for cls in (hcm_pb2.HttpConnectionManager, tcp_proxy_pb2.TcpProxy):
                    if network_filter.typed_config.Is(cls.DESCRIPTOR):
                        config = cls()
                        network_filter.typed_config.Unpack(config)
                        config.access_log.append(log)
                        network_filter.typed_config.Pack(config, deterministic=True)  # as `access_log`
    return out
