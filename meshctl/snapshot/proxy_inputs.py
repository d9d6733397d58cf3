"""What of a proxy its generation can read, decided from the mesh: the label selectors its labels
are tested against, and whether its locality, labels and network matter at all.

A proxy's view (`OutboundProxy`) keeps only what these say, so proxies that differ elsewhere
share one generation. Each is a pure function of the configs, services and mesh settings; apart
from the snapshot index (`snapshot/index.py`), which computes each once per snapshot and carries
it to the next while its inputs are the same objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from meshctl.config.labels import selector_labels
from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config
from meshctl.registry.model import Resolution, Service, TrafficDistribution

#: A label selector as sorted (key, value) pairs: hashable, so it can be part of a cache key.
LabelSelector = tuple[tuple[str, str], ...]

#: The resolutions whose clusters carry their endpoints in CDS.
DNS_RESOLUTIONS: Final = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})


def _spec(config: Config) -> Any:
    return config.spec


def label_selectors(by_kind: Mapping[str, tuple[Config, ...]]) -> tuple[LabelSelector, ...]:
    """Every distinct non-empty label selector that generation tests a proxy's labels
    against: Sidecar and DestinationRule workload selectors, Gateway selectors and the
    `sourceLabels` of VirtualService matches. A proxy's labels reach its outbound config only
    through these tests, so proxies that match the same selectors share that config
    (`OutboundProxy`) whatever their other labels."""
    found: dict[LabelSelector, None] = {}

    def add(labels: Mapping[str, str]) -> None:
        if labels:
            found.setdefault(tuple(sorted(labels.items())), None)

    for config in by_kind.get("Sidecar", ()):
        add(selector_labels(_spec(config)))
    for config in by_kind.get("DestinationRule", ()):
        add(selector_labels(_spec(config)))
    for config in by_kind.get("Gateway", ()):
        add(_spec(config).selector)
    for config in by_kind.get("VirtualService", ()):
        spec = _spec(config)
        for route in (*spec.http, *spec.tcp, *spec.tls):
            for match in route.match:
                add(match.source_labels)
    return tuple(found)


def policy_selectors(by_kind: Mapping[str, tuple[Config, ...]]) -> tuple[LabelSelector, ...]:
    """The label selectors of AuthorizationPolicies and RequestAuthentications: a gateway
    enforces those that select it in its listeners, so they are part of its outbound key
    (a sidecar's are inbound config, keyed by its inbound view)."""
    found: dict[LabelSelector, None] = {}
    for kind in ("AuthorizationPolicy", "RequestAuthentication"):
        for config in by_kind.get(kind, ()):
            body = _spec(config)
            if body.HasField("selector") and body.selector.match_labels:
                found.setdefault(tuple(sorted(body.selector.match_labels.items())), None)
    return tuple(found)


def has_dns_services(services: Iterable[Service]) -> bool:
    """Whether any service resolves by DNS: only such clusters carry endpoints in CDS, the
    one place a proxy's own locality shapes its outbound config (locality priorities)."""
    return any(s.resolution in DNS_RESOLUTIONS for s in services)


def has_label_failover(mesh: MeshSettings, services: Iterable[Service], destination_rules: Iterable[Config]) -> bool:
    """Whether anything asks for failover by labels (a `failoverPriority` in a
    DestinationRule or the mesh's locality setting, a service's traffic distribution): only
    then does a proxy's EDS depend on its labels and network, not just its locality."""
    return (
        bool(mesh.locality_default().failover_priority)
        or any(s.traffic_distribution is not TrafficDistribution.ANY for s in services)
        or any(_names_failover_priority(_spec(c)) for c in destination_rules)
    )


def _names_failover_priority(rule: Any) -> bool:
    """Whether a DestinationRule sets a failoverPriority anywhere (its policy, a port's, a
    subset's). Unset fields are tested, never read: reading one would grow the message."""
    owners = [rule, *rule.subsets]
    policies = [o.traffic_policy for o in owners if o.HasField("traffic_policy")]
    policies += [p for policy in list(policies) for p in policy.port_level_settings]
    return any(
        p.HasField("load_balancer")
        and p.load_balancer.HasField("locality_lb_setting")
        and bool(p.load_balancer.locality_lb_setting.failover_priority)
        for p in policies
    )
