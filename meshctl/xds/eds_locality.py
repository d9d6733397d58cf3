"""Locality load balancing on EDS clusters, per proxy, as Istio applies it.

A ClusterLoadAssignment is shared by every proxy (`endpoints.build_load_assignment`), but Istio's
locality rules are relative to the caller: failover priorities by proximity (on by default once a
cluster has outlier detection), `failover` regions, and `distribute` weights. So where such a rule
is in force for a proxy that knows its locality, the proxy gets a variant of the assignment,
rewritten by the same `locality.apply_locality` DNS clusters use. A variant depends only on what
its `LocalityView` holds (the proxy's locality and the rule), so every proxy of one locality
under one rule shares it: a fleet costs one variant per locality, not one per proxy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from envoy.config.endpoint.v3 import endpoint_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.cluster_policy import locality_setting, policy_for_port, policy_for_subset, traffic_policy
from meshctl.xds.locality import apply_locality
from meshctl.xds.names import Direction, parse_cluster_name


class LocalityView(NamedTuple):
    """What a per-proxy assignment depends on besides the shared one."""

    locality: str
    #: the LocalityLoadBalancerSetting in force, in its wire form
    setting: bytes
    failover: bool


def eds_localities(snapshot: Snapshot, proxy: Proxy, clusters: Iterable[str]) -> Mapping[str, LocalityView]:
    """The EDS clusters of `clusters` whose assignment is rewritten for `proxy`, with the view
    each is rewritten for; empty for a proxy without a locality (the usual VM)."""
    if not proxy.locality:
        return {}
    scope = ProxyScope(snapshot, proxy)
    mesh_default = snapshot.mesh.locality_default()
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
        setting = locality_setting(policy.load_balancer if policy is not None else None, mesh_default)
        if setting is None:
            continue
        failover = policy is not None and policy.outlier_detection is not None
        # As `cluster_policy.apply_load_balancer` decides it for DNS clusters.
        if setting.distribute or (failover and (setting.failover or not setting.failover_priority)):
            out[name] = LocalityView(proxy.locality, setting.SerializeToString(deterministic=True), failover)
    return out


def for_view(assignment: endpoint_pb2.ClusterLoadAssignment, view: LocalityView) -> endpoint_pb2.ClusterLoadAssignment:
    """A copy of the shared `assignment`, rewritten for `view`."""
    out = endpoint_pb2.ClusterLoadAssignment()
    out.CopyFrom(assignment)
    setting = dr_pb2.LocalityLoadBalancerSetting.FromString(view.setting)
    apply_locality(out, view.locality, setting, view.failover)
    return out
