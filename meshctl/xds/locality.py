"""Localities as Envoy sees them, and Istio's locality load balancing relative to one proxy.

A locality is written `region/zone/subzone`. Istio rewrites a load assignment for each calling
proxy: with `distribute`, each locality's weight is set from the rule that matches the proxy's
locality; with failover (which needs outlier detection, or Envoy never fails over), each locality
gets a priority by how much of the proxy's locality it shares (all, region and zone, region,
nothing; a `failover` rule sends a region's traffic to its chosen region before the rest).

meshctl applies this only to load assignments carried in a cluster (DNS clusters), which are
generated per proxy anyway. EDS load assignments are shared by every proxy that asks for the
same cluster, so they cannot depend on who asks; there every locality keeps priority 0 and the
sum of its endpoints' weights. `failoverPriority` (label-based) is not applied to inline
assignments either, as in Istio, which needs the endpoints' labels for it.
"""

from __future__ import annotations

import math
from collections import defaultdict

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2


def split_locality(text: str) -> tuple[str, str, str]:
    parts = [*text.split("/", 2), "", ""]
    return parts[0], parts[1], parts[2]


def locality_proto(text: str) -> base_pb2.Locality:
    region, zone, sub_zone = split_locality(text)
    return base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone)


def _as_text(locality: base_pb2.Locality) -> tuple[str, str, str]:
    return locality.region, locality.zone, locality.sub_zone


def locality_matches(locality: tuple[str, str, str], rule: str) -> bool:
    """Istio's LocalityMatch: `*` matches anything, a missing zone or subzone matches any."""
    region, zone, sub_zone = split_locality(rule)
    return region in ("*", locality[0]) and zone in ("*", "", locality[1]) and sub_zone in ("*", "", locality[2])


def _priority(proxy: tuple[str, str, str], endpoints: tuple[str, str, str]) -> int:
    if proxy[0] != endpoints[0]:
        return 3
    if proxy[1] != endpoints[1]:
        return 2
    return 0 if proxy[2] == endpoints[2] else 1


def apply_locality(
    assignment: endpoint_pb2.ClusterLoadAssignment,
    proxy_locality: str,
    setting: dr_pb2.LocalityLoadBalancerSetting,
    failover_enabled: bool,
) -> None:
    """Rewrite `assignment` for a proxy in `proxy_locality` (Istio's ApplyLocalityLoadBalancer)."""
    proxy = split_locality(proxy_locality)
    if setting.distribute:
        _apply_weights(assignment, proxy, setting)
    elif failover_enabled and (setting.failover or not setting.failover_priority):
        _apply_failover(assignment, proxy, setting)


def _apply_weights(
    assignment: endpoint_pb2.ClusterLoadAssignment,
    proxy: tuple[str, str, str],
    setting: dr_pb2.LocalityLoadBalancerSetting,
) -> None:
    for rule in setting.distribute:
        if not locality_matches(proxy, getattr(rule, "from")):
            continue
        unmatched = set(range(len(assignment.endpoints)))
        # Istio walks a Go map here (random order); sorted keys keep the output stable.
        for target in sorted(rule.to):
            weight = rule.to[target]
            original: dict[int, int] = {}
            for i, group in enumerate(assignment.endpoints):
                if i in unmatched and locality_matches(_as_text(group.locality), target):
                    unmatched.discard(i)
                    has_weight = group.HasField("load_balancing_weight")
                    original[i] = group.load_balancing_weight.value if has_weight else 1
            total = sum(original.values())
            for i, value in original.items():
                share = value * weight / total if total else 0
                if share > 0:
                    assignment.endpoints[i].load_balancing_weight.value = math.ceil(share)
        for i in unmatched:
            del assignment.endpoints[i].lb_endpoints[:]
        return


def _apply_failover(
    assignment: endpoint_pb2.ClusterLoadAssignment,
    proxy: tuple[str, str, str],
    setting: dr_pb2.LocalityLoadBalancerSetting,
) -> None:
    by_priority: dict[int, list[int]] = defaultdict(list)
    for i, group in enumerate(assignment.endpoints):
        where = _as_text(group.locality)
        priority = _priority(proxy, where)
        if priority == 3:
            for rule in setting.failover:
                if getattr(rule, "from") == proxy[0]:
                    if where[0] != rule.to:
                        priority = 4
                    break
        value = group.priority * 5 + priority
        group.priority = value
        by_priority[value].append(i)
    # Envoy wants priorities numbered from 0 without gaps.
    for rank, value in enumerate(sorted(by_priority)):
        for i in by_priority[value]:
            assignment.endpoints[i].priority = rank
