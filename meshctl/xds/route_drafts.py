"""A sidecar route configuration's last build, kept so the next one costs what changed.

A sidecar's route configuration for a port holds a virtual host for every service it can call
there: a thousand at a namespace of a thousand services. Made whole, each of them asks its
questions again on every change (the VirtualServices' traces, each service's DestinationRule
and default route, the domain plan, the virtual hosts' bytes) though one VirtualService
changed, or one service came. What the build before found is kept here per (OutboundProxy,
port), and the next build takes each piece over where what the piece read is the same:

- a VirtualService's group (its hosts, the services it claims, its translated routes) where
  the VirtualService is the same object and so are the inputs every translation reads beside
  it (`Basis`: the service model, the mesh, the Sidecar), every DestinationRule it asked for is
  the one it was (all of them, where the rules' digest is the same), and every host it claimed
  is still routed by it (`VirtualServiceGroup.claims`: which VirtualService the scope picks for
  a host depends on all of them). The DestinationRules and short names the group asked for are
  noted with it and told to the scope again, so a part's traces are whole
  (`ProxyScope.rule_trace`, `name_trace`);
- a service's default route where the service and the DestinationRule the scope gives for its
  host are the same objects (the registry keeps an unchanged service's object, the snapshot
  index an unchanged rule's);
- the domain plan where the hosts in order are equal;
- a virtual host, and its bytes, where its name, domains, service and routes are the same.

Each of these is a function of exactly what is compared, so a build that takes them over makes
what a build from nothing makes (a property test holds the two to each other over random
sequences of changes). The objects compared by identity are held by the kept build, so their
identities are not reused while it lives.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envoy.config.route.v3 import route_components_pb2 as rc

from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Service
from meshctl.snapshot.scope import ProxyScope, rule_digest
from meshctl.xds.route_plan import DomainPlan, Host

if TYPE_CHECKING:
    from meshctl.snapshot.proxy import OutboundProxy

#: The kinds whose rules a translation asks for through the scope (`generate.TRACED_KINDS`).
_RULE_KINDS = ("DestinationRule",)


@dataclass(frozen=True, slots=True, eq=False)
class Basis:
    """What every VirtualService translation and claim of one scope reads beside the
    VirtualService itself: the service model (services, short names), the mesh and the Sidecar
    that applies; and the DestinationRules' digest, where the same, spares asking again for
    the rules a group asked for."""

    model: object
    rules: tuple[bytes | None, ...]
    mesh: object
    sidecar: Config | None

    @staticmethod
    def of(scope: ProxyScope) -> Basis:
        snapshot = scope.snapshot
        rules = tuple(snapshot.kind_digests.get(kind) for kind in _RULE_KINDS)
        return Basis(snapshot.services, rules, snapshot.mesh, scope.sidecar)

    def same(self, other: Basis) -> bool:
        """The same model, mesh and Sidecar (the rules are checked apart: `same_rules`)."""
        return (
            self.model is other.model
            and (self.mesh is other.mesh or self.mesh == other.mesh)
            and self.sidecar is other.sidecar
        )

    def same_rules(self, other: Basis) -> bool:
        return self.rules == other.rules


@dataclass(frozen=True, slots=True, eq=False)
class VirtualServiceGroup:
    """What one VirtualService made of a route configuration: its routes and the hosts they
    serve (None: it serves nothing here), with what it asked of the scope."""

    vs: Config
    #: (routes, services claimed, hosts naming no service), or None
    group: tuple[tuple[rc.Route, ...], tuple[Service, ...], tuple[str, ...]] | None
    #: (service host, key of the VirtualService the scope picked for it), as asked
    claims: tuple[tuple[str, ConfigKey | None], ...]
    #: the DestinationRules (host -> digest) and short names (name, namespace) it asked for
    rules: Mapping[str, object]
    names: frozenset[tuple[str, str]]
    #: whether it delegates: its routes then read other VirtualServices, and it is made anew
    delegates: bool
    #: the route memo's entries its routes came from (`RouteMemo.kept`)
    translations: tuple[Any, ...] = ()

    def holds(self, scope: ProxyScope) -> bool:
        """Whether the scope still picks, for every host this group claimed or passed over, the
        VirtualService it picked then (the rest is the same by `Basis`)."""
        if self.delegates:
            return False
        for host, key in self.claims:
            chosen = scope.virtual_service_for(host)
            if (chosen.key if chosen is not None else None) != key:
                return False
        return True

    def rules_hold(self, scope: ProxyScope) -> bool:
        """Whether every DestinationRule the group asked for is, in the scope, the one it was."""
        snapshot = scope.snapshot
        return all(rule_digest(snapshot, scope.destination_rule(h)) == d for h, d in self.rules.items())

    def told(self, scope: ProxyScope) -> None:
        """Tell the scope's traces what this group asked, as asking again would."""
        tell(scope, self.rules, self.names)


def tell(scope: ProxyScope, rules: Mapping[str, object], names: Set[tuple[str, str]]) -> None:
    """Note `rules` and `names` in the scope's traces, where it keeps them."""
    if scope.rule_trace is not None:
        for host, digest in rules.items():
            if host not in scope.rule_trace:
                scope.rule_trace[host] = digest
    if scope.name_trace is not None and names:
        scope.name_trace.update(names)


@dataclass(frozen=True, slots=True, eq=False)
class KeptVirtualHost:
    """A virtual host as made: what it was made of, the draft, and its field bytes once known."""

    served: Service | None
    routes: tuple[rc.Route, ...]
    domains: tuple[str, ...]
    draft: Any
    data: list[bytes] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class RouteDraftState:
    """One route configuration's last build, for the next to take over (`route_drafts`)."""

    basis: Basis
    groups: dict[ConfigKey, VirtualServiceGroup]
    #: service host -> (service, its DestinationRule, its default route as a one-tuple)
    defaults: dict[str, tuple[Service, object, tuple[rc.Route, ...]]]
    hosts: tuple[Host, ...]
    plan: DomainPlan | None
    #: virtual host name -> what it was made of
    virtual_hosts: dict[str, KeptVirtualHost]


DraftKey = tuple["OutboundProxy", int, bool]
