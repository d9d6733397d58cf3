"""Locality load balancing on EDS clusters, per proxy, as Istio applies it.

A ClusterLoadAssignment is shared by every proxy (`endpoints.build_load_assignment`), but Istio's
locality rules are relative to the caller: failover priorities by proximity (on by default once a
cluster has outlier detection), `failover` regions, `distribute` weights, and `failoverPriority`
(by the labels the caller shares with each endpoint; a service's traffic distribution,
`PreferClose` and the like, is a failoverPriority of topology labels that needs no outlier
detection). So where such a rule is in force, the proxy gets a variant of the assignment,
rewritten by the same `locality.apply_locality` DNS clusters use.

A variant depends only on what its `LocalityView` holds: the rule, the proxy's locality where
the rule reads it, and the proxy's values of the failoverPriority keys where it has them. Every
proxy that agrees on those shares one variant, whatever else differs: a fleet costs one
variant per locality (or per distinct set of those label values), not one per proxy. A proxy
that knows no locality keeps the shared assignment unless a failoverPriority applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from envoy.config.endpoint.v3 import endpoint_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.registry.model import TrafficDistribution
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.cluster_policy import (
    forces_failover,
    locality_setting,
    policy_for_port,
    policy_for_subset,
    traffic_policy,
)
from meshctl.xds.endpoints import AssignmentView, assigned_endpoints, build_assignment, locality_groups
from meshctl.xds.locality import apply_locality, priority_keys, proxy_priority_values, topology_value
from meshctl.xds.names import Direction, parse_cluster_name


class LocalityView(NamedTuple):
    """What a per-proxy assignment depends on besides the shared one: the variant's key."""

    #: the proxy's locality; "" when the rule does not read it (failoverPriority alone)
    locality: str
    #: the LocalityLoadBalancerSetting in force, in its wire form
    setting: bytes
    failover: bool
    #: the proxy's side of each failoverPriority key (`proxy_priority_values`); () when no
    #: failoverPriority applies
    priority_values: tuple[str, ...] = ()


def eds_localities(snapshot: Snapshot, proxy: Proxy, clusters: Iterable[str]) -> Mapping[str, LocalityView]:
    """The EDS clusters of `clusters` whose assignment is rewritten for `proxy`, with the view
    each is rewritten for; empty for a proxy without a locality (the usual VM) unless a
    failoverPriority or a traffic distribution is in force somewhere in the mesh."""
    if not proxy.locality and not snapshot.index.has_label_failover:
        return {}
    scope = ProxyScope(snapshot, proxy)
    mesh_default = snapshot.mesh.locality_default()
    network = proxy_network(proxy)
    out: dict[str, LocalityView] = {}
    for name in clusters:
        parsed = parse_cluster_name(name)
        if parsed is None or parsed.direction is not Direction.OUTBOUND:
            continue
        rule = scope.destination_rule(parsed.host)
        rule_policy = traffic_policy(rule.spec) if rule is not None else None
        if parsed.subset and rule is not None:
            subset = next((s for s in rule.spec.subsets if s.name == parsed.subset), None)
            policy = policy_for_subset(rule_policy, traffic_policy(subset), parsed.port)
        else:
            policy = policy_for_port(rule_policy, parsed.port)
        service = snapshot.services.services.get(parsed.host)
        distribution = service.traffic_distribution if service is not None else TrafficDistribution.ANY
        lb = policy.load_balancer if policy is not None else None
        setting = locality_setting(lb, mesh_default, distribution)
        if setting is None:
            continue
        failover = (policy is not None and policy.outlier_detection is not None) or forces_failover(lb, distribution)
        view = _view(proxy, network, setting, failover)
        if view is not None:
            out[name] = view
    return out


def _view(
    proxy: Proxy, network: str, setting: dr_pb2.LocalityLoadBalancerSetting, failover: bool
) -> LocalityView | None:
    """The view a cluster under `setting` is rewritten for, holding only what the rewrite reads
    (as `locality.apply_locality` decides it); None when nothing is rewritten."""
    by_labels = failover and not setting.distribute and bool(setting.failover_priority)
    by_locality = bool(setting.distribute) or (failover and (bool(setting.failover) or not setting.failover_priority))
    if not by_labels and not (by_locality and proxy.locality):
        return None
    values = (
        proxy_priority_values(setting.failover_priority, proxy.labels, proxy.locality, network) if by_labels else ()
    )
    locality = proxy.locality if by_locality else ""
    return LocalityView(locality, setting.SerializeToString(deterministic=True), failover, values)


def proxy_network(proxy: Proxy) -> str:
    """The network of the proxy's workload (its endpoints' `network`), "" when none says."""
    return next((i.endpoint.network for i in proxy.instances if i.endpoint.network), "")


def build_variant(
    view: AssignmentView, locality: LocalityView, shared: endpoint_pb2.ClusterLoadAssignment | None = None
) -> endpoint_pb2.ClusterLoadAssignment:
    """The assignment of `view` rewritten for `locality`; `shared` is the shared assignment of
    `view` when it is at hand (it is copied, not changed)."""
    out = endpoint_pb2.ClusterLoadAssignment()
    out.CopyFrom(shared if shared is not None else build_assignment(view))
    setting = dr_pb2.LocalityLoadBalancerSetting.FromString(locality.setting)
    values = None
    if locality.priority_values:
        keys = [key for key, _ in priority_keys(setting.failover_priority)]
        values = [
            [tuple(topology_value(e.labels, e.locality, e.network, key) for key in keys) for e in members]
            for _, members in locality_groups(assigned_endpoints(view))
        ]
    apply_locality(
        out,
        locality.locality,
        setting,
        locality.failover,
        endpoint_values=values,
        proxy_values=locality.priority_values,
    )
    return out
