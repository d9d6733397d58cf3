"""CDS: every cluster one proxy needs, named and defaulted as istiod does (`cluster.go`,
`cluster_builder.go`), so Istio users find the clusters, stats and dashboards they know.

- `outbound|PORT||HOST` for each port of each service the proxy sees (UDP ports have none), and
  `outbound|PORT|SUBSET|HOST` for each subset of the DestinationRule that applies. The type
  follows the service's resolution: STATIC -> EDS (over ADS), DNS -> STRICT_DNS, DNS_ROUND_ROBIN
  -> LOGICAL_DNS (endpoints inline; one endpoint, as Envoy requires; both sent as Envoy's DNS
  cluster extension, see `cluster_dns`), NONE -> ORIGINAL_DST (EDS for a gateway, which has no
  original destination), DYNAMIC_DNS -> Envoy's dynamic forward proxy cluster on HTTP and TLS
  ports of a sidecar (`dynamic_forward`; no subsets: the cluster picks the host a request
  names). A DNS cluster left without endpoints (a subset that selects none) is
  not generated, as in Istio; a DNS service without any endpoint resolves its own hostname.
  Traffic policy: `cluster_policy` and `cluster_tls`.
- `inbound|PORT||` for each port the proxy's workload serves: `clusters_inbound.py`.
- `BlackHoleCluster` always; `PassthroughCluster` for sidecars (gateways have no original
  destination listeners, as in Istio), and `AllowAnyDynamicDNSCluster` under outbound policy
  ALLOW_ANY_DYNAMIC_DNS; `InboundPassthroughCluster` when traffic is intercepted
  (REDIRECT/TPROXY). A router gets outbound clusters only.

Metadata `filter_metadata.istio` is Istio's: `services` ([{host, name, namespace}]; a service
entry's name is its host), `default_original_port`, `config` (the first DestinationRule merged
into the one that applies), `subset`, `external` for MESH_EXTERNAL services, `alpn_override`
when TLS is originated. Clusters come out sorted by name; a name built twice keeps the first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.registry.model import Endpoint, Location, Protocol, Resolution, Service, ServicePort
from meshctl.security.peer_authentication import MtlsMode, namespace_mode
from meshctl.security.request_authentication import jwt_rules_for_workload
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.scope import MergedDestinationRule, ProxyScope
from meshctl.xds import dynamic_forward as dfp
from meshctl.xds import names
from meshctl.xds.cluster_common import (
    delimited_stats,
    istio_metadata,
    merge_clusters,
    passthrough_cluster,
    service_metadata,
)
from meshctl.xds.cluster_dns import is_dns_type, use_dns_extension
from meshctl.xds.cluster_policy import (
    ClusterDraft,
    Policy,
    apply_connection_pool,
    apply_h2_upgrade,
    apply_load_balancer,
    apply_outlier_detection,
    apply_proxy_protocol,
    apply_upstream_protocol,
    duration,
    policy_for_port,
    policy_for_subset,
    traffic_policy,
)
from meshctl.xds.cluster_tls import apply_auto_mtls, apply_istio_mutual, apply_tls, is_istio_mutual, originates_tls
from meshctl.xds.clusters_inbound import build_inbound_clusters
from meshctl.xds.endpoints import locality_lb_endpoints, select_endpoints
from meshctl.xds.inbound_view import inbound_view
from meshctl.xds.jwks_cluster import jwks_clusters
from meshctl.xds.memo import GenerationMemo, Ref
from meshctl.xds.mesh_tls import istio_sni, spiffe_uri
from meshctl.xds.refs import destination_rule_ref

_Cluster = cluster_pb2.Cluster


def build_clusters(scope: ProxyScope) -> list[cluster_pb2.Cluster]:
    """Every cluster for the scope's proxy, sorted by name."""
    return merge_clusters(build_outbound_clusters(scope), build_inbound_clusters(inbound_view(scope)))


@dataclass(frozen=True, slots=True)
class OutboundClusterView:
    """Everything the outbound clusters of one service port are made of (the port's cluster and
    one per subset): the only input of `service_port_clusters`, and its cache key (`memo`).

    Proxies that see a service alike share its clusters, so a change regenerates only the
    clusters whose view changed: a VirtualService edit none, a DestinationRule edit its host's."""

    service: Service
    port: ServicePort
    #: The DestinationRule that applies for this proxy, named by its sources' content.
    rule: Ref[MergedDestinationRule] | None
    #: Istio's `config` metadata path of the rule's first source.
    rule_path: str
    proxy_type: ProxyType
    #: DNS clusters only: the proxy's address family (it picks the DNS lookup family), its
    #: locality (locality priorities of inline endpoints) and the service's endpoints.
    dns_family: str
    dns_locality: str
    dns_endpoints: Ref[tuple[Endpoint, ...]] | None
    connect_timeout: float
    #: MeshConfig's localityLbSetting, serialized.
    mesh_locality: bytes
    #: Whether clients use mutual TLS to the service's endpoints that run a proxy when no rule
    #: sets `tls` (auto mTLS: on in the mesh, the service in it, its namespace not DISABLE).
    auto_mtls: bool = False
    #: The SPIFFE identities of the service's workloads, which a mutual TLS client accepts.
    identities: tuple[str, ...] = ()
    #: The proxy gets the mesh's certificates (`ProxyNode.mesh_certificates`); without them
    #: ISTIO_MUTUAL and auto mTLS stay plaintext.
    mesh_certificates: bool = True
    #: DYNAMIC_DNS services only: MeshConfig's dnsCacheMaxHosts, the bound of the DNS cache.
    dns_cache_max_hosts: int = 0
    #: A gateway that is sent the secrets a rule's client `credentialName` names
    #: (`ProxyNode.credentials`); a sidecar never uses them (Istio: gateways only).
    credentials: bool = False


ClusterMemo = GenerationMemo[OutboundClusterView, tuple[cluster_pb2.Cluster, ...]]


def build_outbound_clusters(
    scope: ProxyScope,
    memo: ClusterMemo | None = None,
    *,
    only: Collection[str] | None = None,
    host_trace: dict[str, tuple[str, ...]] | None = None,
) -> list[cluster_pb2.Cluster]:
    """The clusters of the services the proxy may call, and the catch-alls (BlackHoleCluster,
    PassthroughCluster): what the `OutboundProxy` decides. With `memo`, a service port's
    clusters are made once per `OutboundClusterView` and shared (the messages must then be
    treated as read-only). With `only`, the clusters of those hosts' services alone, and every
    catch-all: what a part kept across a service change needs made again (the server's cluster
    part of a sidecar); with `host_trace`, each service's cluster names are noted by host."""
    out: list[cluster_pb2.Cluster] = []
    for service in scope.services:
        if only is not None and service.hostname not in only:
            continue
        start = len(out)
        for port in service.ports:
            if port.protocol is not Protocol.UDP:
                view = outbound_cluster_view(scope, service, port)
                out.extend(service_port_clusters(view) if memo is None else memo.get(view, service_port_clusters))
        if host_trace is not None:
            host_trace[service.hostname] = tuple(c.name for c in out[start:])
    timeout = scope.snapshot.mesh.connect_timeout_seconds
    if scope.proxy.type is ProxyType.ROUTER:
        # A gateway's own RequestAuthentication keys (sidecars get theirs with the inbound part).
        proxy = scope.proxy
        rules = jwt_rules_for_workload(scope.snapshot, proxy.namespace, proxy.labels)
        out.extend(delimited_stats(jwks_clusters(rules, family=proxy.family, connect_timeout=timeout)))
    out.extend(_collector_clusters(scope, {c.name for c in out}, memo))
    out.append(delimited_stats([_blackhole(timeout)])[0])
    if scope.proxy.type is ProxyType.SIDECAR:
        out.append(delimited_stats([passthrough_cluster(names.PASSTHROUGH_CLUSTER, timeout)])[0])
        if dfp.allow_any_dynamic_dns(scope):
            out.extend(delimited_stats([dfp.allow_any_cluster(scope, timeout)]))
    return merge_clusters(out)


def _collector_clusters(scope: ProxyScope, present: set[str], memo: ClusterMemo | None) -> list[cluster_pb2.Cluster]:
    """The clusters of the collectors the proxy's tracing and access logs send to that its
    Sidecar did not import (`snapshot/collectors.py`): the port's cluster alone, as the
    collector's own service would have it."""
    out: list[cluster_pb2.Cluster] = []
    for collector in scope.proxy.collectors:
        if collector.cluster in present:
            continue
        service = scope.snapshot.services.services.get(collector.hostname)
        port = service.port(collector.port) if service is not None else None
        if service is None or port is None:
            continue
        view = outbound_cluster_view(scope, service, port)
        made = service_port_clusters(view) if memo is None else memo.get(view, service_port_clusters)
        out.extend(c for c in made if c.name == collector.cluster)
    return out


def outbound_cluster_view(scope: ProxyScope, service: Service, port: ServicePort) -> OutboundClusterView:
    """What `service_port_clusters` reads of the snapshot and the proxy, for one service port."""
    snapshot = scope.snapshot
    rule_ref = destination_rule_ref(scope, service.hostname)
    rule_path = _rule_path(scope, rule_ref.value) if rule_ref is not None else ""
    dns = service.resolution in (Resolution.DNS, Resolution.DNS_ROUND_ROBIN)
    dynamic = dfp.is_dynamic(service)
    endpoints: Ref[tuple[Endpoint, ...]] | None = None
    if dns:
        model = snapshot.services
        endpoints = Ref(model.endpoints_digest(service.hostname), model.endpoints_of(service.hostname))
    return OutboundClusterView(
        service=service,
        port=port,
        rule=rule_ref,
        rule_path=rule_path,
        proxy_type=scope.proxy.type,
        dns_family=scope.proxy.family if dns or dynamic else "",
        dns_locality=scope.proxy.locality if dns else "",
        dns_endpoints=endpoints,
        connect_timeout=snapshot.mesh.connect_timeout_seconds,
        mesh_locality=snapshot.mesh.locality_lb_setting,
        auto_mtls=(
            snapshot.mesh.enable_auto_mtls
            and service.location is Location.MESH_INTERNAL
            and snapshot.index.scoped(
                "namespace_mtls", service.namespace, lambda: namespace_mode(snapshot, service.namespace)
            )
            is not MtlsMode.DISABLE
        ),
        identities=snapshot.index.scoped("identities", service.hostname, lambda: _identities(snapshot, service)),
        mesh_certificates=scope.proxy.mesh_certificates,
        dns_cache_max_hosts=snapshot.mesh.dns_cache_max_hosts if dynamic else 0,
        credentials=scope.proxy.credentials and scope.proxy.type is ProxyType.ROUTER,
    )


def _identities(snapshot: Snapshot, service: Service) -> tuple[str, ...]:
    """The SPIFFE URIs of a mesh-internal service's workloads (none for external services, whose
    servers are not the mesh's)."""
    if service.location is not Location.MESH_INTERNAL:
        return ()
    domain = snapshot.mesh.trust_domain
    return tuple(spiffe_uri(domain, ns, sa) for ns, sa in snapshot.services.identities(service.hostname))


def service_port_clusters(view: OutboundClusterView) -> tuple[cluster_pb2.Cluster, ...]:
    """The clusters of one service port: `outbound|PORT||HOST` and one per subset, finished
    (DNS extension, stat names) and sorted as `build_outbound_clusters` puts them."""
    # The DNS extension last, once every step of `_outbound` has read the plain type.
    return tuple(delimited_stats([use_dns_extension(c, view.dns_family) for c in _outbound(view)]))


def _discovery_type(view: OutboundClusterView) -> int:
    resolution = view.service.resolution
    if resolution is Resolution.DNS:
        return int(_Cluster.STRICT_DNS)
    if resolution is Resolution.DNS_ROUND_ROBIN:
        return int(_Cluster.LOGICAL_DNS)
    if resolution is Resolution.NONE and view.proxy_type is ProxyType.SIDECAR:
        return int(_Cluster.ORIGINAL_DST)
    return int(_Cluster.EDS)


def _outbound(view: OutboundClusterView) -> list[cluster_pb2.Cluster]:
    service, port = view.service, view.port
    rule = view.rule.value if view.rule is not None else None
    if dfp.is_dynamic(service):
        return _dynamic(view, rule)
    kind = _discovery_type(view)
    name = names.outbound_cluster(port.number, service.hostname)
    draft = _outbound_base(view, name, kind, labels=None)
    if draft is None:
        return []
    rule_policy = traffic_policy(rule.spec) if rule is not None else None
    policy = policy_for_port(rule_policy, port.number)
    _apply_traffic_policy(view, draft, policy, subset="")
    _maybe_eds(draft.cluster)
    meta = istio_metadata(draft.cluster)
    if service.location is Location.MESH_EXTERNAL:
        meta.update({"external": True})
    if rule is not None:
        _rule_metadata(view.rule_path, draft.cluster, policy)
    out = [draft.finish()]
    if rule is None:
        return out
    seen: set[str] = set()
    for subset in rule.spec.subsets:
        if subset.name in seen:
            continue
        seen.add(subset.name)
        built = _subset(view, subset=subset, parent_type=draft.cluster.type, rule_policy=rule_policy)
        if built is not None:
            out.append(built)
    return out


def _dynamic(view: OutboundClusterView, rule: MergedDestinationRule | None) -> list[cluster_pb2.Cluster]:
    """A DYNAMIC_DNS service port's one cluster, for a sidecar on an HTTP or TLS port (as in
    Istio: a gateway gets none, nor does an HTTPS or TCP port). A DestinationRule's connection
    pool and outlier detection apply, and on HTTP ports its SIMPLE or MUTUAL `tls`, with the SNI
    and the certificate's name checked against the host each request names (Envoy's auto_sni
    and auto_san_validation; `insecureSkipVerify` drops the check). Subsets are not generated:
    one DNS cache serves every host the wildcard covers."""
    service, port = view.service, view.port
    if view.proxy_type is not ProxyType.SIDECAR or not dfp.serves(port):
        return []
    rule_policy = traffic_policy(rule.spec) if rule is not None else None
    policy = policy_for_port(rule_policy, port.number) or Policy()
    cache = dfp.dns_cache(dfp.cache_name(service.hostname), max_hosts=view.dns_cache_max_hosts, family=view.dns_family)
    name = names.outbound_cluster(port.number, service.hostname)
    draft = dfp.port_cluster(name, cache, protocol=port.protocol, policy=policy, connect_timeout=view.connect_timeout)
    meta = istio_metadata(draft.cluster)
    meta.update({"services": [service_metadata(service)], "default_original_port": port.number})
    if service.location is Location.MESH_EXTERNAL:
        meta.update({"external": True})
    if rule is not None:
        _rule_metadata(view.rule_path, draft.cluster, policy)
    return [draft.finish()]


def _subset(
    view: OutboundClusterView,
    *,
    subset: dr_pb2.Subset,
    parent_type: int,
    rule_policy: dr_pb2.TrafficPolicy | None,
) -> cluster_pb2.Cluster | None:
    port = view.port
    policy = policy_for_subset(rule_policy, traffic_policy(subset), port.number)
    kind = parent_type
    lb = policy.load_balancer if policy is not None else None
    if lb is not None and lb.HasField("simple") and lb.simple == lb.PASSTHROUGH:
        kind = int(_Cluster.ORIGINAL_DST)
    name = names.outbound_cluster(port.number, view.service.hostname, subset.name)
    draft = _outbound_base(view, name, kind, labels=dict(subset.labels))
    if draft is None:
        return None
    _apply_traffic_policy(view, draft, policy, subset=subset.name)
    _maybe_eds(draft.cluster)
    _rule_metadata(view.rule_path, draft.cluster, policy)
    istio_metadata(draft.cluster).update({"subset": subset.name})
    return draft.finish()


def _outbound_base(
    view: OutboundClusterView, name: str, kind: int, *, labels: Mapping[str, str] | None
) -> ClusterDraft | None:
    """Istio's buildCluster: type, inline endpoints for DNS clusters, upstream protocol and
    telemetry metadata; None for a DNS cluster without endpoints."""
    service, port = view.service, view.port
    cluster = _Cluster(name=name, type=kind)
    cluster.common_lb_config.SetInParent()
    if is_dns_type(kind):
        known = view.dns_endpoints.value if view.dns_endpoints is not None else ()
        endpoints = select_endpoints(known, port.number, labels)
        if not endpoints and labels is None and not known:
            endpoints = [Endpoint(service.hostname, {port.number: port.number}, namespace=service.namespace)]
        if kind == _Cluster.LOGICAL_DNS:
            endpoints = endpoints[:1]
        if not endpoints:
            return None
        cluster.load_assignment.cluster_name = name
        cluster.load_assignment.endpoints.extend(locality_lb_endpoints(endpoints, port.number))
    draft = ClusterDraft(cluster)
    # Inbound sniffing is not generated, so only outbound clusters follow the client's protocol.
    apply_upstream_protocol(draft, port.protocol, sniffed=view.proxy_type is ProxyType.SIDECAR)
    istio_metadata(cluster).update({"services": [service_metadata(service)], "default_original_port": port.number})
    return draft


def _apply_traffic_policy(
    view: OutboundClusterView, draft: ClusterDraft, policy: Policy | None, *, subset: str
) -> None:
    """Istio's applyTrafficPolicy for an outbound cluster, in its order."""
    policy = policy or Policy()
    # Upgrade first, so that the pool's HTTP/2 settings reach an upgraded cluster (istio/istio#57583).
    apply_h2_upgrade(draft, policy.connection_pool)
    apply_connection_pool(draft, policy.connection_pool, view.connect_timeout, policy.retry_budget)
    apply_outlier_detection(draft.cluster, policy.outlier_detection)
    apply_load_balancer(
        draft.cluster,
        policy.load_balancer,
        view.dns_locality,
        _mesh_locality(view.mesh_locality),
        view.service.traffic_distribution,
    )
    _apply_upstream_tls(view, draft, policy.tls, subset)
    apply_proxy_protocol(draft.cluster, policy.proxy_protocol)
    if draft.cluster.type == _Cluster.ORIGINAL_DST:
        draft.cluster.lb_policy = _Cluster.CLUSTER_PROVIDED


def _apply_upstream_tls(
    view: OutboundClusterView, draft: ClusterDraft, tls: dr_pb2.ClientTLSSettings | None, subset: str
) -> None:
    """Istio's buildUpstreamTLSSettings: the rule's TLS (ISTIO_MUTUAL with the mesh's
    certificates), else auto mTLS where it applies; never for ORIGINAL_DST clusters, whose
    endpoints nobody knows."""
    sni = istio_sni(view.port.number, subset, view.service.hostname)
    if not view.mesh_certificates:
        # ISTIO_MUTUAL included: plaintext, as a proxy without a certificate must
        apply_tls(draft, tls, credentials=view.credentials)
    elif is_istio_mutual(tls):
        assert tls is not None
        apply_istio_mutual(draft, tls, sni, view.identities)
    elif tls is not None:
        apply_tls(draft, tls, credentials=view.credentials)
    elif view.auto_mtls and draft.cluster.type != _Cluster.ORIGINAL_DST:
        apply_auto_mtls(draft, sni, view.identities)


@lru_cache(maxsize=8)
def _mesh_locality(serialized: bytes) -> dr_pb2.LocalityLoadBalancerSetting:
    return dr_pb2.LocalityLoadBalancerSetting.FromString(serialized)


def _maybe_eds(cluster: cluster_pb2.Cluster) -> None:
    if cluster.type != _Cluster.EDS:
        return
    eds = cluster.eds_cluster_config
    eds.service_name = cluster.name
    eds.eds_config.ads.SetInParent()
    eds.eds_config.initial_fetch_timeout.CopyFrom(duration(0))
    eds.eds_config.resource_api_version = config_source_pb2.V3


def _rule_metadata(rule_path: str, cluster: cluster_pb2.Cluster, policy: Policy | None) -> None:
    meta = istio_metadata(cluster)
    meta.update({"config": rule_path})
    if policy is not None and originates_tls(policy.tls):
        meta.update({"alpn_override": "false"})


def _rule_path(scope: ProxyScope, rule: MergedDestinationRule) -> str:
    """Istio's `config` path of the first rule merged into `rule`."""
    return names.config_path(scope.snapshot.configs[rule.sources[0]])


# -- always there --------------------------------------------------------------------------


def _blackhole(timeout: float) -> cluster_pb2.Cluster:
    """A cluster without endpoints: routes to it fail fast (REGISTRY_ONLY, unmatched routes)."""
    cluster = _Cluster(name=names.BLACKHOLE_CLUSTER)
    cluster.type = _Cluster.STATIC
    cluster.connect_timeout.CopyFrom(duration(timeout))
    return cluster
