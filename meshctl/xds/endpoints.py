"""EDS: the endpoints of each EDS cluster, as ClusterLoadAssignments (Istio's endpoint builder).

A load assignment depends only on the snapshot and the cluster's name, never on the proxy that
asks: the server serializes it once per snapshot and shares the bytes with every proxy that
subscribes to the same cluster (`build_load_assignment`). Localities are sent with the sum of
their endpoints' weights and priority 0. Where a locality rule is in force (failover once the
cluster has outlier detection, `distribute`, `failoverPriority`, a service's traffic
distribution), a proxy gets a variant rewritten relative to it (`eds_locality`), shared by the
proxies whose locality and labels the rule reads alike; DNS clusters carry the locality
rewrite inline (see `locality`). Network views are not generated.

For `outbound|PORT|SUBSET|HOST`:

- Endpoints of HOST that serve PORT (`Endpoint.ports[PORT]` is the port to connect to; an
  endpoint without it is skipped); addresses must be IPs, or unix sockets (port 0, sent as a
  pipe), as Istio filters them.
- For a subset, only endpoints whose labels include the subset's labels. The subset is looked up
  without the proxy: among every DestinationRule for HOST that defines SUBSET, the one in HOST's
  namespace wins, then the root namespace's, then the others by (namespace, name); selector-free
  rules before selector ones and exact hosts before wildcards. When each subset name has one
  definition (the usual case) this is the subset the proxy's own rule names. A subset no rule
  defines selects every endpoint, as in Istio.
- Grouped by locality (`region/zone/subzone`, groups sorted), each endpoint with its weight
  (1 when unset) and each group with the sum; health is sent as the registry has it (Envoy does
  not balance to UNHEALTHY or DRAINING hosts) rather than dropping unhealthy endpoints as Istio
  does by default, so Envoy's view matches the registry's.
- Metadata as Istio writes it: `envoy.transport_socket_match: {tlsMode: istio}` for endpoints
  whose workload takes mutual TLS, and `istio.workload` (`name;namespace;canonical name;
  canonical revision;cluster`) for telemetry.

DNS clusters (STRICT_DNS, LOGICAL_DNS) carry their endpoints in CDS; `locality_lb_endpoints` is
shared with the cluster generator for that. Inbound and special clusters have no EDS.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from meshctl.config.hosts import is_ip
from meshctl.config.labels import labels_match
from meshctl.registry.model import Endpoint, Health, Resolution, TlsMode
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.locality import locality_proto
from meshctl.xds.memo import Ref
from meshctl.xds.names import Direction, parse_cluster_name

TRANSPORT_SOCKET_MATCH: Final = "envoy.transport_socket_match"
ISTIO_METADATA: Final = "istio"

_HEALTH: Final = {
    Health.HEALTHY: health_check_pb2.HEALTHY,
    Health.UNHEALTHY: health_check_pb2.UNHEALTHY,
    Health.DRAINING: health_check_pb2.DRAINING,
    Health.DEGRADED: health_check_pb2.DEGRADED,
}
_DNS: Final = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})
_MAX_WEIGHT: Final = 4294967295


def build_endpoints(
    scope: ProxyScope, clusters: Sequence[cluster_pb2.Cluster]
) -> list[endpoint_pb2.ClusterLoadAssignment]:
    """One load assignment per EDS cluster in `clusters`, sorted by cluster name. Only the
    snapshot is read: see `build_load_assignment`."""
    names = sorted({c.name for c in clusters if c.type == cluster_pb2.Cluster.EDS})
    return [build_load_assignment(scope.snapshot, name) for name in names]


@dataclass(frozen=True, slots=True)
class AssignmentView:
    """Everything the load assignment of one EDS cluster is made of: the only input of
    `build_assignment` and its cache key (see `meshctl.xds.memo`). A config change that leaves
    every field as it was (most do) leaves the assignment as it was; an endpoint change touches
    the views of its own service alone."""

    cluster_name: str
    #: The service port the cluster is for; None for a name that has no endpoints to give (not
    #: outbound, an unknown host or port, a DNS service whose endpoints are in the cluster).
    port: int | None = None
    #: The service's endpoints, named by their digest.
    endpoints: Ref[tuple[Endpoint, ...]] | None = None
    #: The subset's labels, as sorted pairs; None for the whole service.
    subset_labels: tuple[tuple[str, str], ...] | None = None


def assignment_view(snapshot: Snapshot, cluster_name: str) -> AssignmentView:
    """What `build_assignment` reads of the snapshot for `cluster_name`."""
    parsed = parse_cluster_name(cluster_name)
    if parsed is None or parsed.direction is not Direction.OUTBOUND:
        return AssignmentView(cluster_name)
    service = snapshot.services.services.get(parsed.host)
    if service is None or service.port(parsed.port) is None or service.resolution in _DNS:
        return AssignmentView(cluster_name)
    labels = subset_labels(snapshot, parsed.host, parsed.subset) if parsed.subset else None
    model = snapshot.services
    return AssignmentView(
        cluster_name,
        parsed.port,
        Ref(model.endpoints_digest(parsed.host), model.endpoints_of(parsed.host)),
        tuple(sorted(labels.items())) if labels is not None else None,
    )


def build_assignment(view: AssignmentView) -> endpoint_pb2.ClusterLoadAssignment:
    """The load assignment a view describes; empty for a name without endpoints to give."""
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=view.cluster_name)
    if view.port is None:
        return assignment
    assignment.endpoints.extend(locality_lb_endpoints(assigned_endpoints(view), view.port))
    return assignment


def assigned_endpoints(view: AssignmentView) -> list[Endpoint]:
    """The endpoints the assignment of `view` is made of, before grouping by locality."""
    if view.port is None or view.endpoints is None:
        return []
    labels = dict(view.subset_labels) if view.subset_labels is not None else None
    return [e for e in select_endpoints(view.endpoints.value, view.port, labels) if _eds_address(e)]


def build_load_assignment(snapshot: Snapshot, cluster_name: str) -> endpoint_pb2.ClusterLoadAssignment:
    """The load assignment of `cluster_name`, a pure function of the snapshot and the name, so
    its serialized bytes can be shared by every proxy. Unknown names get an empty assignment."""
    return build_assignment(assignment_view(snapshot, cluster_name))


def select_endpoints(endpoints: Iterable[Endpoint], port: int, labels: Mapping[str, str] | None) -> list[Endpoint]:
    """Endpoints serving `port` whose labels include `labels` (all of them when None)."""
    return [e for e in endpoints if port in e.ports and (not labels or labels_match(labels, e.labels))]


def _eds_address(endpoint: Endpoint) -> bool:
    """EDS endpoints must be IPs (hostnames are for DNS clusters), or unix sockets (port 0)."""
    if not endpoint.address:
        return False
    return is_ip(endpoint.address) or all(p == 0 for p in endpoint.ports.values())


def subset_labels(snapshot: Snapshot, hostname: str, subset: str) -> Mapping[str, str] | None:
    """The labels of `subset` of `hostname`, found without a proxy (precedence in the module
    docstring); None when no DestinationRule defines it."""
    service = snapshot.services.services.get(hostname)
    home = service.namespace if service is not None else ""
    root = snapshot.mesh.root_namespace
    index = snapshot.index
    best: tuple[tuple[object, ...], Mapping[str, str]] | None = None
    namespaces = sorted(index.namespaces_with_rules())
    for config, match in (pair for ns in namespaces for pair in index.destination_rules(ns, hostname)):
        rule = spec(config)
        found = next((s for s in rule.subsets if s.name == subset), None)
        if found is None:
            continue
        tier = 0 if config.namespace == home else 1 if config.namespace == root else 2
        selected = bool(rule.HasField("workload_selector") and rule.workload_selector.match_labels)
        rank = (tier, selected, match != hostname, -len(match), config.namespace, config.name)
        if best is None or rank < best[0]:
            best = (rank, dict(found.labels))
    return best[1] if best is not None else None


def locality_lb_endpoints(
    endpoints: Iterable[Endpoint], port: int
) -> list[endpoint_components_pb2.LocalityLbEndpoints]:
    """`endpoints` (already selected) grouped by locality, in locality order, for service
    `port`; each group's weight is the sum of its endpoints' weights."""
    out = []
    for locality, members in locality_groups(endpoints):
        group = endpoint_components_pb2.LocalityLbEndpoints()
        if locality:
            group.locality.CopyFrom(locality_proto(locality))
        group.lb_endpoints.extend(lb_endpoint(e, e.ports[port]) for e in members)
        group.load_balancing_weight.value = min(
            sum(e.load_balancing_weight.value for e in group.lb_endpoints), _MAX_WEIGHT
        )
        out.append(group)
    return out


def locality_groups(endpoints: Iterable[Endpoint]) -> list[tuple[str, list[Endpoint]]]:
    """`endpoints` by locality, in the order `locality_lb_endpoints` sends them: what a
    per-proxy variant (`eds_locality`) reads to find each sent endpoint's labels."""
    groups: dict[str, list[Endpoint]] = defaultdict(list)
    for endpoint in endpoints:
        groups[endpoint.locality].append(endpoint)
    return [(locality, groups[locality]) for locality in sorted(groups)]


def lb_endpoint(endpoint: Endpoint, port: int) -> endpoint_components_pb2.LbEndpoint:
    """One endpoint at `port` (0: a unix socket at `endpoint.address`)."""
    out = endpoint_components_pb2.LbEndpoint()
    out.endpoint.address.CopyFrom(socket_address(endpoint.address, port))
    out.health_status = _HEALTH[endpoint.health]
    out.load_balancing_weight.value = endpoint.weight or 1
    if endpoint.tls_mode is TlsMode.ISTIO:
        out.metadata.filter_metadata[TRANSPORT_SOCKET_MATCH].update({"tlsMode": TlsMode.ISTIO.value})
    if endpoint.name:
        out.metadata.filter_metadata[ISTIO_METADATA].update({"workload": workload_label(endpoint)})
    return out


def socket_address(address: str, port: int) -> address_pb2.Address:
    """An IP or hostname and port, or a pipe when `port` is 0 (`unix://` already stripped)."""
    out = address_pb2.Address()
    if port == 0:
        out.pipe.path = address.removeprefix("unix://")
    else:
        out.socket_address.address = address
        out.socket_address.port_value = port
    return out


def workload_label(endpoint: Endpoint) -> str:
    """Istio's compressed telemetry label: `workload;namespace;canonical name;canonical
    revision;cluster`, the canonical service taken from the labels as Istio does (no cluster id
    outside Kubernetes, and Istio leaves the `latest` revision out)."""
    labels = endpoint.labels
    name = (
        labels.get("service.istio.io/canonical-name")
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
        or endpoint.name
    )
    revision = (
        labels.get("service.istio.io/canonical-revision")
        or labels.get("app.kubernetes.io/version")
        or labels.get("version")
        or ""
    )
    if revision == "latest":
        revision = ""
    return f"{endpoint.name};{endpoint.namespace};{name};{revision};"
