"""Which Telemetry resources apply to a proxy, and the access logs they add up to, as Istio
computes them (pilot's `Telemetries.AccessLogging`).

Hierarchy: the first Telemetry of the root namespace (MeshConfig `rootNamespace`) without a
selector applies to the whole mesh, then the first of the proxy's namespace without one, then
every Telemetry of that namespace whose selector matches the proxy's labels; later ones override
earlier ones. "First" is Istio's creation order: oldest `metadata.creationTimestamp` first, those
without one after, by name, so every replica picks alike. A Telemetry with `targetRefs` selects
no proxy (it names Kubernetes Gateways and Services).

Access logs are resolved per provider and per side: a proxy's outbound listeners (and a
gateway's) are the CLIENT side, its inbound listeners the SERVER side (`match.mode`). The
providers in scope are those the last level naming any for that side names (MeshConfig's
`defaultProviders.accessLogging` before any); each is then on, off (`disabled: true`) or filtered
(`filter.expression`, the last one given for it) as the levels say in order. The result is a
`LogPlan` and is part of the proxy's keys (`OutboundProxy.client_logs`, `Proxy.access_logs`), so a
Telemetry change regenerates only the proxies whose plan it changes. An empty plan means "no
Telemetry says anything here": MeshConfig's own `accessLogFile` applies, as in Istio. A gRPC
access log service's entry carries its collector, looked up in the registry
(`snapshot/collectors.py`); one whose collector is not there is left out, as Istio leaves it.
Tracing is resolved from the same Telemetries in `snapshot/tracing.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from meshctl.api.telemetry.v1alpha1 import telemetry_pb2
from meshctl.config.labels import labels_match
from meshctl.config.mesh_providers import ENVOY_PROVIDER
from meshctl.config.model import Config
from meshctl.snapshot.collectors import Collector, resolve_collector
from meshctl.snapshot.model import MeshSettings, Snapshot, spec

KIND: Final = "Telemetry"
CLIENT: Final = telemetry_pb2.CLIENT
SERVER: Final = telemetry_pb2.SERVER


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One provider's access log on one side: its CEL filter ("" for none), or turned off (an
    entry that writes nothing, but keeps MeshConfig's own log from applying). A gRPC access log
    service's entry carries its collector, resolved in the registry."""

    provider: str
    filter: str = ""
    disabled: bool = False
    collector: Collector | None = None


#: A proxy side's access logs by provider name; () when no Telemetry applies.
LogPlan = tuple[LogEntry, ...]


@dataclass(frozen=True, slots=True)
class AccessLogs:
    """A proxy's access logs, outbound (CLIENT) and inbound (SERVER)."""

    client: LogPlan = ()
    server: LogPlan = ()


#: A proxy no Telemetry selects (and the mesh has no default providers).
NO_ACCESS_LOGS: Final = AccessLogs()


def _order(config: Config) -> tuple[float, str]:
    return (config.created if config.created is not None else math.inf, config.name)


def _has_target_refs(telemetry: Any) -> bool:
    return bool(telemetry.target_refs) or telemetry.HasField("target_ref")


def _of_namespace(snapshot: Snapshot, namespace: str) -> tuple[Config, ...]:
    return snapshot.index.scoped(
        "telemetries",
        (namespace, snapshot.kind_digests.get(KIND, b"")),
        lambda: tuple(sorted((c for c in snapshot.of_kind(KIND) if c.namespace == namespace), key=_order)),
    )


def _namespace_wide(snapshot: Snapshot, namespace: str) -> Config | None:
    for config in _of_namespace(snapshot, namespace):
        telemetry: Any = spec(config)
        if not telemetry.selector.match_labels and not _has_target_refs(telemetry):
            return config
    return None


def select_telemetries(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> tuple[Config, ...]:
    """The Telemetries that apply to a proxy of `namespace` with `labels`, lowest level first."""
    if not snapshot.of_kind(KIND):
        return ()
    root = snapshot.mesh.root_namespace
    found: list[Config] = []
    for ns in (root,) if namespace == root else (root, namespace):
        wide = _namespace_wide(snapshot, ns)
        if wide is not None:
            found.append(wide)
    for config in _of_namespace(snapshot, namespace):
        telemetry: Any = spec(config)
        selector = dict(telemetry.selector.match_labels)
        if selector and not _has_target_refs(telemetry) and labels_match(selector, labels):
            found.append(config)
    return tuple(found)


def _for_mode(selector: Any, has_match: bool, mode: int) -> bool:
    return not has_match or selector.mode in (telemetry_pb2.CLIENT_AND_SERVER, mode)


def merge_logs(levels: Sequence[Sequence[Any]], defaults: Sequence[str], mode: int) -> dict[str, LogEntry]:
    """The access log providers of one side, from the `accessLogging` lists of the applicable
    Telemetries (lowest level first) and the mesh's default providers (Istio's `mergeLogs`)."""
    if not levels:
        return {name: LogEntry(name) for name in defaults}
    in_scope: set[str] = set(defaults)
    filters: dict[str, str] = {}
    for level in levels:
        named: set[str] = set()
        for logging in level:
            if not _for_mode(logging.match, logging.HasField("match"), mode):
                continue
            names = [p.name for p in logging.providers]
            named.update(names)
            for name in names:
                filters[name] = logging.filter.expression if logging.HasField("filter") else ""
        if named:
            in_scope = named
    out: dict[str, LogEntry] = {}
    parent: Sequence[str] = defaults
    for level in levels:
        for logging in level:
            names = [p.name for p in logging.providers] or list(parent)
            parent = names
            for name in names:
                if name not in in_scope or not _for_mode(logging.match, logging.HasField("match"), mode):
                    continue
                if logging.disabled.value:
                    out[name] = LogEntry(name, disabled=True)
                else:
                    out[name] = LogEntry(name, filters.get(name, ""))
    return out


def _known(mesh: MeshSettings, name: str) -> bool:
    """Whether a provider is one meshctl writes access logs with (a file log, or `envoy`)."""
    return name == ENVOY_PROVIDER or mesh.providers.file_log(name) is not None


def _resolved(snapshot: Snapshot, entry: LogEntry) -> LogEntry | None:
    """`entry` as meshctl serves it: a file log as is, a log service with its collector (None
    when the provider is neither, or its collector is not in the registry)."""
    if _known(snapshot.mesh, entry.provider):
        return entry
    provider = snapshot.mesh.providers.collector(entry.provider)
    if provider is None or provider.tracing:
        return None
    collector = resolve_collector(snapshot, provider)
    if collector is None:
        return None
    return LogEntry(entry.provider, entry.filter, entry.disabled, collector)


def log_plan(snapshot: Snapshot, telemetries: Sequence[Config], mode: int) -> LogPlan:
    """The access logs of one side of a proxy with `telemetries` (`select_telemetries`)."""
    levels = [spec(c).access_logging for c in telemetries if spec(c).access_logging]
    defaults = snapshot.mesh.providers.default_access_logging
    if not levels and not defaults:
        return ()
    merged = merge_logs(levels, defaults, mode)
    resolved = (_resolved(snapshot, merged[name]) for name in sorted(merged))
    return tuple(entry for entry in resolved if entry is not None)


def access_logs(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> AccessLogs:
    """Both sides' access logs for a proxy of `namespace` with `labels`."""
    if not snapshot.of_kind(KIND) and not snapshot.mesh.providers.default_access_logging:
        return NO_ACCESS_LOGS
    telemetries = select_telemetries(snapshot, namespace, labels)
    return AccessLogs(log_plan(snapshot, telemetries, CLIENT), log_plan(snapshot, telemetries, SERVER))
