"""A sidecar's outbound listeners kept across snapshots, and checked against what they read.

Outbound listeners are made by walking every service a sidecar sees (`listeners_outbound`): at
10,000 services that walk was a fifth of a VirtualService change's generation, though a
VirtualService with HTTP routes alone changes no listener byte: listeners read VirtualServices
only for their `tcp` and `tls` routes. So the walk's product (the listeners and the DNS answers
read off them) is kept per `OutboundProxy` (the memo's key: everything generation may read of
the proxy) and reused for a later scope that reads the same. What a build reads is in two parts:

- what is known before it starts (`ListenerInputs`): the services the scope sees and their
  loopback addresses, the Sidecar that applies, the mesh settings, and the VirtualServices with
  `tcp` or `tls` routes the scope sees, with their hosts as resolved (the only ones whose routes
  a listener can hold; the others are read for their hosts alone, to pick those that apply);
- what it asks as it goes: the DestinationRule of a host (a tcp_proxy's idle timeout and
  hashing), what a route destination's short name names, and the endpoints of a TCP service
  without an address (listeners per endpoint under iptables). The build runs with these
  recorded (a trace) and is reused when each is answered as before.

Nothing else reaches the build: the other reads of the scope (the proxy, its outbound traffic
policy, a destination's service among the scope's) are functions of the key and the inputs. A
reused build replays its trace into the scope's own (`rule_trace`, `name_trace`), so the part
that holds the listeners is checked later against the same reads as one built afresh.

Where only services changed, the build is patched rather than made again when that is sure to
leave every listener as it was: the services that changed (`SnapshotIndex.changed_hosts`) are
walked again as they were and as they are (`listeners_outbound._patch`), and where each is plain
HTTP, without a loopback address, imported by the one catch-all egress listener, and joins or
leaves only listeners that serve HTTP alone and keep another service port, their DNS answers
and the listeners' counts are updated. Such a listener is one HTTP chain naming the port's
route configuration, the same whichever services share it. One ServiceEntry added to a
namespace of thousands then costs its own walk, not the namespace's.

Kept like `GenerationMemo`: what was not asked for during the last two config versions goes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from envoy.config.listener.v3 import listener_pb2

from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Endpoint, Service, ServiceModel
from meshctl.snapshot.model import spec
from meshctl.snapshot.proxy import OutboundProxy
from meshctl.snapshot.scope import ProxyScope, rule_digest

#: host -> where the app reaches it (`listeners_outbound.build_outbound_with_answers`)
Answers = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class Walk:
    """What a build's walk over the services leaves beside its listeners, for a patch."""

    #: (bind, port) -> how many service ports that listener took
    taken: Mapping[tuple[str, int], int]
    #: the listeners that took HTTP service ports alone
    http_only: frozenset[tuple[str, int]]
    #: whether one catch-all egress listener, without a bind, imports the scope as it is
    whole_scope: bool


#: What a build hands back: its listeners, its answers, the endpoints it read by host, its walk.
Built = tuple[list[listener_pb2.Listener], Answers, dict[str, tuple[Endpoint, ...]], Walk]
#: A walk patched for services that changed (as they were, as they are): their answers and the
#: walk after, or None where a whole build must decide.
Patch = Callable[[ProxyScope, Walk, Sequence[Service], Sequence[Service]], tuple[Answers, Walk] | None]


def _config_id(config: Config | None) -> tuple[ConfigKey, str, str] | None:
    return None if config is None else (config.key, config.content_digest(), config.api_version)


@dataclass(frozen=True, slots=True)
class ListenerInputs:
    """What an outbound listener build reads that is known before it starts (see the module)."""

    services: tuple[Service, ...]
    loopback: Mapping[str, str]
    sidecar: tuple[ConfigKey, str, str] | None
    mesh: MeshSettings
    #: (key, content digest, API version, resolved hosts) of each VirtualService with `tcp` or
    #: `tls` routes the scope sees, in the scope's order
    l4_virtual_services: tuple[tuple[ConfigKey, str, str, tuple[str, ...]], ...]

    @staticmethod
    def of(scope: ProxyScope) -> ListenerInputs:
        l4 = tuple(
            (vs.key, vs.content_digest(), vs.api_version, tuple(scope.resolved_hosts(vs)))
            for vs in scope.virtual_services()
            if len(spec(vs).tcp) or len(spec(vs).tls)
        )
        snapshot = scope.snapshot
        return ListenerInputs(scope.services, snapshot.index.loopback, _config_id(scope.sidecar), snapshot.mesh, l4)

    def same_but_services(self, other: ListenerInputs) -> bool:
        """The same inputs, but for the services and their loopback addresses."""
        return (
            self.sidecar == other.sidecar
            and self.mesh == other.mesh
            and self.l4_virtual_services == other.l4_virtual_services
        )

    def same_services(self, other: ListenerInputs) -> bool:
        if self.services != other.services:
            return False
        if self.loopback is other.loopback:
            return True
        now, before = self.loopback, other.loopback
        return all(now.get(s.hostname) == before.get(s.hostname) for s in self.services)


@dataclass(frozen=True, slots=True)
class _Entry:
    inputs: ListenerInputs
    #: host -> `rule_digest` of its DestinationRule, for every rule asked for
    rules: Mapping[str, object]
    #: (short name, namespace) -> what it named, for every short name resolved
    names: Mapping[tuple[str, str], tuple[str, ...]]
    #: host -> its endpoints, where the build read them
    endpoints: Mapping[str, tuple[Endpoint, ...]]
    #: kept unchanged: callers get copies (access logs and tracing are added in place)
    listeners: tuple[listener_pb2.Listener, ...]
    answers: Mapping[str, tuple[str, ...]]
    walk: Walk
    #: the registry's model it was made (or last patched) at: what `changed_hosts` starts from
    model: ServiceModel

    def holds(self, scope: ProxyScope) -> bool:
        """Whether `scope` answers every question of the trace as it was answered (asked with
        the scope's own traces off: a build that does not hold is made again, and records its
        own)."""
        snapshot = scope.snapshot
        if any(snapshot.services.endpoints_of(h) != e for h, e in self.endpoints.items()):
            return False
        if any(tuple(snapshot.index.resolve(h, ns)) != named for (h, ns), named in self.names.items()):
            return False
        saved, scope.rule_trace = scope.rule_trace, None
        try:
            return all(rule_digest(snapshot, scope.destination_rule(h)) == d for h, d in self.rules.items())
        finally:
            scope.rule_trace = saved

    def replay(self, scope: ProxyScope) -> None:
        """Ask again what the build asked, into the scope's traces."""
        for host in self.rules:
            scope.destination_rule(host)
        for host, namespace in self.names:
            scope.resolve(host, namespace)


def _copies(listeners: tuple[listener_pb2.Listener, ...] | list[listener_pb2.Listener]) -> list[listener_pb2.Listener]:
    out = []
    for listener in listeners:
        copy = listener_pb2.Listener()
        copy.CopyFrom(listener)
        out.append(copy)
    return out


class ListenerMemo:
    """The last outbound listener build of each `OutboundProxy`, with its inputs and trace;
    thread-safe (two threads building one key may both build; either result is the same)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[OutboundProxy, _Entry] = {}
        self._previous: dict[OutboundProxy, _Entry] = {}
        #: builds run / reused / patched for services that changed (for the benchmarks and tests)
        self.made = 0
        self.reused = 0
        self.patched = 0

    def outbound(
        self, scope: ProxyScope, make: Callable[[ProxyScope], Built], patch: Patch
    ) -> tuple[list[listener_pb2.Listener], Answers]:
        """`make(scope)`'s listeners and answers, reused from the key's last build where that
        read the same, or that build patched (`patch`) where only services changed and the
        listeners stay as they were (see the module)."""
        key = scope.proxy
        inputs = ListenerInputs.of(scope)
        with self._lock:
            entry = self._current.get(key) or self._previous.get(key)
        if entry is not None and inputs.same_but_services(entry.inputs) and entry.holds(scope):
            if inputs.same_services(entry.inputs):
                kept: _Entry | None = entry
            else:
                kept = self._patched(scope, inputs, entry, patch)
            if kept is not None:
                kept.replay(scope)
                with self._lock:
                    self._current[key] = kept
                    self.reused += kept is entry
                    self.patched += kept is not entry
                return _copies(kept.listeners), kept.answers
        saved_rules, saved_names = scope.rule_trace, scope.name_trace
        rules: dict[str, object] = {}
        names: set[tuple[str, str]] = set()
        scope.rule_trace, scope.name_trace = rules, names
        try:
            listeners, answers, endpoints, walk = make(scope)
        finally:
            scope.rule_trace, scope.name_trace = saved_rules, saved_names
        if saved_rules is not None:
            for host, digest in rules.items():
                saved_rules.setdefault(host, digest)
        if saved_names is not None:
            saved_names.update(names)
        index = scope.snapshot.index
        made = _Entry(
            inputs,
            rules,
            {n: tuple(index.resolve(*n)) for n in names},
            endpoints,
            tuple(_copies(listeners)),
            {h: tuple(found) for h, found in answers.items()},
            walk,
            scope.snapshot.services,
        )
        with self._lock:
            self._current[key] = made
            self.made += 1
        return listeners, answers

    @staticmethod
    def _patched(scope: ProxyScope, inputs: ListenerInputs, entry: _Entry, patch: Patch) -> _Entry | None:
        """`entry` brought up to date where only services of the scope changed: the hosts that
        changed (`SnapshotIndex.changed_hosts`, which covers loopback addresses and endpoints)
        walked again as they were and as they are, every other service the same and in the
        same order. None where `patch` finds the listeners may change."""
        snapshot = scope.snapshot
        changed = snapshot.index.changed_hosts(entry.model, entry.inputs.loopback)
        was = [s for s in entry.inputs.services if s.hostname not in changed]
        now = [s for s in inputs.services if s.hostname not in changed]
        if was != now:
            return None
        before = [s for s in entry.inputs.services if s.hostname in changed]
        after = [s for s in inputs.services if s.hostname in changed]
        loopbacks = (entry.inputs.loopback, inputs.loopback)
        if any(lb.get(s.hostname) is not None for lb in loopbacks for s in (*before, *after)):
            return None
        patched = patch(scope, entry.walk, before, after)
        if patched is None:
            return None
        came, walk = patched
        answers = {h: a for h, a in entry.answers.items() if h not in changed}
        answers.update((h, tuple(a)) for h, a in came.items())
        ordered = {s.hostname: answers[s.hostname] for s in inputs.services if s.hostname in answers}
        return replace(entry, inputs=inputs, answers=ordered, walk=walk, model=snapshot.services)

    def advance(self) -> None:
        """A new config version: what the one before last used and this one has not yet is dropped."""
        with self._lock:
            self._previous, self._current = self._current, {}

    def __len__(self) -> int:
        return len(self._current.keys() | self._previous.keys())
