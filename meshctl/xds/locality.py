"""Localities as Envoy sees them, and Istio's locality load balancing relative to one proxy.

A locality is written `region/zone/subzone`. Istio rewrites a load assignment for each calling
proxy (its `ApplyLocalityLoadBalancer`): with `distribute`, each locality's weight is set from
the rule that matches the proxy's locality; with failover (which needs outlier detection, or
Envoy never fails over; a service's traffic distribution forces it), either

- `failoverPriority`, a list of label keys (`key=value` pins the value instead of taking the
  proxy's): each endpoint gets a priority by how many leading keys it agrees on with the proxy
  (all: 0; none: the lowest), each locality group split by priority; and then, if `failover` is
  given too, the locality failover below on top of that; or
- locality failover: each locality gets a priority by how much of the proxy's locality it
  shares (all, region and zone, region, nothing; a `failover` rule sends a region's traffic to
  its chosen region before the rest).

Labels are compared as Istio augments them (`topology_value`): an endpoint's and the proxy's
region, zone and subzone come from their locality, their network from the
`topology.istio.io/network` label, else the workload's network.

Load assignments carried in a cluster (DNS clusters) get the locality rules but not
`failoverPriority`, as in Istio, which has no endpoint labels there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.config.labels import NETWORK_LABEL

REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
SUBZONE_LABEL: Final = "topology.istio.io/subzone"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
#: Istio's separator of a failoverPriority entry that pins a value (`key=value`).
_PINNED: Final = "="
_MAX_WEIGHT: Final = 4294967295


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


def topology_value(labels: Mapping[str, str], locality: str, network: str, key: str) -> str:
    """The value of label `key` for a workload, as Istio's `AugmentLabels` makes it: its
    locality's region, zone and subzone where set, its network where no label names one."""
    if key in _LOCALITY_KEYS:
        part = split_locality(locality)[_LOCALITY_KEYS[key]]
        if part:
            return part
    elif key == NETWORK_LABEL:
        return labels.get(key) or network
    return labels.get(key, "")


_LOCALITY_KEYS: Final = {REGION_LABEL: 0, ZONE_LABEL: 1, SUBZONE_LABEL: 2}


def priority_keys(failover_priority: Sequence[str]) -> list[tuple[str, str | None]]:
    """Each failoverPriority entry as (label key, pinned value or None), as Istio splits them."""
    out: list[tuple[str, str | None]] = []
    for entry in failover_priority:
        parts = entry.split(_PINNED)
        out.append((parts[0], parts[1] if len(parts) == 2 else None))
    return out


def proxy_priority_values(
    failover_priority: Sequence[str], labels: Mapping[str, str], locality: str, network: str
) -> tuple[str, ...]:
    """What the proxy's side of each failoverPriority key is: a pinned value, else its own
    label's. All a rewrite by failoverPriority reads of the proxy."""
    return tuple(
        pinned if pinned is not None else topology_value(labels, locality, network, key)
        for key, pinned in priority_keys(failover_priority)
    )


def apply_locality(
    assignment: endpoint_pb2.ClusterLoadAssignment,
    proxy_locality: str,
    setting: dr_pb2.LocalityLoadBalancerSetting,
    failover_enabled: bool,
    *,
    endpoint_values: Sequence[Sequence[tuple[str, ...]]] | None = None,
    proxy_values: tuple[str, ...] = (),
) -> None:
    """Rewrite `assignment` for a proxy in `proxy_locality` (Istio's ApplyLocalityLoadBalancer).

    `endpoint_values[i][j]` are the failoverPriority values of endpoint j of locality group i
    (`topology_value` per key) and `proxy_values` the proxy's (`proxy_priority_values`); without
    them (a DNS cluster's inline endpoints) failoverPriority is not applied, as in Istio."""
    proxy = split_locality(proxy_locality)
    if setting.distribute:
        _apply_weights(assignment, proxy, setting)
    elif failover_enabled:
        if setting.failover_priority:
            if endpoint_values is not None:
                apply_failover_priorities(assignment, endpoint_values, proxy_values)
            if setting.failover:
                _apply_failover(assignment, proxy, setting)
        else:
            _apply_failover(assignment, proxy, setting)


def apply_failover_priorities(
    assignment: endpoint_pb2.ClusterLoadAssignment,
    endpoint_values: Sequence[Sequence[tuple[str, ...]]],
    proxy_values: tuple[str, ...],
) -> None:
    """Istio's applyFailoverPriorities: an endpoint that agrees with the proxy on every key gets
    priority 0; one that first disagrees on key j (of n) gets n - j. Each locality group is split
    into one group per priority (in priority order, each weighing what its endpoints weigh),
    and the priorities are then renumbered from 0 without gaps, as Envoy wants them."""
    lowest = len(proxy_values)
    groups: list[endpoint_components_pb2.LocalityLbEndpoints] = []
    for group, values in zip(assignment.endpoints, endpoint_values, strict=True):
        by_priority: dict[int, list[endpoint_components_pb2.LbEndpoint]] = defaultdict(list)
        for endpoint, own in zip(group.lb_endpoints, values, strict=True):
            first_miss = next((j for j, (a, b) in enumerate(zip(proxy_values, own, strict=True)) if a != b), None)
            by_priority[0 if first_miss is None else lowest - first_miss].append(endpoint)
        for priority in sorted(by_priority):
            split = endpoint_components_pb2.LocalityLbEndpoints()
            split.CopyFrom(group)
            del split.lb_endpoints[:]
            split.lb_endpoints.extend(by_priority[priority])
            split.priority = priority
            split.load_balancing_weight.value = min(
                sum(e.load_balancing_weight.value for e in by_priority[priority]), _MAX_WEIGHT
            )
            groups.append(split)
    rank = {value: i for i, value in enumerate(sorted({g.priority for g in groups}))}
    for split in groups:
        split.priority = rank[split.priority]
    del assignment.endpoints[:]
    assignment.endpoints.extend(groups)


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
