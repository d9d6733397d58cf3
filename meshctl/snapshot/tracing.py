"""Which tracer a proxy's listeners use, with what sampling and tags, as Istio's pilot computes
it (`Telemetries.Tracing` and `configureTracingFromTelemetry`).

The Telemetries that apply are those of access logging (`select_telemetries`: root namespace,
namespace, workload selector; later levels override). Each side (CLIENT: outbound listeners and
a gateway's; SERVER: inbound listeners) starts from MeshConfig `defaultProviders.tracing` (its
first name) and takes, in order, each `tracing` entry whose `match.mode` includes it: its first
provider, and each of `disableSpanReporting`, `customTags` (the whole map, not merged),
`randomSamplingPercentage`, `useRequestIdForTraceSampling` and `enableIstioTags` it sets. A side
without a provider, with span reporting off, or whose provider meshctl cannot serve (a kind
that does not trace, a collector the registry does not have) has no tracing. Sampling not set
by any level is Istio's default, 1%.

The result (`Tracing`) is part of the proxy's keys like its access logs, so a Telemetry change
regenerates only the proxies whose tracing it changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from meshctl.config.model import Config
from meshctl.snapshot.collectors import Collector, resolve_collector
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.telemetry import CLIENT, SERVER, select_telemetries

#: Istio's PILOT_TRACE_SAMPLING default: the sampling of a Telemetry that sets none.
DEFAULT_SAMPLING: Final = 1.0

#: A custom tag: (tag, kind, literal value or variable name, default value), kind one of
#: `literal`, `environment`, `header`.
CustomTag = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class TraceSide:
    """One side's tracing: the collector and what the connection manager's `tracing` says."""

    collector: Collector
    sampling: float
    custom_tags: tuple[CustomTag, ...] = ()
    use_request_id: bool = True
    #: Istio's own tags (canonical service and revision, namespace, mesh and cluster ids) as
    #: literals, empty when `enableIstioTags` is off.
    istio_tags: tuple[tuple[str, str], ...] = ()
    #: The span's service name for the tracers that take one (Istio: the node's cluster,
    #: `CANONICAL_NAME.NAMESPACE`).
    service_cluster: str = ""
    #: A gateway: Istio spawns an upstream span there (PILOT_SPAWN_UPSTREAM_SPAN_FOR_GATEWAY).
    gateway: bool = False


@dataclass(frozen=True, slots=True)
class Tracing:
    """A proxy's tracing, outbound (CLIENT) and inbound (SERVER); None: none."""

    client: TraceSide | None = None
    server: TraceSide | None = None

    @property
    def collectors(self) -> tuple[Collector, ...]:
        return tuple(side.collector for side in (self.client, self.server) if side is not None)


NO_TRACING: Final = Tracing()


@dataclass(slots=True)
class _Spec:
    provider: str = ""
    disabled: bool = False
    sampling: float | None = None
    tags: tuple[CustomTag, ...] = ()
    use_request_id: bool = True
    istio_tags: bool = True


def _tags(custom: Mapping[str, Any]) -> tuple[CustomTag, ...]:
    out = []
    for name, tag in custom.items():
        kind = tag.WhichOneof("type")
        if kind == "literal":
            out.append((name, kind, str(tag.literal.value), ""))
        elif kind in ("environment", "header"):
            value = getattr(tag, kind)
            out.append((name, kind, str(value.name), str(value.default_value)))
    return tuple(sorted(out))


def merge_tracing(levels: Sequence[Any], defaults: Sequence[str], mode: int) -> _Spec:
    """One side's merged tracing spec from the applicable `tracing` entries, lowest level first."""
    side = _Spec(provider=defaults[0] if defaults else "")
    for entry in levels:
        if entry.HasField("match") and entry.match.mode not in (0, mode):
            continue
        if entry.providers:
            side.provider = entry.providers[0].name
        if entry.HasField("disable_span_reporting"):
            side.disabled = entry.disable_span_reporting.value
        if entry.custom_tags:
            side.tags = _tags(entry.custom_tags)
        if entry.HasField("random_sampling_percentage"):
            side.sampling = entry.random_sampling_percentage.value
        if entry.HasField("use_request_id_for_trace_sampling"):
            side.use_request_id = entry.use_request_id_for_trace_sampling.value
        if entry.HasField("enable_istio_tags"):
            side.istio_tags = entry.enable_istio_tags.value
    return side


def canonical_name(labels: Mapping[str, str], workload: str) -> str:
    """The canonical service of a workload, from its labels as Istio's injector derives it."""
    return (
        labels.get("service.istio.io/canonical-name")
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
        or workload
        or "unknown"
    )


def _istio_tags(namespace: str, labels: Mapping[str, str], workload: str) -> tuple[tuple[str, str], ...]:
    revision = (
        labels.get("service.istio.io/canonical-revision")
        or labels.get("app.kubernetes.io/version")
        or labels.get("version")
        or "latest"
    )
    return (
        ("istio.canonical_revision", revision),
        ("istio.canonical_service", canonical_name(labels, workload)),
        ("istio.cluster_id", "unknown"),
        ("istio.mesh_id", "unknown"),
        ("istio.namespace", namespace or "default"),
    )


def _side(
    snapshot: Snapshot,
    merged: _Spec,
    *,
    namespace: str,
    labels: Mapping[str, str],
    workload: str,
    gateway: bool,
) -> TraceSide | None:
    if not merged.provider or merged.disabled:
        return None
    provider = snapshot.mesh.providers.collector(merged.provider)
    if provider is None or not provider.tracing:
        return None
    collector = resolve_collector(snapshot, provider)
    if collector is None:
        return None
    return TraceSide(
        collector=collector,
        sampling=merged.sampling if merged.sampling is not None else DEFAULT_SAMPLING,
        custom_tags=merged.tags,
        use_request_id=merged.use_request_id,
        istio_tags=_istio_tags(namespace, labels, workload) if merged.istio_tags else (),
        service_cluster=f"{canonical_name(labels, workload)}.{namespace}",
        gateway=gateway,
    )


def tracing_of(
    snapshot: Snapshot,
    telemetries: Sequence[Config],
    namespace: str,
    labels: Mapping[str, str],
    workload: str,
    *,
    gateway: bool = False,
) -> Tracing:
    """Both sides' tracing for a proxy the `telemetries` (`select_telemetries`) apply to."""
    levels = [entry for c in telemetries for entry in spec(c).tracing]
    defaults = snapshot.mesh.providers.default_tracing
    if not levels and not defaults:
        return NO_TRACING
    where: dict[str, Any] = {"namespace": namespace, "labels": labels, "workload": workload, "gateway": gateway}
    client = _side(snapshot, merge_tracing(levels, defaults, CLIENT), **where)
    server = _side(snapshot, merge_tracing(levels, defaults, SERVER), **where)
    return Tracing(client, server)


def tracing(
    snapshot: Snapshot, namespace: str, labels: Mapping[str, str], workload: str, *, gateway: bool = False
) -> Tracing:
    """A proxy's tracing (`tracing_of` the Telemetries that select it)."""
    if not snapshot.of_kind("Telemetry") and not snapshot.mesh.providers.default_tracing:
        return NO_TRACING
    telemetries = select_telemetries(snapshot, namespace, labels)
    return tracing_of(snapshot, telemetries, namespace, labels, workload, gateway=gateway)
