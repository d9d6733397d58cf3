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

Kept like `GenerationMemo`: what was not asked for during the last two config versions goes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from envoy.config.listener.v3 import listener_pb2

from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Endpoint, Service
from meshctl.snapshot.model import spec
from meshctl.snapshot.proxy import OutboundProxy
from meshctl.snapshot.scope import ProxyScope, rule_digest

#: host -> where the app reaches it (`listeners_outbound.build_outbound_with_answers`)
Answers = dict[str, list[str]]
#: What a build hands back: its listeners, its answers, and the endpoints it read by host.
Built = tuple[list[listener_pb2.Listener], Answers, dict[str, tuple[Endpoint, ...]]]


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

    def same_as(self, other: ListenerInputs) -> bool:
        if self.services != other.services or self.sidecar != other.sidecar:
            return False
        if self.mesh != other.mesh or self.l4_virtual_services != other.l4_virtual_services:
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
        #: builds run / reused (for the benchmarks and tests)
        self.made = 0
        self.reused = 0

    def outbound(
        self, scope: ProxyScope, make: Callable[[ProxyScope], Built]
    ) -> tuple[list[listener_pb2.Listener], Answers]:
        """`make(scope)`'s listeners and answers, reused from the key's last build where that
        read the same (see the module)."""
        key = scope.proxy
        inputs = ListenerInputs.of(scope)
        with self._lock:
            entry = self._current.get(key) or self._previous.get(key)
        if entry is not None and inputs.same_as(entry.inputs) and entry.holds(scope):
            entry.replay(scope)
            with self._lock:
                self._current[key] = entry
                self.reused += 1
            return _copies(entry.listeners), {h: list(found) for h, found in entry.answers.items()}
        saved_rules, saved_names = scope.rule_trace, scope.name_trace
        rules: dict[str, object] = {}
        names: set[tuple[str, str]] = set()
        scope.rule_trace, scope.name_trace = rules, names
        try:
            listeners, answers, endpoints = make(scope)
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
        )
        with self._lock:
            self._current[key] = made
            self.made += 1
        return listeners, answers

    def advance(self) -> None:
        """A new config version: what the one before last used and this one has not yet is dropped."""
        with self._lock:
            self._previous, self._current = self._current, {}

    def __len__(self) -> int:
        return len(self._current.keys() | self._previous.keys())
