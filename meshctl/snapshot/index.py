"""Lookups every proxy's generation makes, computed once per snapshot.

Without them, generating one proxy's config on a mesh of a thousand services scanned every
DestinationRule for every service and every known host for every short name: seconds per proxy.
The index resolves each rule's hosts once, files DestinationRules under their exact hosts (a
wildcard rule is kept apart and matched on demand), and remembers `exportTo` as a set.

Each snapshot's index starts from the one before: what it carries over, and when, is decided
here. What it computes lives apart as pure functions: what of a proxy generation can read
(`snapshot/proxy_inputs.py`), which hosts differ between two service models
(`snapshot/model_changes.py`), endpoints by address (`snapshot/addresses.py`) and
WorkloadEntries by address (`snapshot/entries.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from meshctl.config.hosts import host_matches, is_short_name
from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, ConfigKey
from meshctl.config.references import is_exported
from meshctl.registry.model import Endpoint, Service, ServiceModel, TrafficDistribution, patched_hosts
from meshctl.snapshot import model_changes, proxy_inputs
from meshctl.snapshot.addresses import ByAddress, endpoints_by_address
from meshctl.snapshot.entries import EntriesByAddress
from meshctl.snapshot.loopback import allocate_services, wants_loopback
from meshctl.snapshot.model_changes import touch_none
from meshctl.snapshot.proxy_inputs import DNS_RESOLUTIONS, LabelSelector

T = TypeVar("T")


def _spec(config: Config) -> Any:
    return config.spec


def _prefers_close(service: Service) -> bool:
    return service.traffic_distribution is not TrafficDistribution.ANY


def _is_dns_or_loopback(service: Service) -> bool:
    return service.resolution in DNS_RESOLUTIONS or wants_loopback(service)


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
        self._by_address: ByAddress | None = None
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
        moved = model_changes.hosts_moved(previous._services, services) if previous is not None else None
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
            previous._services is services or touch_none(previous._services, services, _is_dns_or_loopback)
        ):
            # The same services, or a patch that touched none resolved by DNS or given an address.
            self._dns = previous._dns
            if previous._mesh.loopback_range == mesh.loopback_range:
                self._loopback = previous._loopback
        same_locality = previous is not None and previous._mesh.locality_lb_setting == mesh.locality_lb_setting
        if (
            previous is not None
            and (previous._services is services or touch_none(previous._services, services, _prefers_close))
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
        """The selectors generation tests a proxy's labels against (`proxy_inputs.label_selectors`)."""
        if self._selectors is None:
            self._selectors = proxy_inputs.label_selectors(self._by_kind)
        return self._selectors

    def policy_selectors(self) -> tuple[LabelSelector, ...]:
        """The selectors of the policies a gateway enforces (`proxy_inputs.policy_selectors`)."""
        if self._policy_selectors is None:
            self._policy_selectors = proxy_inputs.policy_selectors(self._by_kind)
        return self._policy_selectors

    @property
    def has_dns_services(self) -> bool:
        """Whether a proxy's locality can shape its outbound config (`proxy_inputs.has_dns_services`)."""
        if self._dns is None:
            self._dns = proxy_inputs.has_dns_services(self._services.services.values())
        return self._dns

    @property
    def has_label_failover(self) -> bool:
        """Whether a proxy's labels and network can shape its EDS (`proxy_inputs.has_label_failover`)."""
        if self._label_failover is None:
            self._label_failover = proxy_inputs.has_label_failover(
                self._mesh, self._services.services.values(), self._by_kind.get("DestinationRule", ())
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
        result = model_changes.changed_hosts(before, self._services, before_loopback, self.loopback)
        self._changed[id(before)] = (before, result)
        return result

    def endpoints_changed(self, before: ServiceModel) -> frozenset[str]:
        """The hosts whose service or endpoints differ here from `before`: what a load
        assignment reads of the registry (`AssignmentView`). Computed once per model before."""
        found = self._endpoints_changed.get(id(before))
        if found is not None and found[0] is before:
            return found[1]
        result = model_changes.endpoints_changed(before, self._services)
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
            previous = self._previous
            if previous is None or previous._by_address is None:
                self._by_address = endpoints_by_address(self._services)
            else:
                self._by_address = endpoints_by_address(self._services, previous._services, previous._by_address)
            self._previous = None  # taken over what it could; not kept alive any longer
        return self._by_address.get(address, [])


def _hostname(service: Service) -> str:
    return service.hostname
