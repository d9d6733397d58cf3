"""The collector services MeshConfig's tracers and access log services send to, looked up in
the snapshot's registry as Istio's `LookupCluster` does: `service` is a hostname the registry
has in one namespace, or `namespace/hostname`; the cluster is `outbound|PORT||HOSTNAME`.

A provider whose service cannot be found is not served (Istio logs it and leaves the tracer or
log out); `collector_problems` says why, for `validate` (an error) and `serve` (a warning), on
the provider's MeshConfig field. Where Istio leaves the collector's cluster to the proxy's
Sidecar scope (a Sidecar that does not import the collector makes Envoy refuse the listeners
naming it: "unknown cluster"), meshctl adds it to every proxy whose tracing or logs name it
(`OutboundProxy.collectors`, `xds/clusters.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.config.mesh_collectors import CollectorProvider
from meshctl.snapshot.model import Snapshot


@dataclass(frozen=True, slots=True)
class Collector:
    """A provider resolved against the registry: the service's hostname, namespace and port,
    and the cluster Envoy sends to."""

    provider: CollectorProvider
    hostname: str
    namespace: str

    @property
    def port(self) -> int:
        return self.provider.port

    @property
    def cluster(self) -> str:
        return f"outbound|{self.provider.port}||{self.hostname}"


def _lookup(snapshot: Snapshot, provider: CollectorProvider) -> tuple[Collector | None, str]:
    namespace, _, hostname = provider.service.rpartition("/")
    service = snapshot.services.services.get(hostname)
    if service is None or (namespace and service.namespace != namespace):
        where = f" in namespace {namespace}" if namespace else ""
        return None, f"service {hostname!r}{where} is not in the registry (a ServiceEntry or Consul service)"
    if service.port(provider.port) is None:
        ports = ", ".join(str(p.number) for p in service.ports) or "none"
        return None, f"port {provider.port} is not a port of service {hostname!r} (its ports: {ports})"
    return Collector(provider, hostname, service.namespace), ""


def resolve_collector(snapshot: Snapshot, provider: CollectorProvider) -> Collector | None:
    """The provider's collector in `snapshot`, or None when the registry does not have it."""
    return _lookup(snapshot, provider)[0]


def collector_problems(snapshot: Snapshot) -> list[tuple[CollectorProvider, str]]:
    """Each collector provider of the mesh whose service is not served, and why; the finding
    belongs on `provider.field + ".service"` of the MeshConfig."""
    out = []
    for provider in snapshot.mesh.providers.collectors:
        found, why = _lookup(snapshot, provider)
        if found is None:
            out.append((provider, f"provider {provider.name!r}: {why}; its {provider.kind} is not served"))
    return out
