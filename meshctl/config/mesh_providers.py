"""MeshConfig `extensionProviders` and `defaultProviders`: the providers Telemetry names.

Telemetry refers to providers by name; MeshConfig says what each one is. meshctl serves the
file access log providers (`envoyFileAccessLog`: a path and a text format or JSON labels), the
providers that send to a collector service (tracers and gRPC access log services:
`config/mesh_collectors.py`), and knows the names of the others, so a Telemetry naming one is
not a typo, with a warning that their kind is not applied. The provider `envoy` exists without being declared, as in
Istio's default MeshConfig; here it is the file MeshConfig's `accessLogFile` names (standard
output when none), in its `accessLogEncoding`/`accessLogFormat`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from meshctl.config.findings import Severity
from meshctl.config.mesh_collectors import (
    LOG_SERVICE_KINDS,
    RETIRED_TRACING_KINDS,
    TRACING_KINDS,
    CollectorProvider,
    read_collector,
)
from meshctl.config.validation.access_log_format import access_log_format_problem

#: The provider every mesh has (Istio's default MeshConfig declares it).
ENVOY_PROVIDER: Final = "envoy"
#: Provider kinds Istio has that meshctl names but does not apply yet.
_OTHER_KINDS: Final = frozenset(
    {
        "envoyExtAuthzHttp",
        "envoyExtAuthzGrpc",
        "stackdriver",
        "opencensus",
        "prometheus",
        "sds",
    }
)


@dataclass(frozen=True, slots=True)
class FileLogProvider:
    """An `envoyFileAccessLog` provider: where to write and in what format. `labels` is the JSON
    text of the labels mapping (sorted) for a JSON log, "" for a text log; `text` the text format
    ("" for Istio's default)."""

    name: str
    path: str
    text: str = ""
    labels: str = ""


@dataclass(frozen=True, slots=True)
class Providers:
    """The mesh's extension providers as Telemetry resolves them."""

    file_logs: tuple[FileLogProvider, ...] = ()
    #: Names of providers of other kinds (declared, not served).
    others: frozenset[str] = frozenset()
    #: `defaultProviders.accessLogging`: the providers on when no Telemetry names any.
    default_access_logging: tuple[str, ...] = ()
    #: Tracers and gRPC access log services, by name.
    collectors: tuple[CollectorProvider, ...] = ()
    #: `defaultProviders.tracing`: the tracer on when no Telemetry names one (Istio: the first).
    default_tracing: tuple[str, ...] = ()

    def file_log(self, name: str) -> FileLogProvider | None:
        return next((p for p in self.file_logs if p.name == name), None)

    def collector(self, name: str) -> CollectorProvider | None:
        return next((p for p in self.collectors if p.name == name), None)


#: A mesh without extension providers (the `envoy` one aside).
NO_PROVIDERS: Final = Providers()


def read_providers(data: Mapping[str, Any], problem: Callable[..., None]) -> Providers:
    """The `extensionProviders` and `defaultProviders` of a MeshConfig mapping; each problem is
    reported through `problem(message, severity, field)` as `mesh_settings` does."""
    declared = data.get("extensionProviders") or []
    files: list[FileLogProvider] = []
    collectors: list[CollectorProvider] = []
    others: set[str] = set()
    seen: set[str] = set()
    if not isinstance(declared, list):
        problem("extensionProviders must be a list", Severity.ERROR, "extensionProviders")
        declared = []
    for i, entry in enumerate(declared):
        where = f"extensionProviders[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            problem(f"{where} must be a mapping with a name", Severity.ERROR, where)
            continue
        name = entry["name"]
        if name in seen:
            problem(f"{where}: provider {name!r} is declared twice", Severity.ERROR, f"{where}.name")
            continue
        seen.add(name)
        kinds = [k for k in entry if k != "name"]
        if len(kinds) != 1:
            problem(f"{where}: provider {name!r} must have exactly one kind", Severity.ERROR, where)
            continue
        kind = kinds[0]
        if kind == "envoyFileAccessLog":
            provider = _file_log(name, entry[kind], f"{where}.{kind}", problem)
            if provider is not None:
                files.append(provider)
        elif kind in TRACING_KINDS or kind in LOG_SERVICE_KINDS:
            collector = read_collector(name, kind, entry[kind], f"{where}.{kind}", problem)
            if collector is not None:
                collectors.append(collector)
        elif kind in RETIRED_TRACING_KINDS:
            others.add(name)
            problem(f"{where}: {kind} providers are no longer configured by Istio (use opentelemetry): "
                    f"a Telemetry naming {name!r} traces nothing", Severity.WARNING, where)  # fmt: skip
        elif kind in _OTHER_KINDS:
            others.add(name)
            problem(f"{where}: {kind} providers are not applied by meshctl yet ({name!r})", Severity.WARNING, where)
        else:
            problem(f"{where}: {kind} is not a provider kind Istio has", Severity.ERROR, f"{where}.{kind}")
    defaults: tuple[str, ...] = ()
    tracing: tuple[str, ...] = ()
    default_providers = data.get("defaultProviders")
    if default_providers is not None:
        if not isinstance(default_providers, Mapping):
            problem("defaultProviders must be a mapping", Severity.ERROR, "defaultProviders")
        else:
            defaults = _names(default_providers, "accessLogging", problem)
            tracing = _names(default_providers, "tracing", problem)
            for key in sorted(k for k in default_providers if k not in ("accessLogging", "tracing")):
                problem(f"defaultProviders.{key} is not applied by meshctl yet", Severity.WARNING,
                        f"defaultProviders.{key}")  # fmt: skip
    return Providers(
        tuple(sorted(files, key=lambda p: p.name)),
        frozenset(others),
        defaults,
        tuple(sorted(collectors, key=lambda p: p.name)),
        tracing,
    )


def _names(default_providers: Mapping[str, Any], key: str, problem: Callable[..., None]) -> tuple[str, ...]:
    names = default_providers.get(key) or []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        problem(f"defaultProviders.{key} must be a list of provider names", Severity.ERROR, f"defaultProviders.{key}")
        return ()
    return tuple(names)


def _file_log(name: str, value: Any, where: str, problem: Callable[..., None]) -> FileLogProvider | None:
    if not isinstance(value, Mapping):
        value = {}
    path = value.get("path", "")
    if not isinstance(path, str) or not path:
        problem(f"{where}.path: provider {name!r} needs a path (/dev/stdout)", Severity.ERROR, f"{where}.path")
        return None
    fmt = value.get("logFormat") or {}
    if not isinstance(fmt, Mapping) or ("text" in fmt and "labels" in fmt):
        problem(f"{where}.logFormat must have text or labels, not both", Severity.ERROR, f"{where}.logFormat")
        return None
    text = fmt.get("text", "")
    if not isinstance(text, str):
        problem(f"{where}.logFormat.text must be a format string", Severity.ERROR, f"{where}.logFormat.text")
        return None
    if text and (bad := access_log_format_problem(text)) is not None:
        problem(bad, Severity.ERROR, f"{where}.logFormat.text")
        return None
    labels = ""
    if "labels" in fmt:
        raw = fmt["labels"] or {}
        if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
            problem(f"{where}.logFormat.labels must map names to format strings", Severity.ERROR,
                    f"{where}.logFormat.labels")  # fmt: skip
            return None
        labels = json.dumps(dict(sorted(raw.items())))
    return FileLogProvider(name, path, text, labels)
