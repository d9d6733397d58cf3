"""MeshConfig `extensionProviders` that send to a collector service: the tracers (`zipkin`,
`opentelemetry`, `datadog`, `skywalking`) and the gRPC access log services (`envoyOtelAls`,
`envoyHttpAls`, `envoyTcpAls`).

Each names its collector by `service` (a hostname, or `namespace/hostname` when two namespaces
define it) and `port`, as Istio's `LookupCluster` reads them; the service is looked up in the
registry when a proxy is bound (`snapshot/tracing.py`), not here, since the registry is not an
input of MeshConfig. What each kind says besides is kept as canonical JSON (`options`), read by
the generators (`xds/tracing.py`, `xds/access_log.py`), so a provider is a plain hashable value
that can sit in a proxy's keys.

`lightstep` is known and refused with a warning: Istio no longer configures it (its tracer left
Envoy), so a Telemetry naming it traces nothing, here as there. An OpenTelemetry `sampling`
(Dynatrace's sampler) is refused the same way: it needs Dynatrace's API, and the provider is
served without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from meshctl.config.findings import Severity
from meshctl.config.schema import parse_duration

TRACING_KINDS: Final = frozenset({"zipkin", "opentelemetry", "datadog", "skywalking"})
LOG_SERVICE_KINDS: Final = frozenset({"envoyOtelAls", "envoyHttpAls", "envoyTcpAls"})
#: Istio's tracer kinds it no longer configures: named, never served.
RETIRED_TRACING_KINDS: Final = frozenset({"lightstep"})


@dataclass(frozen=True, slots=True)
class CollectorProvider:
    """A provider that sends to `service`:`port`: its `kind` (the MeshConfig key) and the rest of
    what it says as sorted JSON (`options`). `field` is where it was declared
    (`extensionProviders[2].zipkin`), for findings about its service."""

    name: str
    kind: str
    service: str
    port: int
    options: str = "{}"
    field: str = ""

    @property
    def tracing(self) -> bool:
        return self.kind in TRACING_KINDS

    def settings(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.options)
        return loaded


def read_collector(
    name: str, kind: str, value: Any, where: str, problem: Callable[..., None]
) -> CollectorProvider | None:
    """The provider `value` declares (None after reporting why it cannot be served)."""
    if not isinstance(value, Mapping):
        value = {}
    service = value.get("service")
    if not isinstance(service, str) or not service or service.count("/") > 1:
        problem(f"{where}.service: provider {name!r} needs the collector's service (a hostname, or "
                "namespace/hostname)", Severity.ERROR, f"{where}.service")  # fmt: skip
        return None
    port = value.get("port")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        problem(f"{where}.port: provider {name!r} needs the collector's port (1 to 65535)", Severity.ERROR,
                f"{where}.port")  # fmt: skip
        return None
    options = {k: v for k, v in value.items() if k not in ("service", "port")}
    if kind == "opentelemetry":
        if "http" in options and "grpc" in options:
            problem(f"{where}: provider {name!r} exports over http or grpc, not both", Severity.ERROR, where)
            return None
        if "sampling" in options:
            problem(f"{where}.sampling: the Dynatrace sampler is not served by meshctl (it needs Dynatrace's "
                    "API); spans are sampled by the Telemetry's randomSamplingPercentage",
                    Severity.WARNING, f"{where}.sampling")  # fmt: skip
            options.pop("sampling")
    for timeout_path in (("timeout",), ("http", "timeout"), ("grpc", "timeout")):
        holder: Any = options
        for key in timeout_path[:-1]:
            holder = holder.get(key) if isinstance(holder, Mapping) else None
        timeout = holder.get(timeout_path[-1]) if isinstance(holder, Mapping) else None
        if timeout is not None and (not isinstance(timeout, str) or parse_duration(timeout) is None):
            field = ".".join((where, *timeout_path))
            problem(f"{field} must be a duration (5s, 250ms), not {timeout!r}", Severity.ERROR, field)
            return None
    if kind == "envoyOtelAls":
        fmt = options.get("logFormat") or {}
        if not isinstance(fmt, Mapping) or not isinstance(fmt.get("text", ""), str):
            problem(f"{where}.logFormat must have a text format and labels", Severity.ERROR, f"{where}.logFormat")
            return None
    try:
        text = json.dumps(options, sort_keys=True)
    except (TypeError, ValueError):
        problem(f"{where}: provider {name!r} has values that are not plain data", Severity.ERROR, where)
        return None
    return CollectorProvider(name, kind, service, port, text, where)
