"""The ClusterLoadAssignments every proxy is sent, built once and shared (`ResourceCache`).

An assignment is built once per `AssignmentView` (its service port, the service's endpoints by
digest, the subset's labels: everything `build_assignment` reads), and per locality view for
the proxies a locality rule or a failoverPriority rewrites it for; every proxy with the cluster
shares it, so an endpoint change rebuilds only its service's, and a config change only those it
touches. The set of one list of clusters is kept while their services and endpoints are (and
the subsets' labels), so an endpoint change looks again only at the sets that name its service,
and those make that service's assignments alone, the others taken from the set they replace.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from meshctl.server.cache_parts import Recent, TracedEds, kept_entry, rules_digest
from meshctl.snapshot.model import Snapshot
from meshctl.xds import types
from meshctl.xds.eds_locality import LocalityView, build_variant
from meshctl.xds.endpoints import AssignmentView, assignment_view, build_assignment
from meshctl.xds.generate import ASSIGNMENT_KINDS, TRACED_KINDS
from meshctl.xds.names import parse_cluster_name
from meshctl.xds.resources import Resource, ResourceSet, to_resource


class Assignments:
    """Assignments by cluster and EDS sets by list of clusters; safe to call from several
    threads (under the lock it is given, the cache's)."""

    def __init__(
        self,
        lock: threading.Lock,
        make_set: Callable[..., ResourceSet],
        intern: Callable[[str, Resource], Resource],
        keep_versions: int,
    ) -> None:
        self._lock = lock
        #: the cache's interned set of resources, and its interning of one (under the lock)
        self._make_set = make_set
        self._intern = intern
        #: cluster -> (the assignment's view, resource)
        self._by_cluster: dict[str, tuple[AssignmentView, Resource]] = {}
        #: (cluster, locality view) -> (view, resource): the variants of proxies a locality rule
        #: or a failoverPriority rewrites for, one per distinct view (`eds_locality`)
        self._variants: dict[tuple[str, LocalityView], tuple[AssignmentView, Resource]] = {}
        #: the EDS set of each distinct list of EDS clusters (and locality views), per mesh
        #: settings, checked against what assignments read (its clusters' services and
        #: endpoints; DestinationRules through the subsets' labels), and as found for each
        #: snapshot version
        self._sets: Recent[tuple[object, ...], TracedEds] = Recent(keep_versions)
        #: ... by the identity of the list of clusters (each config's list, shared by the keys
        #: of a scope; held by the entry, so its id is not reused): every proxy asks for its set
        #: at each snapshot version, and hashing a thousand names each time cost more than
        #: the rest of the lookup at 10,000 services
        self._now: Recent[object, tuple[tuple[str, ...], ResourceSet]] = Recent(keep_versions)
        #: the last EDS set made without locality views, by the version it was made at
        self._last: dict[str, TracedEds] = {}
        #: Assignments built, and EDS sets made, for the tests and benchmarks.
        self.builds = 0
        self.set_builds = 0
        #: the assignments those sets looked up or built (the rest taken from the last set made)
        self.set_members_made = 0

    def forget(self, kept: set[str]) -> None:
        """Drop the assignments of clusters not in `kept` (those of the outbound parts kept):
        they would otherwise stay forever. Called with the lock held."""
        self._by_cluster = {c: e for c, e in self._by_cluster.items() if c in kept}
        self._variants = {k: e for k, e in self._variants.items() if k[0] in kept}

    def eds_set(
        self, snapshot: Snapshot, names: tuple[str, ...], views: Mapping[str, LocalityView] | None = None
    ) -> ResourceSet:
        """The assignments of `names` at this snapshot: one set for every proxy with those
        clusters (and, where locality rules apply, the same locality views)."""
        located = tuple(sorted(views.items())) if views else ()
        held: object = (id(names), located) if views else id(names)
        with self._lock:
            now = self._now.get(snapshot.version, held)
        if now is not None and now[0] is names:
            return now[1]
        key: tuple[object, ...] = (names, located) if views else names
        # Kept across DestinationRule changes that leave every subset's labels as they were, and
        # across service changes that leave its clusters' services and endpoints as they were.
        version = snapshot.version_of(ASSIGNMENT_KINDS - TRACED_KINDS, services=False)
        with self._lock:
            found = self._sets.get(version, key)
        kept = kept_entry(self._sets, self._lock, version, key, found, found_at=lambda entry: entry.found_at(snapshot))
        if kept is not None:
            eds = kept.eds
        else:
            # The set this list of clusters had (an endpoint change on one of its services), or
            # for a list one service longer or shorter, the last one made (a service added where
            # a sidecar sees it), gives the other clusters' assignments where they read the same
            # (`TracedEds.reusable`, host by host): an endpoint added makes its own service's
            # assignments alone, as the removal that takes it back finds its set kept.
            last = found if found is not None else self._last.get(version) if not views else None
            reused = last.reusable(snapshot) if last is not None else {}
            views = views or {}
            made = [self._assignment(snapshot, name, views.get(name)) for name in names if name not in reused]
            # The reused assignments are the interned ones of the set they come from: only the
            # ones made are interned (a thousand lookups a set at 10,000 services otherwise).
            with self._lock:
                resources = [self._intern(types.ENDPOINT, resource) for resource, _ in made]
            resources += (reused[name] for name in names if name in reused)
            eds = self._make_set(types.ENDPOINT, resources, interned=True)
            subsets = tuple(
                (parsed.host, parsed.subset, view.subset_labels)
                for _, view in made
                if view.port is not None and (parsed := parse_cluster_name(view.cluster_name)) and parsed.subset
            )
            if found is not None and last is found:
                # The same names: the same hosts, and the subsets of the hosts not made again.
                if found.subsets and reused:
                    remade = {view.cluster_name.rpartition("|")[2] for _, view in made}
                    subsets += tuple(s for s in found.subsets if s[0] not in remade)
                hosts = found.hosts
            else:
                if last is not None and last.subsets and reused:
                    subset_hosts = {(p.host, p.subset) for n in names if n in reused and (p := parse_cluster_name(n))}
                    subsets += tuple(s for s in last.subsets if (s[0], s[1]) in subset_hosts)
                hosts = frozenset(parsed.host for name in names if (parsed := parse_cluster_name(name)))
            traced = TracedEds(eds, subsets, rules_digest(snapshot), snapshot.services, hosts)
            traced = found.replaced_by(traced) if found is not None else traced
            with self._lock:
                self.set_builds += 1
                self.set_members_made += len(made)
                self._sets.put(version, key, traced)
                if not views:
                    self._last = {version: traced}
        with self._lock:
            self._now.put(snapshot.version, held, (names, eds))
        return eds

    def _assignment(
        self, snapshot: Snapshot, cluster: str, locality: LocalityView | None = None
    ) -> tuple[Resource, AssignmentView]:
        """The assignment of `cluster`, built once per `AssignmentView` (and locality view):
        the view holds everything `build_assignment` reads, so a config change that touches
        none of it (most do not) reuses the assignment as it was."""
        view = assignment_view(snapshot, cluster)
        with self._lock:
            found = self._by_cluster.get(cluster) if locality is None else self._variants.get((cluster, locality))
        if found is not None and found[0] == view:
            return found[1], view
        assignment = build_assignment(view) if locality is None else build_variant(view, locality)
        resource = to_resource(assignment, types.ENDPOINT)
        with self._lock:
            self.builds += 1
            if locality is None:
                self._by_cluster[cluster] = (view, resource)
            else:
                self._variants[(cluster, locality)] = (view, resource)
        return resource, view
