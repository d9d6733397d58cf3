"""What one proxy sees of the snapshot: Istio's Sidecar scope, and the config that applies to it.

Every generator asks the scope, never the raw snapshot, which services a proxy may call, which
VirtualService routes a host, which DestinationRule applies and which Gateways a router serves,
so these rules (Istio's `SidecarScope`, `exportTo`, DestinationRule precedence and merge) are
written once. A scope is a pure function of (snapshot, proxy) and is cheap to build.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from meshctl.config.hosts import host_matches, hosts_overlap, is_short_name
from meshctl.config.labels import labels_match, selector_labels
from meshctl.config.model import Config, ConfigKey
from meshctl.config.references import MESH_GATEWAY as _MESH
from meshctl.config.references import resolve_gateway_name
from meshctl.registry.model import Service
from meshctl.snapshot.binding import outbound_of, select_sidecar
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import OutboundProxy, Proxy

#: The generators read it here, with the rest of the scope.
MESH_GATEWAY = _MESH


@dataclass(frozen=True, slots=True)
class EgressHost:
    """One `ns/host` of a Sidecar egress listener, namespace resolved (`.` -> the Sidecar's)."""

    namespace: str  # a namespace, `*` any, `~` none, `~NS` any but NS
    host: str

    def takes_namespace(self, namespace: str) -> bool:
        ns = self.namespace
        if ns.startswith("~"):
            return len(ns) > 1 and ns[1:] != namespace
        return ns in ("*", namespace)

    def covers(self, namespace: str, host: str) -> bool:
        return self.takes_namespace(namespace) and host_matches(self.host, host)

    def overlaps(self, namespace: str, host: str) -> bool:
        """Whether a VirtualService host of `namespace` is imported: as Istio's
        `selectVirtualServices` does with `host.Name.Matches`, either side may be the wildcard,
        so `*.bookinfo.mesh` is kept for an egress host `bookinfo/reviews.bookinfo.mesh`."""
        return self.takes_namespace(namespace) and hosts_overlap(self.host, host)


@dataclass(frozen=True, slots=True)
class MergedDestinationRule:
    """The DestinationRule that applies to a host for one proxy: Istio merges every rule of the
    chosen namespace for the same host (subsets added, the first traffic policy kept)."""

    host: str
    namespace: str
    spec: Any
    sources: tuple[ConfigKey, ...]

    def subset(self, name: str) -> Any:
        for s in self.spec.subsets:
            if s.name == name:
                return s
        return None


def rule_digest(snapshot: Snapshot, rule: MergedDestinationRule | None) -> object:
    """What a merged rule is made of, by content: its host, namespace and sources with their
    content digests and API versions (None for no rule). Equal digests, equal rules."""
    if rule is None:
        return None
    configs = snapshot.configs
    return (
        rule.host,
        rule.namespace,
        tuple((k, configs[k].content_digest(), configs[k].api_version) for k in rule.sources),
    )


def parse_egress_hosts(hosts: Iterable[str], sidecar_namespace: str) -> tuple[EgressHost, ...]:
    out = []
    for entry in hosts:
        ns, sep, host = entry.partition("/")
        if not sep:
            ns, host = "*", entry
        if ns == ".":
            ns = sidecar_namespace
        out.append(EgressHost(ns, host))
    return tuple(out)


class ProxyScope:
    """The slice of a snapshot one proxy sees.

    The scope knows the proxy only as its `OutboundProxy`: what outbound generation may read of
    it, and the key the server shares that generation by. Given a bound `Proxy` (the offline
    commands, the inbound part), it derives that here, for this snapshot, and keeps the proxy as
    `bound` for the inbound view alone; the server's outbound generation is given the
    OutboundProxy itself, so it cannot reach anything that is not keyed.
    """

    def __init__(self, snapshot: Snapshot, proxy: Proxy | OutboundProxy) -> None:
        self.snapshot = snapshot
        self.bound: Proxy | None = proxy if isinstance(proxy, Proxy) else None
        self.proxy: OutboundProxy = outbound_of(proxy, snapshot) if isinstance(proxy, Proxy) else proxy
        # Which rule applies to a host reads the rules, the services, the mesh and the proxy's
        # namespace and labels alone: shared by the scopes of one namespace and labels, and
        # carried to the next snapshot while those are the same (`SnapshotIndex.scoped`).
        self._dr_cache: dict[str, MergedDestinationRule | None] = snapshot.index.scoped(
            "destination_rules", (self.proxy.namespace, self.proxy.label_pairs), dict
        )
        #: When set, every DestinationRule asked for is noted here (host -> `rule_digest`): the
        #: trace a part generated from this scope is checked against later (see ResourceCache).
        self.rule_trace: dict[str, object] | None = None
        #: When set, every short name resolved through `resolve` is noted here as (name,
        #: namespace): beside its services, the one thing a part reads of hosts outside its scope.
        self.name_trace: set[tuple[str, str]] | None = None

    @cached_property
    def sidecar(self) -> Config | None:
        """The Sidecar that applies (`select_sidecar`)."""
        return select_sidecar(self.snapshot, self.proxy.type, self.proxy.namespace, self.proxy.labels)

    @cached_property
    def egress_hosts(self) -> tuple[EgressHost, ...]:
        """Hosts the proxy imports; without a Sidecar, everything (`*/*`)."""
        sidecar = self.sidecar
        if sidecar is None:
            return (EgressHost("*", "*"),)
        out: list[EgressHost] = []
        # A Sidecar in the root namespace applies to every namespace: `.` means the proxy's.
        ns = self.proxy.namespace
        for listener in spec(sidecar).egress:
            out.extend(parse_egress_hosts(listener.hosts, ns))
        # A Sidecar that says nothing about egress (only ingress, or only an outbound policy)
        # leaves outbound as it is by default: everything, as in Istio.
        return tuple(out) if spec(sidecar).egress else (EgressHost("*", "*"),)

    @cached_property
    def outbound_traffic_policy(self) -> str:
        """ALLOW_ANY or REGISTRY_ONLY."""
        sidecar = self.sidecar
        if sidecar is not None and spec(sidecar).HasField("outbound_traffic_policy"):
            mode = spec(sidecar).outbound_traffic_policy.mode
            return "REGISTRY_ONLY" if mode == 0 else "ALLOW_ANY"
        return self.snapshot.mesh.outbound_traffic_policy

    def imports(self, namespace: str, host: str) -> bool:
        return any(e.covers(namespace, host) for e in self.egress_hosts)

    @cached_property
    def services(self) -> tuple[Service, ...]:
        """Services the proxy may call, by hostname: exported to its namespace and, for a
        sidecar, imported by its Sidecar's egress hosts. The same for every proxy with the same
        namespace and egress hosts, so computed once for them (`SnapshotIndex.scoped`)."""
        sidecar = self.proxy.type is ProxyType.SIDECAR
        key = (self.proxy.namespace, sidecar, self.egress_hosts if sidecar else ())
        return self.snapshot.index.scoped_services(key, self._calls)

    def _calls(self, svc: Service) -> bool:
        """Whether the proxy may call `svc`: it reads the service, the mesh and `services`' key."""
        if not svc.visible_from(self.proxy.namespace, self.snapshot.mesh.default_service_export_to):
            return False
        return self.proxy.type is not ProxyType.SIDECAR or self.imports(svc.namespace, svc.hostname)

    @cached_property
    def service_hosts(self) -> frozenset[str]:
        return frozenset(s.hostname for s in self.services)

    def service(self, hostname: str) -> Service | None:
        svc = self.snapshot.services.services.get(hostname)
        return svc if svc is not None and hostname in self.service_hosts else None

    def resolve(self, host: str, namespace: str) -> list[str]:
        """What `host`, written in `namespace`, stands for among every known service host
        (`SnapshotIndex.resolve`): the host, then any services a short name names. Generators
        resolve names written in config here and nowhere else, so a part's trace of them is
        whole."""
        if self.name_trace is not None and is_short_name(host):
            self.name_trace.add((host, namespace))
        return self.snapshot.index.resolve(host, namespace)

    def destination_host(self, host: str, namespace: str) -> str:
        """A destination's host as written in `namespace`: a short name stands for the first
        service it names (in name order), else for itself."""
        resolved = self.resolve(host, namespace)
        return resolved[1] if len(resolved) > 1 else resolved[0]

    # -- VirtualServices ---------------------------------------------------------------------

    def virtual_services(self, gateways: Sequence[str] = (MESH_GATEWAY,)) -> tuple[Config, ...]:
        """Visible VirtualServices bound to any of `gateways` (`mesh`, or `ns/name` of Gateways),
        in a stable order (namespace, name); computed once per namespace, gateways and egress
        hosts (`SnapshotIndex.scoped`)."""
        sidecar = self.proxy.type is ProxyType.SIDECAR
        key = (self.proxy.namespace, tuple(gateways), sidecar, self.egress_hosts if sidecar else ())
        wanted = set(gateways)
        return self.snapshot.index.scoped_virtual_services(key, lambda vs: self._sees(vs, wanted))

    def _sees(self, vs: Config, wanted: set[str]) -> bool:
        """Whether the VirtualService is visible here and bound to one of `wanted` gateways: it
        reads the VirtualService, the services (its resolved hosts) and `virtual_services`' key."""
        if not self.snapshot.index.exported_to(vs, self.proxy.namespace):
            return False
        bound = {resolve_gateway_name(g, vs.namespace) for g in spec(vs).gateways} or {MESH_GATEWAY}
        if not bound & wanted:
            return False
        return not (
            MESH_GATEWAY in wanted
            and self.proxy.type is ProxyType.SIDECAR
            and not any(e.overlaps(vs.namespace, h) for h in self.resolved_hosts(vs) for e in self.egress_hosts)
        )

    def resolved_hosts(self, vs: Config) -> list[str]:
        """The VirtualService's hosts with short names resolved against the known services."""
        return list(self.snapshot.index.hosts.get(vs.key, ()))

    @cached_property
    def _mesh_vs_by_host(self) -> dict[str, Config]:
        """For each service host, the mesh VirtualService that routes it: the most specific host
        match; on a tie, the oldest as Istio orders them (`Config.istio_order`: creation time,
        then name, then namespace)."""
        out: dict[str, Config] = {}
        best: dict[str, int] = {}
        service_hosts = self.service_hosts
        for vs in sorted(self.virtual_services((MESH_GATEWAY,)), key=Config.istio_order):
            for pattern in self.resolved_hosts(vs):
                if pattern.startswith("*"):
                    matched = [h for h in service_hosts if host_matches(pattern, h)]
                    rank = len(pattern)
                else:
                    matched = [pattern] if pattern in service_hosts else []
                    rank = 1_000_000
                for svc_host in matched:
                    if rank > best.get(svc_host, -1):
                        best[svc_host] = rank
                        out[svc_host] = vs
        return out

    def virtual_service_for(self, hostname: str) -> Config | None:
        return self._mesh_vs_by_host.get(hostname)

    # -- DestinationRules --------------------------------------------------------------------

    def destination_rule(self, hostname: str) -> MergedDestinationRule | None:
        """Istio's precedence: the proxy's namespace (rules whose workloadSelector matches the
        proxy first), then the service's namespace, then the root namespace; within the chosen
        namespace, every rule for the most specific matching host is merged."""
        if hostname in self._dr_cache:
            result = self._dr_cache[hostname]
        else:
            result = self._dr_cache[hostname] = self._find_destination_rule(hostname)
        if self.rule_trace is not None and hostname not in self.rule_trace:
            self.rule_trace[hostname] = rule_digest(self.snapshot, result)
        return result

    def _find_destination_rule(self, hostname: str) -> MergedDestinationRule | None:
        svc = self.snapshot.services.services.get(hostname)
        namespaces = [self.proxy.namespace]
        if svc is not None and svc.namespace not in namespaces:
            namespaces.append(svc.namespace)
        if self.snapshot.mesh.root_namespace not in namespaces:
            namespaces.append(self.snapshot.mesh.root_namespace)
        index = self.snapshot.index
        for ns in namespaces:
            rules = []
            for dr, match in index.destination_rules(ns, hostname):
                if not index.exported_to(dr, self.proxy.namespace):
                    continue
                selector = selector_labels(spec(dr))
                selected = bool(selector)
                if selected and (ns != self.proxy.namespace or not labels_match(selector, self.proxy.labels)):
                    continue
                rules.append((0 if selected else 1, 0 if match == hostname else 1, -len(match), dr))
            if rules:
                # Ties keep the snapshot's (namespace, name) order, so every replica merges alike.
                rules.sort(key=lambda r: (*r[:3], r[3].name))
                top = rules[0][:3]
                return _merge([r[3] for r in rules if r[:3] == top])
        return None

    # -- Gateways ----------------------------------------------------------------------------

    @cached_property
    def gateways(self) -> tuple[Config, ...]:
        """Gateways whose selector matches a router's labels (any namespace, as Istio does)."""
        if self.proxy.type is not ProxyType.ROUTER:
            return ()
        return tuple(
            gw
            for gw in self.snapshot.of_kind("Gateway")
            if spec(gw).selector and labels_match(spec(gw).selector, self.proxy.labels)
        )


def gateway_ref(config: Config) -> str:
    """How a VirtualService names a Gateway: `namespace/name`."""
    return f"{config.namespace}/{config.name}"


def _merge(rules: list[Config]) -> MergedDestinationRule:
    first = rules[0]
    if len(rules) == 1:
        return MergedDestinationRule(spec(first).host, first.namespace, first.spec, (first.key,))
    merged: Any = type(first.spec)()
    merged.CopyFrom(first.spec)
    names = {s.name for s in merged.subsets}
    for other in rules[1:]:
        s = spec(other)
        for subset in s.subsets:
            if subset.name not in names:
                merged.subsets.add().CopyFrom(subset)
                names.add(subset.name)
        if not merged.HasField("traffic_policy") and s.HasField("traffic_policy"):
            merged.traffic_policy.CopyFrom(s.traffic_policy)
    return MergedDestinationRule(spec(first).host, first.namespace, merged, tuple(r.key for r in rules))
