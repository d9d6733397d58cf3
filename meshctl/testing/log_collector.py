"""An access log collector's stand-in for tests: one gRPC server with Envoy's access log service
(`envoy.service.accesslog.v3.AccessLogService`, what `envoyHttpAls`/`envoyTcpAls` send to) and
OpenTelemetry's logs service (`opentelemetry.proto.collector.logs.v1.LogsService/Export`, what
`envoyOtelAls` sends to); a context manager. It keeps what it receives: the log name and the
path of each HTTP entry, the body and attributes of each OpenTelemetry record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2


@dataclass(frozen=True, slots=True)
class HttpEntry:
    log_name: str
    path: str


@dataclass(frozen=True, slots=True)
class OtelRecord:
    log_name: str
    body: str
    attributes: dict[str, str] = field(default_factory=dict)


class LogCollector:
    """What the proxies sent to `host:port` (port 0: a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._http: list[HttpEntry] = []
        self._otel: list[OtelRecord] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def http_entries(self) -> list[HttpEntry]:
        with self._lock:
            return list(self._http)

    @property
    def otel_records(self) -> list[OtelRecord]:
        with self._lock:
            return list(self._otel)

    def wait_for(self, found: Callable[[LogCollector], bool], timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found(self):
                return True
            time.sleep(0.1)
        return found(self)

    def _stream(
        self, requests: Iterator[als_pb2.StreamAccessLogsMessage], _context: Any
    ) -> als_pb2.StreamAccessLogsResponse:
        name = ""
        for message in requests:
            if message.HasField("identifier"):
                name = message.identifier.log_name
            entries = [HttpEntry(name, e.request.path) for e in message.http_logs.log_entry]
            with self._lock:
                self._http.extend(entries)
        return als_pb2.StreamAccessLogsResponse()

    def _export(self, request: logs_service_pb2.ExportLogsServiceRequest, _context: Any) -> Any:
        records = []
        # The OTLP protos xds-protos ships predate the rename of `instrumentation_library_logs`
        # to `scope_logs` (and `logs` to `log_records`); the wire numbers are the same.
        for resource in request.resource_logs:
            for scope in resource.instrumentation_library_logs:
                for record in scope.logs:
                    attributes = {a.key: a.value.string_value for a in record.attributes}
                    records.append(OtelRecord(scope.instrumentation_library.name, record.body.string_value, attributes))
        with self._lock:
            self._otel.extend(records)
        return logs_service_pb2.ExportLogsServiceResponse()

    def __enter__(self) -> LogCollector:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        stream = grpc.stream_unary_rpc_method_handler(
            self._stream,
            request_deserializer=als_pb2.StreamAccessLogsMessage.FromString,
            response_serializer=als_pb2.StreamAccessLogsResponse.SerializeToString,
        )
        export = grpc.unary_unary_rpc_method_handler(
            self._export,
            request_deserializer=logs_service_pb2.ExportLogsServiceRequest.FromString,
            response_serializer=logs_service_pb2.ExportLogsServiceResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "envoy.service.accesslog.v3.AccessLogService", {"StreamAccessLogs": stream}
                ),
                grpc.method_handlers_generic_handler(
                    "opentelemetry.proto.collector.logs.v1.LogsService", {"Export": export}
                ),
            )
        )
        self._port = server.add_insecure_port(f"{self.host}:{self._port}")
        server.start()
        self._server = server
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
