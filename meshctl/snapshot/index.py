"""Lookups every proxy's generation makes, computed once per snapshot.

Without them, generating one proxy's config on a mesh of a thousand services scanned every
DestinationRule for every service and every known host for every short name: seconds per proxy.
The index resolves each rule's hosts once, files DestinationRules under their exact hosts (a
wildcard rule is kept apart and matched on demand), and remembers `exportTo` as a set.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from meshctl.config.hosts import host_matches, is_short_name
from meshctl.config.labels import selector_labels
from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, ConfigKey
from meshctl.config.references import is_exported
from meshctl.registry.model import (
    Endpoint,
    Resolution,
    Service,
    ServiceModel,
    TrafficDistribution,
    patched_hosts,
)
from meshctl.snapshot.entries import EntriesByAddress
from meshctl.snapshot.loopback import allocate_services, wants_loopback

T = TypeVar("T")

#: A label selector as sorted (key, value) pairs: hashable, so it can be part of a cache key.
LabelSelector = tuple[tuple[str, str], ...]


_DNS = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})
#: Past this many changed services, the lookup by address is built anew rather than updated.
_INCREMENTAL_HOSTS = 64


def _spec(config: Config) -> Any:
    return config.spec


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


def _prefers_close(service: Service) -> bool:
    return service.traffic_distribution is not TrafficDistribution.ANY


def _is_dns_or_loopback(service: Service) -> bool:
    return service.resolution in _DNS or wants_loopback(service)


def _touch_none(before: ServiceModel, after: ServiceModel, test: Callable[[Service], bool]) -> bool:
    """Whether `after` is known to be patched from `before` on hosts none of whose services,
    before or after, passes `test` (what depends on those services alone is then the same)."""
    touched = patched_hosts(before, after)
    if touched is None:
        return False
    for host in touched:
        for service in (before.services.get(host), after.services.get(host)):
            if service is not None and test(service):
                return False
    return True


def _short_key(host: str) -> tuple[str, str] | None:
    """The (short name, namespace) under which `name.namespace.rest` is found."""
    parts = host.split(".", 2)
    return (parts[0], parts[1]) if len(parts) >= 3 else None


def _short_names_updated(
    short: dict[tuple[str, str], list[str]], moved: Iterable[str], services: ServiceModel
) -> dict[tuple[str, str], list[str]]:
    """A copy of the short-name lookup with the hosts `moved` (added or removed) in or out,
    each list in host order as a build from scratch makes it."""
    out = defaultdict(list, short)
    for host in moved:
        key = _short_key(host)
        if key is None:
            continue
        hosts = [h for h in out.get(key, ()) if h != host]
        if host in services.services:
            hosts = sorted([*hosts, host])
        if hosts:
            out[key] = hosts
        else:
            out.pop(key, None)
    return out


class SnapshotIndex:
    """Host resolution and DestinationRule/VirtualService lookups for one snapshot."""

    def __init__(
        self,
        by_kind: Mapping[str, tuple[Config, ...]],
        services: ServiceModel,
        mesh: MeshSettings | None = None,
        previous: SnapshotIndex | None = None,
        changed: frozenset[ConfigKey] | None = None,
    ) -> None:
        """With `previous` (the index of the snapshot before), each lookup whose inputs are the
        very same objects there (the same kind's tuple, the same service model) is taken over
        instead of built again: a change pays only for the lookups it touches. With `changed`
        (the config keys changed since `previous`), WorkloadEntries are looked up by address
        from the previous table, updated for those keys alone."""
        mesh = mesh or MeshSettings()
        #: What a VirtualService or DestinationRule without exportTo is exported to (MeshConfig).
        self._export_defaults = {
            "VirtualService": mesh.default_virtual_service_export_to,
            "DestinationRule": mesh.default_destination_rule_export_to,
        }
        self._services = services
        self._by_kind = by_kind
        self._mesh = mesh
        self._selectors: tuple[LabelSelector, ...] | None = None
        self._policy_selectors: tuple[LabelSelector, ...] | None = None
        self._dns: bool | None = None
        self._label_failover: bool | None = None
        self._loopback: Mapping[str, str] | None = None
        self._by_address: dict[str, list[tuple[Service, Endpoint]]] | None = None
        self._previous = previous

        def same(*kinds: str) -> bool:
            return previous is not None and all(previous._by_kind.get(k) is by_kind.get(k) for k in kinds)

        if previous is not None and same("WorkloadEntry"):
            self._entries: EntriesByAddress = previous._entries
        elif previous is not None and changed is not None:
            entries = {c.key: c for c in by_kind.get("WorkloadEntry", ()) if c.key in changed}
            self._entries = previous._entries.updated({k for k in changed if k.kind == "WorkloadEntry"}, entries)
        else:
            self._entries = EntriesByAddress.of(by_kind.get("WorkloadEntry", ()))
        #: (short name, namespace) -> the hosts it stands for
        self._short: dict[tuple[str, str], list[str]]
        #: the short names the rules' hosts were resolved through: what `_index_rules` read of `_short`
        self._short_asked: set[tuple[str, str]] = set()
        moved = self._hosts_moved(previous, services)
        if previous is not None and moved is not None:
            self._short = previous._short if not moved else _short_names_updated(previous._short, moved, services)
        else:
            self._short = defaultdict(list)
            for host in sorted(services.services):
                if (short := _short_key(host)) is not None:
                    self._short[short].append(host)
        if (
            previous is not None
            and moved is not None
            and same("VirtualService", "DestinationRule")
            and previous._mesh == mesh
            and not any(_short_key(host) in previous._short_asked for host in moved)
        ):
            # Rules resolve hosts through short names only: hosts come and go under others.
            self.export: dict[ConfigKey, frozenset[str]] = previous.export
            self.hosts: dict[ConfigKey, tuple[str, ...]] = previous.hosts
            self._dr_exact: dict[str, dict[str, list[Config]]] = previous._dr_exact
            self._dr_wild: dict[str, list[Config]] = previous._dr_wild
            self._short_asked = previous._short_asked
        else:
            self._index_rules(by_kind)
        #: `short_hosts`, carried with the rules' resolved hosts it is made from
        self._short_hosts: frozenset[tuple[str, str]] | None = None
        if previous is not None and previous.hosts is self.hosts:
            self._short_hosts = previous._short_hosts
        #: `changed_hosts` by the id of the model before (held, so the id stays its own)
        self._changed: dict[int, tuple[ServiceModel, frozenset[str]]] = {}
        self._endpoints_changed: dict[int, tuple[ServiceModel, frozenset[str]]] = {}
        if previous is not None and same("Sidecar", "DestinationRule", "Gateway", "VirtualService"):
            self._selectors = previous._selectors
        if previous is not None and same("AuthorizationPolicy", "RequestAuthentication"):
            self._policy_selectors = previous._policy_selectors
        if previous is not None and (
            previous._services is services or _touch_none(previous._services, services, _is_dns_or_loopback)
        ):
            # The same services, or a patch that touched none resolved by DNS or given an address.
            self._dns = previous._dns
            if previous._mesh.loopback_range == mesh.loopback_range:
                self._loopback = previous._loopback
        same_locality = previous is not None and previous._mesh.locality_lb_setting == mesh.locality_lb_setting
        if (
            previous is not None
            and (previous._services is services or _touch_none(previous._services, services, _prefers_close))
            and same("DestinationRule")
            and same_locality
        ):
            self._label_failover = previous._label_failover
        #: What scopes computed from the index's inputs alone, by their arguments (see `scoped`).
        self._scoped: dict[tuple[str, Hashable], Any] = {}
        # The generation thread may still be filling the previous index's answers while this one
        # is built: read them from one copy (made in C, whole) rather than iterating the live dict.
        prior: dict[tuple[str, Hashable], Any] = previous._scoped.copy() if previous is not None else {}
        # What a scope sees of a VirtualService reads it, its exportTo and its resolved hosts (the
        # rules' index) and the mesh: with that index kept, so are the scopes' answers.
        same_index = previous is not None and self.hosts is previous.hosts
        if previous is not None and previous._mesh == mesh:
            same_services = previous._services is services
            same_routes = same("VirtualService") and (same_services or same_index)
            # Which DestinationRule applies to a host reads the rules and the services.
            same_rules = same("DestinationRule") and same_services
            self._scoped = {
                k: v
                for k, v in prior.items()
                if (k[0] == "services" and same_services)
                or (k[0] == "virtual_services" and same_routes)
                or (k[0] == "destination_rules" and same_rules)
            }
            touched = patched_hosts(previous._services, services) if not same_services else None
            if same("DestinationRule") and self._dr_exact is previous._dr_exact and touched is not None:
                # A model patched from that one, the rules' index the same: a host's rule reads
                # its own service (its namespace) beside them, so every other host's stands.
                for k, v in prior.items():
                    if k[0] == "destination_rules":
                        rules = dict(v)
                        for host in touched:
                            rules.pop(host, None)
                        self._scoped[k] = rules
        #: After a change of VirtualServices alone (the same services, the same mesh): each
        #: VirtualService of the snapshot before by key, and the scopes' VirtualServices there,
        #: so a scope looks again at the changed ones only (`scoped_virtual_services`)
        self._routes_before: tuple[dict[ConfigKey, Config], dict[Hashable, tuple[Config, ...]]] | None = None
        if previous is not None and previous._mesh == mesh and (previous._services is services or same_index):
            before = {k[1]: v for k, v in prior.items() if k[0] == "virtual_services"}
            if before and not same("VirtualService"):
                self._routes_before = ({c.key: c for c in previous._by_kind.get("VirtualService", ())}, before)
            elif not before:  # no scope asked there (its config was generated already): the answers before it
                self._routes_before = previous._routes_before
        #: After a change of the services (the same mesh): the services before by host, and the
        #: scopes' services there, so a scope tests only the new or changed ones (`scoped_services`)
        self._services_before: tuple[ServiceModel, dict[Hashable, tuple[Service, ...]]] | None = None
        if previous is not None and previous._mesh == mesh:
            seen = {k[1]: v for k, v in prior.items() if k[0] == "services"}
            # No scope asked there (its config was generated already): the answers before it.
            self._services_before = (previous._services, seen) if seen else previous._services_before
        #: VirtualServices and services scopes tested for visibility (`scoped_virtual_services`,
        #: `scoped_services`): for the tests
        self.visibility_tests = 0
        #: hostnames `scoped_services` went through: the mesh's on a pass, the changed ones after
        #: a patch of the model (for the tests)
        self.hosts_walked = 0

    @staticmethod
    def _hosts_moved(previous: SnapshotIndex | None, services: ServiceModel) -> set[str] | None:
        """The hostnames added or removed since `previous`, when few are known to be (the model
        patched from the one before, or the same hostnames); None: build the name lookups anew."""
        if previous is None:
            return None
        before = previous._services
        if before is services:
            return set()
        touched = patched_hosts(before, services)
        if touched is None:
            return set() if before.services.keys() == services.services.keys() else None
        if len(touched) > _INCREMENTAL_HOSTS:
            return None
        return {host for host in touched if (host in before.services) != (host in services.services)}

    def _index_rules(self, by_kind: Mapping[str, tuple[Config, ...]]) -> None:
        self.export = {}
        self.hosts = {}
        #: namespace -> exact host -> rules; namespace -> rules with a wildcard host
        self._dr_exact = defaultdict(lambda: defaultdict(list))
        self._dr_wild = defaultdict(list)
        for kind in ("VirtualService", "DestinationRule"):
            for config in by_kind.get(kind, ()):
                spec = _spec(config)
                self.export[config.key] = frozenset(spec.export_to) or self._export_defaults[kind]
                raw = spec.hosts if kind == "VirtualService" else [spec.host]
                resolved: list[str] = []
                for host in raw:
                    if is_short_name(host):
                        self._short_asked.add((host, config.namespace))
                    for h in self.resolve(host, config.namespace):
                        if h not in resolved:
                            resolved.append(h)
                self.hosts[config.key] = tuple(resolved)
                if kind == "DestinationRule":
                    for h in resolved:
                        if h.startswith("*"):
                            self._dr_wild[config.namespace].append(config)
                        else:
                            self._dr_exact[config.namespace][h].append(config)

    def scoped(self, table: str, key: Hashable, make: Callable[[], T]) -> T:
        """`make()`, remembered under `key` for this snapshot and the ones after it while their
        inputs are the same objects: `services` (the services a namespace and egress hosts see:
        the service model), `virtual_services` (the VirtualServices they see: those and the
        model) and `destination_rules` (the rule of each host a namespace and labels asked for:
        the DestinationRules and the model). Proxies of one scope share one computation, and a change elsewhere none."""
        found = self._scoped.get((table, key))
        if found is None:
            found = self._scoped[(table, key)] = make()
        return found

    def scoped_services(self, key: Hashable, visible: Callable[[Service], bool]) -> tuple[Service, ...]:
        """The services for which `visible` holds, by hostname, remembered as `scoped` remembers
        them. After a change of the services, a scope's answer before it stands for every
        service that is the same object as then (the registry keeps an unchanged service's
        object): only new or changed services are tested (what a scope sees of one depends on
        it, the mesh and `key` alone). A ServiceEntry no scope imports then costs each scope a
        pass over the hostnames, not a test of every service against its egress hosts."""
        found: tuple[Service, ...] | None = self._scoped.get(("services", key))
        if found is not None:
            return found
        model = self._services.services
        before = self._services_before[1].get(key) if self._services_before is not None else None
        touched = patched_hosts(self._services_before[0], self._services) if self._services_before else None
        if before is None or self._services_before is None:
            self.visibility_tests += len(model)
            self.hosts_walked += len(model)
            found = tuple(svc for host in sorted(model) if visible(svc := model[host]))
        elif touched is not None:
            # A model patched from that one (`patched_hosts`): every other host's service is the
            # object it was, so the answer before stands but for the hosts the patches touched.
            fresh = [model[host] for host in sorted(touched) if host in model]
            self.hosts_walked += len(touched)
            self.visibility_tests += len(fresh)
            shown = [svc for svc in fresh if visible(svc)]
            kept = [svc for svc in before if svc.hostname not in touched]
            found = tuple(sorted([*kept, *shown], key=_hostname)) if shown else tuple(kept)
        else:
            was = self._services_before[0].services
            seen = {svc.hostname for svc in before}
            self.hosts_walked += len(model)
            out = []
            for host in sorted(model):
                svc = model[host]
                if was.get(host) is svc:
                    if host in seen:
                        out.append(svc)
                    continue
                self.visibility_tests += 1
                if visible(svc):
                    out.append(svc)
            found = tuple(out)
        self._scoped[("services", key)] = found
        return found

    def scoped_virtual_services(self, key: Hashable, visible: Callable[[Config], bool]) -> tuple[Config, ...]:
        """The VirtualServices for which `visible` holds, in the snapshot's order, remembered as
        `scoped` remembers them. After a change of VirtualServices alone, a scope's answer before
        it stands for every VirtualService that is the same object as then: only those that
        changed or came are tested (what a scope sees of one depends on it, the services and the
        mesh alone, all of them part of `key` or the same)."""
        found: tuple[Config, ...] | None = self._scoped.get(("virtual_services", key))
        if found is not None:
            return found
        current = self._by_kind.get("VirtualService", ())
        before = self._routes_before[1].get(key) if self._routes_before is not None else None
        if before is None or self._routes_before is None:
            self.visibility_tests += len(current)
            found = tuple(vs for vs in current if visible(vs))
        else:
            was = self._routes_before[0]
            seen = {vs.key for vs in before}
            fresh = [vs for vs in current if was.get(vs.key) is not vs]
            self.visibility_tests += len(fresh)
            shown = {vs.key for vs in fresh if visible(vs)}
            found = tuple(vs for vs in current if (vs.key in shown if was.get(vs.key) is not vs else vs.key in seen))
        self._scoped[("virtual_services", key)] = found
        return found

    def resolve(self, host: str, namespace: str) -> list[str]:
        """What `host`, written in `namespace`, stands for (see `meshctl.config.hosts.resolve_host`)."""
        if not is_short_name(host):
            return [host]
        return [host, *self._short.get((host, namespace), ())]

    def exported_to(self, config: Config, namespace: str) -> bool:
        """Istio's `exportTo`: empty or `*` is public, `.` the config's own namespace, else the
        listed namespaces."""
        export = self.export.get(config.key)
        if export is None:
            export = frozenset(_spec(config).export_to) or self._export_defaults.get(config.kind, frozenset())
        return is_exported(export, config.namespace, namespace)

    def destination_rules(self, namespace: str, hostname: str) -> list[tuple[Config, str]]:
        """Rules of `namespace` whose host covers `hostname`, each with the most specific of its
        hosts that does (exact, else the longest wildcard)."""
        out: list[tuple[Config, str]] = [(c, hostname) for c in self._dr_exact.get(namespace, {}).get(hostname, ())]
        seen = {c.key for c, _ in out}
        for config in self._dr_wild.get(namespace, ()):
            if config.key in seen:
                continue
            best = None
            for h in self.hosts[config.key]:
                if host_matches(h, hostname) and (best is None or len(h) > len(best)):
                    best = h
            if best is not None:
                seen.add(config.key)
                out.append((config, best))
        return out

    def namespaces_with_rules(self) -> Iterable[str]:
        return set(self._dr_exact) | set(self._dr_wild)

    def workload_entry_at(self, namespace: str, address: str) -> Config | None:
        """The first WorkloadEntry (by name) of `namespace` with `address`."""
        return self._entries.first.get((namespace, address))

    def label_selectors(self) -> tuple[LabelSelector, ...]:
        """Every distinct non-empty label selector that generation tests a proxy's labels
        against: Sidecar and DestinationRule workload selectors, Gateway selectors and the
        `sourceLabels` of VirtualService matches. A proxy's labels reach its outbound config only
        through these tests, so proxies that match the same selectors share that config
        (`OutboundProxy`) whatever their other labels."""
        if self._selectors is None:
            found: dict[LabelSelector, None] = {}

            def add(labels: Mapping[str, str]) -> None:
                if labels:
                    found.setdefault(tuple(sorted(labels.items())), None)

            for config in self._by_kind.get("Sidecar", ()):
                add(selector_labels(_spec(config)))
            for config in self._by_kind.get("DestinationRule", ()):
                add(selector_labels(_spec(config)))
            for config in self._by_kind.get("Gateway", ()):
                add(_spec(config).selector)
            for config in self._by_kind.get("VirtualService", ()):
                spec = _spec(config)
                for route in (*spec.http, *spec.tcp, *spec.tls):
                    for match in route.match:
                        add(match.source_labels)
            self._selectors = tuple(found)
        return self._selectors

    def policy_selectors(self) -> tuple[LabelSelector, ...]:
        """The label selectors of AuthorizationPolicies and RequestAuthentications: a gateway
        enforces those that select it in its listeners, so they are part of its outbound key
        (a sidecar's are inbound config, keyed by its inbound view)."""
        if self._policy_selectors is None:
            found: dict[LabelSelector, None] = {}
            for kind in ("AuthorizationPolicy", "RequestAuthentication"):
                for config in self._by_kind.get(kind, ()):
                    body = _spec(config)
                    if body.HasField("selector") and body.selector.match_labels:
                        found.setdefault(tuple(sorted(body.selector.match_labels.items())), None)
            self._policy_selectors = tuple(found)
        return self._policy_selectors

    @property
    def has_dns_services(self) -> bool:
        """Whether any service resolves by DNS: only such clusters carry endpoints in CDS, the
        one place a proxy's own locality shapes its outbound config (locality priorities)."""
        if self._dns is None:
            self._dns = any(s.resolution in _DNS for s in self._services.services.values())
        return self._dns

    @property
    def has_label_failover(self) -> bool:
        """Whether anything asks for failover by labels (a `failoverPriority` in a
        DestinationRule or the mesh's locality setting, a service's traffic distribution): only
        then does a proxy's EDS depend on its labels and network, not just its locality."""
        if self._label_failover is None:
            self._label_failover = (
                bool(self._mesh.locality_default().failover_priority)
                or any(s.traffic_distribution is not TrafficDistribution.ANY for s in self._services.services.values())
                or any(_names_failover_priority(_spec(c)) for c in self._by_kind.get("DestinationRule", ()))
            )
        return self._label_failover

    @property
    def loopback(self) -> Mapping[str, str]:
        """host -> its own loopback address, for the TCP-level services of the mesh: allocated
        once per snapshot from every service host (`snapshot/loopback.py`), so every proxy and
        every replica sees the same address for a host."""
        if self._loopback is None:
            self._loopback = allocate_services(self._services.services.values(), self._mesh.loopback_range)
        return self._loopback

    def changed_hosts(self, before: ServiceModel, before_loopback: Mapping[str, str]) -> frozenset[str]:
        """The hosts whose part of the registry generation may read differently here than in
        `before` (whose loopback allocation was `before_loopback`): the service itself (came,
        went or changed), its endpoints where its clusters or listeners carry them (resolution
        not STATIC), its workloads' identities, its loopback address. What `registry_digest`
        hashes for the whole mesh, host by host: what an outbound part checks its services
        against (`TracedPart`). Computed once per model before."""
        found = self._changed.get(id(before))
        if found is not None and found[0] is before:
            return found[1]
        now = self._services
        was, cur = before.services, now.services
        out: set[str] = set()
        if before is not now:
            # A model patched from `before` names the only hosts that may differ.
            patched = patched_hosts(before, now)
            for host in patched if patched is not None else was.keys() | cur.keys():
                a, b = was.get(host), cur.get(host)
                if a is not b and a != b:
                    out.add(host)
                    continue
                if b is None:
                    continue
                ea, eb = before.endpoints.get(host, ()), now.endpoints.get(host, ())
                if ea is eb:
                    continue
                carried = b.resolution is not Resolution.STATIC  # its endpoints are in CDS or LDS
                if (carried and ea != eb) or before.identities(host) != now.identities(host):
                    out.add(host)
        loopback = self.loopback
        if loopback is not before_loopback:
            out.update(h for h in before_loopback.keys() | loopback.keys() if before_loopback.get(h) != loopback.get(h))
        result = frozenset(out)
        self._changed[id(before)] = (before, result)
        return result

    def endpoints_changed(self, before: ServiceModel) -> frozenset[str]:
        """The hosts whose service or endpoints differ here from `before`: what a load
        assignment reads of the registry (`AssignmentView`). Computed once per model before."""
        found = self._endpoints_changed.get(id(before))
        if found is not None and found[0] is before:
            return found[1]
        now = self._services
        out: set[str] = set()
        if before is not now:
            was, cur = before.services, now.services
            patched = patched_hosts(before, now)
            for host in patched if patched is not None else was.keys() | cur.keys():
                a, b = was.get(host), cur.get(host)
                ea, eb = before.endpoints.get(host, ()), now.endpoints.get(host, ())
                if (a is not b and a != b) or (ea is not eb and ea != eb):
                    out.add(host)
        result = frozenset(out)
        self._endpoints_changed[id(before)] = (before, result)
        return result

    def short_hosts(self) -> frozenset[tuple[str, str]]:
        """(short name, namespace) of every short host a VirtualService or DestinationRule names
        as its host: the names whose resolution (`resolve`) decides which VirtualServices a scope
        sees and which services a rule is for. A host `a.b.rest` added or removed changes only
        the resolution of (`a`, `b`)."""
        if self._short_hosts is None:
            self._short_hosts = frozenset(
                (h, key.namespace) for key, hosts in self.hosts.items() for h in hosts if is_short_name(h)
            )
        return self._short_hosts

    def endpoints_at(self, address: str) -> list[tuple[Service, Endpoint]]:
        """Every (service, endpoint) whose endpoint has `address`, by service hostname: how a
        proxy finds the services its workload serves without scanning every endpoint."""
        if self._by_address is None:
            self._by_address = self._addresses()
            self._previous = None  # taken over what it could; not kept alive any longer
        return self._by_address.get(address, [])

    def _addresses(self) -> dict[str, list[tuple[Service, Endpoint]]]:
        """The lookup by address; from the previous index's, where only some services changed
        (an endpoint added or removed), by redoing the addresses of those services alone."""
        model = self._services
        previous = self._previous
        old = previous._by_address if previous is not None else None
        if previous is None or old is None:
            by_address: dict[str, list[tuple[Service, Endpoint]]] = defaultdict(list)
            for host in sorted(model.services):
                for ep in model.endpoints_of(host):
                    by_address[ep.address].append((model.services[host], ep))
            return by_address
        before = previous._services
        changed = {
            host
            for host in patched_hosts(before, model) or before.services.keys() | model.services.keys()
            if before.services.get(host) is not model.services.get(host)
            or before.endpoints.get(host) is not model.endpoints.get(host)
        }
        if not changed:
            return old
        if len(changed) > _INCREMENTAL_HOSTS:
            self._previous = None
            return self._addresses()
        touched = {ep.address for host in changed for ep in before.endpoints_of(host)}
        touched.update(ep.address for host in changed for ep in model.endpoints_of(host))
        by_address = dict(old)
        for address in touched:
            kept = [(s, ep) for s, ep in old.get(address, ()) if s.hostname not in changed]
            for host in changed:
                service = model.services.get(host)
                if service is not None:
                    kept.extend((service, ep) for ep in model.endpoints_of(host) if ep.address == address)
            kept.sort(key=lambda pair: pair[0].hostname)
            if kept:
                by_address[address] = kept
            else:
                by_address.pop(address, None)
        return by_address


def _hostname(service: Service) -> str:
    return service.hostname
